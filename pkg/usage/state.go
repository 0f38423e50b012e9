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
	// Quotas are the quota windows' buckets by identity.
	Quotas map[string]savedQuota `json:"quotas,omitempty"`
}

// savedQuota is an account's quotaUse in the state file.
type savedQuota struct {
	GranularitySeconds int64   `json:"granularitySeconds"`
	First              int64   `json:"first"`
	Buckets            []int64 `json:"buckets"`
}

// writeState writes the totals to path atomically, with mode 0600 (the
// identities are key names and certificate subjects).
func writeState(path string, now time.Time, us []Usage, qs map[string]savedQuota) error {
	for i := range us { // rates are not totals: not kept
		us[i].UpstreamBytesPerSec, us[i].DownBytesPerSec = 0, 0
		us[i].ActiveTunnels, us[i].ActiveConnections = 0, 0
	}
	b, err := json.Marshal(state{Version: stateVersion, SavedAt: now.UTC(), Identities: us, Quotas: qs})
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
		a.merge(u, st.Quotas, now)
	}
	return nil
}

// merge adds the totals u (and its quota window, of qs) loaded from the
// state file to what a counted so far (nothing at start; a new process in
// an upgrade counts before its predecessor's last totals are read). They
// are no new traffic: not in the rates, and in the quota window only as
// the file's window has them.
func (a *Account) merge(u Usage, qs map[string]savedQuota, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.up += u.BytesUpstream
	a.down += u.BytesDownstream
	loaded := u.BytesUpstream + u.BytesDownstream
	a.ticked += loaded
	a.upLive += u.BytesUpstream
	a.downLive += u.BytesDownstream
	a.tunnels.Add(u.Tunnels)
	a.conns.Add(u.Connections)
	a.refused.Add(u.RefusedDestinations)
	if u.SuspendedUntil.After(now) && u.SuspendedUntil.UnixNano() > a.suspendedUntil.Load() {
		a.suspendedUntil.Store(u.SuspendedUntil.UnixNano())
	}
	sq, ok := qs[u.Identity]
	if !ok || sq.GranularitySeconds <= 0 || len(sq.Buckets) != quotaBuckets {
		return
	}
	gran := time.Duration(sq.GranularitySeconds) * time.Second
	if a.quota.gran == gran && a.quota.first == sq.First {
		for i, b := range sq.Buckets {
			a.quota.buckets[i] += b
		}
		return
	}
	a.quota.gran, a.quota.first = gran, sq.First
	copy(a.quota.buckets[:], sq.Buckets)
}

// quotaState returns the quota windows of accts for the state file.
func quotaState(accts []*Account) map[string]savedQuota {
	out := map[string]savedQuota{}
	for _, a := range accts {
		a.mu.Lock()
		if a.quota.gran > 0 && a.quota.gran%time.Second == 0 {
			out[a.name] = savedQuota{GranularitySeconds: int64(a.quota.gran / time.Second), First: a.quota.first,
				Buckets: append([]int64(nil), a.quota.buckets[:]...)}
		}
		a.mu.Unlock()
	}
	return out
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
