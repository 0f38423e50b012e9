package usage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// stateVersion is the format of the state file; a file of another version
// is refused rather than misread.
const stateVersion = 1

// maxStateBytes bounds the state file read at start (about 250 bytes an
// identity: DefaultMaxIdentities fit).
const maxStateBytes = 64 << 20

// state is the state file: the totals of every identity when it was saved.
type state struct {
	Version    int       `json:"version"`
	SavedAt    time.Time `json:"savedAt"`
	Identities []Usage   `json:"identities"`
}

// writeState writes the totals to path atomically, with mode 0600 (the
// identities are key names and certificate subjects).
func writeState(path string, now time.Time, us []Usage) error {
	for i := range us { // rates are not totals: not kept
		us[i].UpstreamBytesPerSec, us[i].DownBytesPerSec = 0, 0
		us[i].ActiveTunnels, us[i].ActiveConnections = 0, 0
	}
	b, err := json.Marshal(state{Version: stateVersion, SavedAt: now.UTC(), Identities: us})
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".usage-*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() { _ = os.Remove(tmp) }() // after a successful rename: nothing to remove
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	return d.Sync()
}

// load reads the totals of path into l's accounts (a missing file: none
// yet).
func (l *Ledger) load(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	defer func() { _ = f.Close() }()
	var st state
	dec := json.NewDecoder(&limitedReader{r: f, n: maxStateBytes})
	if err := dec.Decode(&st); err != nil {
		return fmt.Errorf("usage: %s: %w (move it away to start the accounting afresh)", path, err)
	}
	if st.Version != stateVersion {
		return fmt.Errorf("usage: %s: format version %d, this server reads %d", path, st.Version, stateVersion)
	}
	now := l.cfg.Now()
	for _, u := range st.Identities {
		a := l.other
		if u.Identity != Other {
			a = l.Get(u.Identity)
		}
		a.up += u.BytesUpstream
		a.down += u.BytesDownstream
		a.tunnels.Add(u.Tunnels)
		a.conns.Add(u.Connections)
		a.refused.Add(u.RefusedDestinations)
		if u.SuspendedUntil.After(now) {
			a.suspendedUntil.Store(u.SuspendedUntil.UnixNano())
		}
	}
	return nil
}

// limitedReader fails a read past n bytes (io.LimitReader would end the
// JSON early and hide the cause).
type limitedReader struct {
	r interface{ Read([]byte) (int, error) }
	n int64
}

func (lr *limitedReader) Read(p []byte) (int, error) {
	if lr.n <= 0 {
		return 0, fmt.Errorf("state file larger than %d bytes", maxStateBytes)
	}
	if int64(len(p)) > lr.n {
		p = p[:lr.n]
	}
	n, err := lr.r.Read(p)
	lr.n -= int64(n)
	return n, err
}
