package transport

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
)

// sessionFileVersion is the format of the session file; another version is
// ignored (the client then does one full handshake and rewrites it).
const sessionFileVersion = 1

// maxSessionFileBytes bounds what LoadSessionFile reads.
const maxSessionFileBytes = 1 << 20

type sessionFile struct {
	Version  int                    `json:"version"`
	Sessions map[string]sessionBlob `json:"sessions"`
}

type sessionBlob struct {
	Ticket []byte `json:"ticket"`
	State  []byte `json:"state"`
}

// FileSessionCache is a StickySessionCache that also keeps its tickets in a
// file (mode 0600, written atomically on every new ticket), so a restarted
// client resumes with 0-RTT instead of a full handshake. The file holds
// resumption secrets: protect it like the shared secret. A ticket the file
// cannot restore is skipped; the next handshake replaces it.
type FileSessionCache struct {
	*StickySessionCache
	path string

	mu       sync.Mutex
	sessions map[string]sessionBlob
	onError  func(error)
}

// NewFileSessionCache loads path (a missing file is an empty cache) and
// returns the cache. onError, if not nil, hears about unreadable entries and
// failed writes; neither stops the client.
func NewFileSessionCache(path string, capacity int, onError func(error)) *FileSessionCache {
	c := &FileSessionCache{StickySessionCache: NewStickySessionCache(capacity), path: path,
		sessions: map[string]sessionBlob{}, onError: onError}
	if err := c.load(); err != nil {
		c.report(err)
	}
	return c
}

func (c *FileSessionCache) report(err error) {
	if c.onError != nil {
		c.onError(err)
	}
}

func (c *FileSessionCache) load() error {
	f, err := os.Open(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("session file: %w", err)
	}
	defer func() { _ = f.Close() }()
	var sf sessionFile
	// A file cut at the limit is not valid JSON: it is reported and ignored.
	dec := json.NewDecoder(io.LimitReader(f, maxSessionFileBytes))
	if err := dec.Decode(&sf); err != nil {
		return fmt.Errorf("session file %s: %w", c.path, err)
	}
	if sf.Version != sessionFileVersion {
		return fmt.Errorf("session file %s: version %d, want %d; ignored", c.path, sf.Version, sessionFileVersion)
	}
	var bad int
	for key, b := range sf.Sessions {
		state, err := tls.ParseSessionState(b.State)
		if err != nil {
			bad++
			continue
		}
		cs, err := tls.NewResumptionState(b.Ticket, state)
		if err != nil {
			bad++
			continue
		}
		c.sessions[key] = b
		c.StickySessionCache.Put(key, cs)
	}
	if bad > 0 {
		return fmt.Errorf("session file %s: %d unreadable tickets skipped", c.path, bad)
	}
	return nil
}

// Put stores cs in memory and in the file; a nil cs (a deletion) is ignored,
// as in StickySessionCache.
func (c *FileSessionCache) Put(key string, cs *tls.ClientSessionState) {
	if cs == nil {
		return
	}
	c.StickySessionCache.Put(key, cs)
	ticket, state, err := cs.ResumptionState()
	if err != nil || state == nil {
		return
	}
	blob, err := state.Bytes()
	if err != nil {
		c.report(fmt.Errorf("session file: encode ticket: %w", err))
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sessions[key] = sessionBlob{Ticket: ticket, State: blob}
	data, err := json.Marshal(sessionFile{Version: sessionFileVersion, Sessions: c.sessions})
	if err == nil {
		err = writeFileAtomic(c.path, data)
	}
	if err != nil {
		c.report(err)
	}
}
