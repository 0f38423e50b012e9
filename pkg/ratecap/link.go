package ratecap

import (
	"math"
	"sync/atomic"
	"time"
)

// The link's rest: with the server's link rate set (Table.SetLink), the
// identities without a cap of their own share one budget, the rest of the
// link, whose rate is the link's less what the capped identities use.
// Without it, a capped identity's connections compete with the uncapped
// ones at the link's bottleneck like any flow: they back off from the
// queue the uncapped ones build and cannot probe above their cap to win
// their share back (on the bench's 100 Mbit/s link, caps of 20 and 40
// beside an uncapped identity held 87-92 % of themselves). Kept below the
// link, the server's own sending never builds that queue.
const (
	// refreshEvery is how often the rest's rate is set again from what
	// the capped identities booked since.
	refreshEvery = 100 * time.Millisecond
	// restFloor is the least share of the link the rest keeps, however
	// much the capped identities use (caps that add up past the link).
	restFloor = 0.05
)

// linkShare is one direction's rest of the link. Safe for concurrent use.
type linkShare struct {
	rest Bucket
	// link is the link's rate in bytes per second (float64 bits; 0: no
	// link rate, the rest does not pace).
	link atomic.Uint64
	// last is when the rate was set last (monoNow); 0: not since SetLink.
	last atomic.Int64
	// capped are the budgets of the capped identities (Table.publish).
	capped atomic.Pointer[[]*Bucket]
}

// setLink sets the link's rate in bytes per second (<= 0: none); the rest
// starts with all of it.
func (s *linkShare) setLink(bytesPerSec float64) {
	s.link.Store(math.Float64bits(max(bytesPerSec, 0)))
	s.rest.SetRate(bytesPerSec)
	s.last.Store(0)
}

// linked reports whether the link's rate is set: the capped budgets then
// count what they book for the rest's refresh. s may be nil.
func (s *linkShare) linked() bool { return s != nil && s.link.Load() != 0 }

// rate returns the link's rate in bytes per second (0: none).
func (s *linkShare) rate() float64 { return math.Float64frombits(s.link.Load()) }

// restRate is the rest's rate in bytes per second (0: it does not pace).
func (s *linkShare) restRate() float64 {
	if r := s.rest.rate.Load(); r != nil {
		return 1e9 / r.nsPerByte
	}
	return 0
}

// budget returns the rest's budget, or nil without a link rate.
func (s *linkShare) budget() *Bucket {
	if s == nil || !s.rest.Capped() {
		return nil
	}
	return &s.rest
}

// refresh sets the rest's rate again if refreshEvery has passed since it
// was set: the link's rate less each capped identity's share of it, which
// is what it booked since, doubled (room to grow before the next refresh),
// up to its cap; at least restFloor of the link. One caller refreshes, the
// others go on with the rate in place.
func (s *linkShare) refresh(now int64) {
	last := s.last.Load()
	if last != 0 && now-last < int64(refreshEvery) || !s.last.CompareAndSwap(last, now) {
		return
	}
	link := s.rate()
	capped := s.capped.Load()
	if link <= 0 || capped == nil {
		if link <= 0 {
			s.rest.SetRate(0) // a reload took the link rate away meanwhile
		}
		return
	}
	if last == 0 {
		for _, b := range *capped {
			b.booked.Store(0)
		}
		return
	}
	secs := float64(now-last) / 1e9
	used := 0.0
	for _, b := range *capped {
		booked := float64(b.booked.Swap(0))
		if r := b.rate.Load(); r != nil {
			used += min(1e9/r.nsPerByte, 2*booked/secs)
		}
	}
	s.rest.SetRate(max(link-used, restFloor*link))
}
