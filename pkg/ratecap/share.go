package ratecap

import (
	"math"
	"sync/atomic"
	"time"
)

// burst is how far ahead of its rate a budget lets traffic run: packets
// leave in bursts of about this much time's worth (as quic-go's own pacer
// lets 2 ms go), and a short pause is not saved up beyond it.
const burst = 5 * time.Millisecond

// minBurstBytes keeps a burst at least a few full packets at low rates.
const minBurstBytes = 8 * 1500

// Bucket is one identity's budget in one direction, shared by all its
// connections and streams: the rate they may use together, as a
// theoretical arrival time (GCRA): each n bytes move it n/rate later, and
// traffic may go while it is at most tau ahead of now. Times are
// nanoseconds on one monotonic clock (monoNow). Safe for concurrent use,
// without a lock: every packet a capped identity sends checks and books
// it, from each of its connections' send loops.
type Bucket struct {
	// rate is nil without a cap: an uncapped identity's packets and reads
	// skip the budget (a server with caps, or an auth hook, has a budget
	// for every identity).
	rate atomic.Pointer[gcraRate]
	tat  atomic.Int64
	// booked counts the bytes booked since the link's rest last read it
	// (linkShare.refresh).
	booked atomic.Int64
	// rest is the link's rest in this direction, which paces the bucket's
	// traffic while it has no cap of its own (nil: none; Table.For).
	rest *linkShare
}

// pacer returns the budget that paces b's traffic at now: b itself when
// capped, else the link's rest when the server's link rate is set
// (refreshed first), else nil: nothing paces it. b may be nil.
func (b *Bucket) pacer(now int64) *Bucket {
	p := b.paced()
	if p != nil && p != b {
		b.rest.refresh(now)
	}
	return p
}

// paced is pacer without the refresh (a reading of the next send time, or
// a caller that reads the clock only when something paces).
func (b *Bucket) paced() *Bucket {
	if b == nil || b.Capped() {
		return b
	}
	return b.rest.budget()
}

// gcraRate is a cap: nanoseconds a byte, and how far ahead of the rate
// traffic may run.
type gcraRate struct {
	nsPerByte float64
	tau       int64
	// prepay is how many bytes a connection's sender books at once
	// (Controller.book): prepayTime at the rate, at most maxPrepay; at low
	// rates less than a packet, so that each packet is booked as it goes.
	prepay int
	// chunk is Bucket.chunk's answer, worked out once.
	chunk int
}

// A connection's sender books its identity's budget ahead, so that not
// every packet writes the shared budget: at most prepayTime's worth at the
// cap (well within the burst; booked before it is sent, so never more than
// the cap) and at most maxPrepay bytes. At 100 Gbit/s that is one booking
// per 13 full packets; at 20 Mbit/s (1,250 B) one per packet, as before.
const (
	prepayTime = 500 * time.Microsecond
	maxPrepay  = 16 << 10
)

// SetRate sets the cap in bytes per second (<= 0: none).
func (b *Bucket) SetRate(bytesPerSec float64) {
	if bytesPerSec <= 0 || math.IsInf(bytesPerSec, 1) {
		b.rate.Store(nil)
		return
	}
	ns := 1e9 / bytesPerSec
	tau := max(int64(burst), int64(minBurstBytes*ns))
	b.rate.Store(&gcraRate{nsPerByte: ns, tau: tau, prepay: int(min(float64(prepayTime)/ns, maxPrepay)),
		chunk: max(maxRead, int(min(float64(tau)/ns, math.MaxInt32)))})
}

// Capped reports whether the bucket has a cap.
func (b *Bucket) Capped() bool { return b.rate.Load() != nil }

// chunk is the most one read or write of a capped stream moves at once: a
// burst's worth (tau at the rate), at least maxRead. A high cap thus does
// not cut reads below the copy's buffer (at 100 Gbit/s a 32 KiB buffer
// cut to 16 KiB doubled the reads, and the writes onward).
func (b *Bucket) chunk() int {
	r := b.rate.Load()
	if r == nil {
		return math.MaxInt
	}
	return r.chunk
}

// take books n bytes moved at now and returns the new arrival time.
func (b *Bucket) take(r *gcraRate, now int64, n int) int64 {
	add := int64(float64(n) * r.nsPerByte)
	if b.rest.linked() {
		b.booked.Add(int64(n))
	}
	for {
		old := b.tat.Load()
		tat := max(old, now) + add
		if b.tat.CompareAndSwap(old, tat) {
			return tat
		}
	}
}

// sent books n bytes at now (monotonic nanoseconds).
func (b *Bucket) sent(now int64, n int) {
	if r := b.rate.Load(); r != nil {
		b.take(r, now, n)
	}
}

// idle reports whether the budget is full at now: nothing booked beyond
// now (under any cap it had).
func (b *Bucket) idle(now int64) bool { return b.tat.Load() <= now }

// ready reports whether traffic may go at now.
func (b *Bucket) ready(now int64) bool {
	r := b.rate.Load()
	return r == nil || b.tat.Load()-now <= r.tau
}

// next is the earliest time traffic may go (0: any time).
func (b *Bucket) next() int64 {
	r := b.rate.Load()
	if r == nil {
		return 0
	}
	return max(b.tat.Load()-r.tau, 0)
}

// delay books n bytes moved at now and returns how long the mover must
// wait before moving more (the upload side: read, then wait).
func (b *Bucket) delay(now int64, n int) time.Duration {
	r := b.rate.Load()
	if r == nil {
		return 0
	}
	return time.Duration(max(b.take(r, now, n)-r.tau-now, 0))
}
