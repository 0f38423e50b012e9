package emu

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Cause is why a packet was dropped.
type Cause int

// Drop causes. CauseNone means the packet was accepted.
const (
	CauseNone Cause = iota
	CauseBlackout
	CauseLoss
	CauseGE
	CauseQueue
	CauseOverflow
	causeCount
)

// String returns the name used in statistics.
func (c Cause) String() string {
	switch c {
	case CauseNone:
		return "none"
	case CauseBlackout:
		return "blackout"
	case CauseLoss:
		return "loss"
	case CauseGE:
		return "ge"
	case CauseQueue:
		return "queue"
	case CauseOverflow:
		return "overflow"
	default:
		return "unknown"
	}
}

// Verdict is the fate of one offered packet.
type Verdict struct {
	// Drop is CauseNone if the packet is delivered.
	Drop Cause
	// Deliver is when the packet leaves the link.
	Deliver time.Time
	// Copies is 1, or 2 when the packet is duplicated.
	Copies int
	// Reordered tells that the packet was held back so later ones overtake it.
	Reordered bool
}

// Link is one direction of the emulated link. It is safe for concurrent use.
type Link struct {
	mu            sync.Mutex
	p             Params
	rng           *rand.Rand
	geBad         bool
	busyUntil     time.Time // the rate limiter has sent everything admitted by then
	lastDeliver   time.Time // latest in-order delivery time, to keep order under jitter
	blackoutUntil time.Time

	stats linkCounters
}

type linkCounters struct {
	rxPackets, rxBytes    atomic.Uint64
	txPackets, txBytes    atomic.Uint64
	dropped               [causeCount]atomic.Uint64
	duplicated, reordered atomic.Uint64
	writeErrors           atomic.Uint64
	latePackets           atomic.Uint64
	latenessNS            atomic.Uint64
	queuePackets          atomic.Int64
	queueBytes            atomic.Int64
	maxQueuePackets       atomic.Int64
}

