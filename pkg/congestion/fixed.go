package congestion

import (
	"sync"
	"time"

	qc "github.com/quic-go/quic-go/congestion"
)

// The fixed-rate controller's guard: a standing queue (every RTT sample of
// guardRounds round trips in a row above guardQueueFactor times the path's
// minimum plus guardQueueSlack) cuts the rate to guardBeta of itself, at
// most once a round, down to guardFloor of the configured rate; each round
// without a queue gives back guardRecovery of the configured rate.
const (
	guardQueueFactor = 1.5
	guardQueueSlack  = 2 * time.Millisecond
	guardRounds      = 2
	guardBeta        = 0.7
	guardFloor       = 1.0 / 32
	guardRecovery    = 0.05
	// fixedWindowRTTs is the window in round trips of the configured rate
	// (more only builds a queue of our own).
	fixedWindowRTTs = 2
	// fixedLossKeep weighs the loss-rate estimate: per round, the share of
	// the old estimate kept.
	fixedLossKeep = 0.75
)

// FixedController sends at a rate the operator configured (Options.Rate,
// --congestion fixed --rate), for a link whose rate is known: loss does not
// slow it, and what random loss takes is sent again on top (the pacing rate
// is the configured goodput divided by 1 minus the measured loss rate, at
// most Options.LossThreshold). Its guard keeps it from flattening other
// traffic by mistake: a queue that stands through whole round trips (which
// random loss never builds, and a rate within the link's never builds
// either) means the link is full, and the rate is cut by 0.3 each round
// until the queue is gone, then given back by 5 % of the configured rate a
// round. Create it with NewFixed.
type FixedController struct {
	rtt       qc.RTTStats
	target    float64 // configured goodput, bytes/s
	threshold float64
	datagram  int
	pace      pacer

	minRTT      time.Duration
	roundStart  qc.Time
	roundMinRTT time.Duration
	queueRounds int
	jumpRounds  int
	scale       float64 // of target, by the guard: guardFloor..1
	acked, lost int     // packets this round
	lossRate    float64 // packet-weighted moving estimate
	lossW       float64 // its weight so far (0: none)
	pacingRate  float64
	cwnd        int

	mu    sync.Mutex
	stats Stats
}

var _ qc.Controller = (*FixedController)(nil)

// NewFixed returns a fixed-rate controller for a connection; o.Rate must be
// positive (the flags check it).
func NewFixed(info qc.Info, o Options) *FixedController {
	th := o.LossThreshold
	if th <= 0 {
		th = DefaultLossThreshold
	}
	f := &FixedController{
		rtt: info.RTT, target: max(o.Rate, 1), threshold: th,
		datagram: datagramSize(info), pace: newPacer(datagramSize(info)), scale: 1,
	}
	f.update()
	return f
}

// OnPacketSent implements qc.Controller.
func (f *FixedController) OnPacketSent(p qc.SentPacket) { f.pace.sent(p.Time, p.Bytes, f.pacingRate) }

// OnAppLimited implements qc.Controller: the rate is configured, not measured.
func (f *FixedController) OnAppLimited(int) {}

// SetMaxDatagramSize implements qc.Controller.
func (f *FixedController) SetMaxDatagramSize(s int) {
	if s > 0 {
		f.datagram, f.pace.datagram = s, s
		f.update()
	}
}

// OnEvent implements qc.Controller.
func (f *FixedController) OnEvent(e *qc.Event) {
	f.acked += len(e.Acked)
	for i := range e.Lost {
		if !e.Lost[i].MTUProbe && !e.Lost[i].ByPTO {
			f.lost++
		}
	}
	if n := len(e.Acked); n > 0 {
		sample := e.Time.Sub(e.Acked[n-1].SentTime)
		if f.minRTT == 0 || sample < f.minRTT {
			f.minRTT = sample
		}
		if f.roundMinRTT == 0 || sample < f.roundMinRTT {
			f.roundMinRTT = sample
		}
	}
	if f.roundStart.IsZero() {
		f.roundStart = e.Time
	}
	if f.minRTT > 0 && e.Time.Sub(f.roundStart) >= f.minRTT {
		f.endRound(e.Time)
	}
	f.update()
}

// endRound updates the loss estimate and applies the guard.
func (f *FixedController) endRound(now qc.Time) {
	if n := f.acked + f.lost; n > 0 {
		w := float64(n)
		f.lossRate = (f.lossRate*f.lossW*fixedLossKeep + float64(f.lost)) / (f.lossW*fixedLossKeep + w)
		f.lossW = f.lossW*fixedLossKeep + w
	}
	queued := f.roundMinRTT > time.Duration(float64(f.minRTT)*guardQueueFactor)+guardQueueSlack
	// A path that became much longer (a reroute) is not a queue: as bbr
	// does, adopt its RTT after a few rounds of every sample over
	// rttJumpFactor times the old minimum.
	if f.roundMinRTT > rttJumpFactor*f.minRTT {
		if f.jumpRounds++; f.jumpRounds >= rttJumpRoundsNeeded {
			f.minRTT, f.jumpRounds, queued = f.roundMinRTT, 0, false
		}
	} else {
		f.jumpRounds = 0
	}
	switch {
	case queued:
		if f.queueRounds++; f.queueRounds >= guardRounds {
			f.scale = max(f.scale*guardBeta, guardFloor)
		}
	default:
		f.queueRounds = 0
		f.scale = min(f.scale+guardRecovery, 1)
	}
	f.acked, f.lost, f.roundMinRTT, f.roundStart = 0, 0, 0, now
}

// update recomputes the pacing rate and the window.
func (f *FixedController) update() {
	f.pacingRate = f.scale * f.target / (1 - min(f.lossRate, f.threshold))
	rtt := f.minRTT
	if rtt == 0 {
		rtt = initialRTT
	}
	f.cwnd = max(int(f.pacingRate*rtt.Seconds()*fixedWindowRTTs)+3*f.datagram, minWindowPackets*f.datagram)
	state := "rate"
	if f.scale < 1 {
		state = "guard"
	}
	f.mu.Lock()
	f.stats = Stats{
		Algorithm: Fixed, State: state, CongestionWindowBytes: f.cwnd, PacingRateBytesPerSecond: f.pacingRate,
		BandwidthBytesPerSecond: f.scale * f.target, MinRTT: f.minRTT, LossRate: f.lossRate, RandomLoss: f.lossRate,
	}
	f.mu.Unlock()
}

// CanSend implements qc.Controller.
func (f *FixedController) CanSend(bytesInFlight int) bool { return bytesInFlight < f.cwnd }

// HasPacingBudget implements qc.Controller.
func (f *FixedController) HasPacingBudget(now qc.Time) bool {
	return f.pace.hasBudget(now, f.pacingRate)
}

// TimeUntilSend implements qc.Controller.
func (f *FixedController) TimeUntilSend(int) qc.Time { return f.pace.timeUntilSend(f.pacingRate) }

// CongestionWindow implements qc.Controller.
func (f *FixedController) CongestionWindow() int { return f.cwnd }

// InSlowStart implements qc.Controller: there is no slow start.
func (f *FixedController) InSlowStart() bool { return false }

// InRecovery implements qc.Controller.
func (f *FixedController) InRecovery() bool { return false }

// Stats implements StatsReporter; safe for concurrent use.
func (f *FixedController) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}
