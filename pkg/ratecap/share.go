package ratecap

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// burst is how far ahead of its rate a budget lets traffic run: packets
// leave in bursts of about this much time's worth (as quic-go's own pacer
// lets 2 ms go), and a short pause is not saved up beyond it.
const burst = 5 * time.Millisecond

// minBurstBytes keeps a burst at least a few full packets at low rates.
const minBurstBytes = 8 * 1500

// gcra is a rate budget as a theoretical arrival time (GCRA): each n bytes
// move it n/rate later; traffic may go while it is at most tau ahead of
// now. Times are nanoseconds on one monotonic clock. Not safe for
// concurrent use (Share and Bucket lock around it).
type gcra struct {
	nsPerByte float64 // 0: no cap
	tau       int64
	tat       int64
}

// setRate sets the budget to bytesPerSec (<= 0: no cap).
func (g *gcra) setRate(bytesPerSec float64) {
	if bytesPerSec <= 0 || math.IsInf(bytesPerSec, 1) {
		g.nsPerByte, g.tau = 0, 0
		return
	}
	g.nsPerByte = 1e9 / bytesPerSec
	g.tau = max(int64(burst), int64(minBurstBytes*g.nsPerByte))
}

// take books n bytes sent at now.
func (g *gcra) take(now int64, n int) {
	if g.nsPerByte == 0 {
		return
	}
	g.tat = max(g.tat, now) + int64(float64(n)*g.nsPerByte)
}

// ready reports whether traffic may go at now.
func (g *gcra) ready(now int64) bool { return g.nsPerByte == 0 || g.tat-now <= g.tau }

// next is the earliest time traffic may go (0: any time).
func (g *gcra) next() int64 {
	if g.nsPerByte == 0 {
		return 0
	}
	return max(g.tat-g.tau, 0)
}

// Bucket is one identity's budget in one direction, shared by all its
// connections and streams: the rate they may use together. Safe for
// concurrent use.
type Bucket struct {
	mu sync.Mutex
	g  gcra
	// capped mirrors g.nsPerByte > 0 without the lock: an uncapped
	// identity's packets and reads skip the budget (a server with caps,
	// or an auth hook, has a budget for every identity).
	capped atomic.Bool
}

// SetRate sets the cap in bytes per second (<= 0: none).
func (b *Bucket) SetRate(bytesPerSec float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.g.setRate(bytesPerSec)
	b.capped.Store(b.g.nsPerByte > 0)
}

// Capped reports whether the bucket has a cap.
func (b *Bucket) Capped() bool { return b.capped.Load() }

// sent books n bytes at now (monotonic nanoseconds).
func (b *Bucket) sent(now int64, n int) {
	b.mu.Lock()
	b.g.take(now, n)
	b.mu.Unlock()
}

// ready reports whether traffic may go at now.
func (b *Bucket) ready(now int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.g.ready(now)
}

// next is the earliest time traffic may go (0: any time).
func (b *Bucket) next() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.g.next()
}

// delay books n bytes moved at now and returns how long the mover must
// wait before moving more (the upload side: read, then wait).
func (b *Bucket) delay(now int64, n int) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.g.nsPerByte == 0 {
		return 0
	}
	b.g.take(now, n)
	return time.Duration(max(b.g.tat-b.g.tau-now, 0))
}