// NewLink returns a link with parameters p and a random generator seeded by seed.
func NewLink(p Params, seed uint64) *Link {
	return &Link{p: p, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Params returns the current parameters.
func (l *Link) Params() Params {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.p
}

// SetParams changes the parameters; packets already admitted keep their
// delivery time.
func (l *Link) SetParams(p Params) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.GEP == 0 {
		l.geBad = false
	}
	l.p = p
}

// Blackout drops every packet, offered or in flight, until now+d. A
// shorter blackout does not cut a running one short.
func (l *Link) Blackout(now time.Time, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if until := now.Add(d); until.After(l.blackoutUntil) {
		l.blackoutUntil = until
	}
}

// BlackoutRemaining returns how long the current blackout still lasts.
func (l *Link) BlackoutRemaining(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(l.blackoutUntil.Sub(now), 0)
}

// InBlackout tells whether packets leaving the link at now are lost.
func (l *Link) InBlackout(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return now.Before(l.blackoutUntil)
}

// Offer decides the fate of a packet of size bytes offered at now, and counts it.
func (l *Link) Offer(now time.Time, size int) Verdict {
	l.stats.rxPackets.Add(1)
	l.stats.rxBytes.Add(uint64(size))
	v := l.offer(now, size)
	switch {
	case v.Drop != CauseNone:
		l.stats.dropped[v.Drop].Add(1)
	default:
		if v.Copies > 1 {
			l.stats.duplicated.Add(1)
		}
		if v.Reordered {
			l.stats.reordered.Add(1)
		}
	}
	return v
}

func (l *Link) offer(now time.Time, size int) Verdict {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := &l.p
	if now.Before(l.blackoutUntil) {
		return Verdict{Drop: CauseBlackout}
	}
	if p.Loss > 0 && l.rng.Float64() < p.Loss {
		return Verdict{Drop: CauseLoss}
	}
	if p.GEP > 0 {
		// State transition first, then loss in the new state (the usual
		// per-packet Gilbert-Elliott formulation, as in netem's "gemodel").
		if l.geBad {
			if l.rng.Float64() < p.GER {
				l.geBad = false
			}
		} else if l.rng.Float64() < p.GEP {
			l.geBad = true
		}
		lossP := p.GELossGood
		if l.geBad {
			lossP = p.GELossBad
		}
		if lossP > 0 && l.rng.Float64() < lossP {
			return Verdict{Drop: CauseGE}
		}
	}
	base := now
	if p.RateBits > 0 {
		start := now
		if l.busyUntil.After(now) {
			start = l.busyUntil
		}
		backlog := int(float64(start.Sub(now)) * float64(p.RateBits) / 8 / float64(time.Second))
		if backlog > 0 && backlog+size > p.EffectiveQueueBytes() {
			return Verdict{Drop: CauseQueue}
		}
		tx := time.Duration(float64(size*8) * float64(time.Second) / float64(p.RateBits))
		l.busyUntil = start.Add(tx)
		base = l.busyUntil
	}
	d := p.Delay
	if p.Jitter > 0 {
		d += time.Duration((l.rng.Float64()*2 - 1) * float64(p.Jitter))
		d = max(d, 0)
	}
	v := Verdict{Deliver: base.Add(d), Copies: 1}
	if p.Reorder > 0 && l.rng.Float64() < p.Reorder {
		rd := p.ReorderDelay
		if rd == 0 {
			rd = DefaultReorderDelay
		}
		v.Deliver = v.Deliver.Add(rd)
		v.Reordered = true
	} else {
		if v.Deliver.Before(l.lastDeliver) {
			v.Deliver = l.lastDeliver
		}
		l.lastDeliver = v.Deliver
	}
	if p.Duplicate > 0 && l.rng.Float64() < p.Duplicate {
		v.Copies = 2
	}
	return v
}

// DirStats are the counters of one direction.
type DirStats struct {
	RxPackets        uint64            `json:"rx_packets"`
	RxBytes          uint64            `json:"rx_bytes"`
	TxPackets        uint64            `json:"tx_packets"`
	TxBytes          uint64            `json:"tx_bytes"`
	Dropped          map[string]uint64 `json:"dropped"`
	DroppedTotal     uint64            `json:"dropped_total"`
	Duplicated       uint64            `json:"duplicated"`
	Reordered        uint64            `json:"reordered"`
	WriteErrors      uint64            `json:"write_errors"`
	QueuePackets     int64             `json:"queue_packets"`
	QueueBytes       int64             `json:"queue_bytes"`
	MaxQueuePackets  int64             `json:"max_queue_packets"`
	RateBacklogBytes int64             `json:"rate_backlog_bytes"`
	BlackoutLeft     string            `json:"blackout_remaining"`
	Params           map[string]string `json:"params"`

	// LatePackets left the delay line at least LateThreshold after their
	// delivery time; LatenessNS sums every packet's lateness (ns) over the
	// packets that left it (delivered, failed to write, or dropped by a
	// blackout), for the mean lateness.
	LatePackets uint64 `json:"late_packets"`
	LatenessNS  uint64 `json:"lateness_ns_total"`
}

// Stats returns a snapshot of the counters.
func (l *Link) Stats(now time.Time) DirStats {
	s := DirStats{
		RxPackets:    l.stats.rxPackets.Load(),
		RxBytes:      l.stats.rxBytes.Load(),
		TxPackets:    l.stats.txPackets.Load(),
		TxBytes:      l.stats.txBytes.Load(),
		Dropped:      map[string]uint64{},
		Duplicated:   l.stats.duplicated.Load(),
		Reordered:    l.stats.reordered.Load(),
		WriteErrors:  l.stats.writeErrors.Load(),
		LatePackets:  l.stats.latePackets.Load(),
		LatenessNS:   l.stats.latenessNS.Load(),
		QueuePackets: l.stats.queuePackets.Load(),
		QueueBytes:   l.stats.queueBytes.Load(),

		MaxQueuePackets: l.stats.maxQueuePackets.Load(),
		BlackoutLeft:    l.BlackoutRemaining(now).String(),
		Params:          l.Params().ToMap(),
	}
	for c := CauseBlackout; c < causeCount; c++ {
		n := l.stats.dropped[c].Load()
		s.Dropped[c.String()] = n
		s.DroppedTotal += n
	}
	l.mu.Lock()
	if l.p.RateBits > 0 && l.busyUntil.After(now) {
		s.RateBacklogBytes = int64(float64(l.busyUntil.Sub(now)) * float64(l.p.RateBits) / 8 / float64(time.Second))
	}
	l.mu.Unlock()
	return s
}

func (l *Link) countTx(size int) {
	l.stats.txPackets.Add(1)
	l.stats.txBytes.Add(uint64(size))
}

func (l *Link) countDrop(c Cause) { l.stats.dropped[c].Add(1) }

func (l *Link) countLate(sum time.Duration, late int) {
	if sum > 0 {
		l.stats.latenessNS.Add(uint64(sum))
	}
	if late > 0 {
		l.stats.latePackets.Add(uint64(late))
	}
}

func (l *Link) queued(deltaPackets, deltaBytes int64) {
	n := l.stats.queuePackets.Add(deltaPackets)
	l.stats.queueBytes.Add(deltaBytes)
	for {
		m := l.stats.maxQueuePackets.Load()
		if n <= m || l.stats.maxQueuePackets.CompareAndSwap(m, n) {
			return
		}
	}
}
