package egress

import (
	"sync"
	"time"

	"github.com/quictun/quictun/pkg/proto"
)

// replayCache remembers the nonces of stream headers for a time window, so a
// header used a second time inside the window is refused, and one outside the
// window is too old. Only headers that passed the MAC and allow-list checks are
// recorded (admit), each connection within a quota, and 1-RTT streams only up to
// three quarters of the capacity: the last quarter is kept for 0-RTT streams,
// which are refused when they cannot be recorded. Safe for concurrent use.
type replayCache struct {
	window time.Duration
	max    int
	// oneRTTMax is the fill level up to which 1-RTT nonces are recorded.
	oneRTTMax int
	// onSize, if set, is told the number of entries after each change (for a gauge).
	onSize func(int)

	mu     sync.Mutex
	seen   map[[proto.NonceLen]byte]time.Time // nonce -> expiry
	lastGC time.Time
	// peak is the most entries since seen was last made: Go maps keep
	// their size, so a map that emptied after a crowd left is made anew.
	peak int
	// sweeper sweeps a quarter window at a time while the cache holds
	// entries, so they go when their window ends even if no header comes
	// (after every client left); nil while it is empty, and after stop.
	sweeper *time.Timer
	stopped bool
}

func newReplayCache(window time.Duration, max int) *replayCache {
	return &replayCache{window: window, max: max, oneRTTMax: max - max/4, seen: make(map[[proto.NonceLen]byte]time.Time)}
}

// fresh reports whether a header made at t is inside the window around now.
func (c *replayCache) fresh(t, now time.Time) bool {
	d := now.Sub(t)
	return d <= c.window && d >= -c.window
}

// replayQuota bounds the nonces one connection records: a token bucket of
// size n refilled over one window, about the number of its entries alive in
// the cache at once. Not safe for concurrent use; the cache's lock guards it.
type replayQuota struct {
	n      float64
	tokens float64
	last   time.Time
}

func newReplayQuota(n int, now time.Time) *replayQuota {
	return &replayQuota{n: float64(n), tokens: float64(n), last: now}
}

func (q *replayQuota) take(now time.Time, window time.Duration) bool {
	if q == nil {
		return true
	}
	q.tokens = min(q.n, q.tokens+now.Sub(q.last).Seconds()*q.n/window.Seconds())
	q.last = now
	if q.tokens < 1 {
		return false
	}
	q.tokens--
	return true
}

// admit checks and records the nonce of a header that passed the MAC and
// allow-list checks. It returns CodeReplay when the header is outside the
// window or its nonce was seen. Otherwise it records the nonce when it can;
// when it cannot (cache full for this kind of stream, or q's quota spent) it
// returns CodeOverloaded for an early (0-RTT) stream, which must not go on
// unrecorded, and CodeOK for a 1-RTT stream, which is not replayable data; why
// it was not recorded is in unrecorded.
func (c *replayCache) admit(h *proto.Header, now time.Time, early bool, q *replayQuota) (code proto.Code, unrecorded string) {
	if !c.fresh(h.Time, now) {
		return proto.CodeReplay, ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Sweep a quarter window at a time, or when full at most once a second,
	// so a full cache of live entries does not cost a scan per check.
	if now.Sub(c.lastGC) > c.window/4 || (len(c.seen) >= c.oneRTTMax && now.Sub(c.lastGC) > time.Second) {
		c.sweepLocked(now)
	}
	if exp, ok := c.seen[h.Nonce]; ok && !now.After(exp) {
		return proto.CodeReplay, ""
	}
	refuse := proto.CodeOK
	if early {
		refuse = proto.CodeOverloaded
	}
	limit := c.oneRTTMax
	if early {
		limit = c.max
	}
	if len(c.seen) >= limit {
		return refuse, ReplayUnrecordedCacheFull
	}
	if !q.take(now, c.window) {
		return refuse, ReplayUnrecordedConnQuota
	}
	// Keep the nonce until the header's timestamp leaves the window.
	c.seen[h.Nonce] = h.Time.Add(c.window + time.Second)
	c.peak = max(c.peak, len(c.seen))
	if c.sweeper == nil && !c.stopped {
		c.sweeper = time.AfterFunc(c.sweepEvery(), c.sweepTimer)
	}
	if c.onSize != nil {
		c.onSize(len(c.seen))
	}
	return proto.CodeOK, ""
}

// sweepEvery is the sweeper's period: a quarter window.
func (c *replayCache) sweepEvery() time.Duration { return max(c.window/4, time.Second) }

// sweepLocked deletes the expired entries, and makes the map anew when it
// holds a quarter of its peak or less. c.mu must be held.
func (c *replayCache) sweepLocked(now time.Time) {
	before := len(c.seen)
	for n, exp := range c.seen {
		if now.After(exp) {
			delete(c.seen, n)
		}
	}
	c.lastGC = now
	if c.peak >= shrinkMin && len(c.seen) <= c.peak/4 {
		seen := make(map[[proto.NonceLen]byte]time.Time, len(c.seen))
		for n, exp := range c.seen {
			seen[n] = exp
		}
		c.seen, c.peak = seen, len(seen)
	}
	if len(c.seen) != before && c.onSize != nil {
		c.onSize(len(c.seen))
	}
}

// shrinkMin is the peak from which a map that emptied is made anew (a
// small one is not worth the copy).
const shrinkMin = 1024

// sweepTimer is the sweeper's turn: it sweeps, and comes back while
// entries are left.
func (c *replayCache) sweepTimer() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	c.sweepLocked(time.Now())
	if len(c.seen) == 0 {
		c.sweeper = nil
		return
	}
	c.sweeper.Reset(c.sweepEvery())
}

// stop ends the sweeper (the cache still works, swept as headers come).
func (c *replayCache) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	if c.sweeper != nil {
		c.sweeper.Stop()
		c.sweeper = nil
	}
}

// seenNonce reports whether nonce is held (and not expired).
func (c *replayCache) seenNonce(nonce [proto.NonceLen]byte, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	exp, ok := c.seen[nonce]
	return ok && !now.After(exp)
}

// check admits an early header without a per-connection quota.
func (c *replayCache) check(h *proto.Header, now time.Time) proto.Code {
	code, _ := c.admit(h, now, true, nil)
	return code
}

// len returns the number of entries.
func (c *replayCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}
