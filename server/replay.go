package server

import (
	"sync"
	"time"

	"github.com/quictun/quictun/pkg/proto"
)

// replayCache remembers nonces of 0-RTT headers for a time window, so a header
// replayed inside the window is refused and one outside the window is too old.
type replayCache struct {
	window time.Duration
	max    int

	mu      sync.Mutex
	seen    map[[proto.NonceLen]byte]time.Time // nonce -> expiry
	lastGC  time.Time
	evicted int
}

func newReplayCache(window time.Duration, max int) *replayCache {
	return &replayCache{window: window, max: max, seen: make(map[[proto.NonceLen]byte]time.Time)}
}

// check records the header's nonce and returns CodeOK if the header is fresh,
// CodeReplay if it was seen or is outside the window, CodeOverloaded when full.
func (c *replayCache) check(h *proto.Header, now time.Time) proto.Code {
	if d := now.Sub(h.Time); d > c.window || d < -c.window {
		return proto.CodeReplay
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Sweep a quarter window at a time, or when full at most once a second,
	// so a full cache of live entries does not cost a scan per check.
	if now.Sub(c.lastGC) > c.window/4 || (len(c.seen) >= c.max && now.Sub(c.lastGC) > time.Second) {
		for n, exp := range c.seen {
			if now.After(exp) {
				delete(c.seen, n)
			}
		}
		c.lastGC = now
	}
	if exp, ok := c.seen[h.Nonce]; ok && !now.After(exp) {
		return proto.CodeReplay
	}
	if len(c.seen) >= c.max {
		return proto.CodeOverloaded
	}
	// Keep the nonce until the header's timestamp leaves the window.
	c.seen[h.Nonce] = h.Time.Add(c.window + time.Second)
	return proto.CodeOK
}

// record remembers the nonce of a header that arrived after the handshake, so
// that a later early (0-RTT) copy of it is refused. Full caches skip it.
func (c *replayCache) record(h *proto.Header, now time.Time) {
	if d := now.Sub(h.Time); d > c.window || d < -c.window {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.seen) < c.max {
		c.seen[h.Nonce] = h.Time.Add(c.window + time.Second)
	}
}
