package congestion

import (
	"math"
	"sync"
	"time"

	qc "github.com/quic-go/quic-go/congestion"
)

// CUBIC parameters (RFC 9438 section 4) and window bounds. The names are
// prefixed so that they cannot clash with the other controllers' constants.
const (
	cubicBeta = 0.7 // multiplicative decrease factor
	cubicC    = 0.4 // segments/s³
	// cubicAlpha is the Reno-friendly additive increase (segments per RTT)
	// that gives the same average window as Reno with beta 0.5 (section 4.3).
	cubicAlpha = 3 * (1 - cubicBeta) / (1 + cubicBeta)

	cubicInitialWindowPackets = 32 // as quic-go
	cubicMinWindowPackets     = 2  // RFC 9002 kMinimumWindow
	cubicMaxWindowPackets     = 10000
	cubicDefaultRTT           = 100 * time.Millisecond // before the first RTT sample

	// The window grows only when the sender was using it: bytes in flight
	// before the ACK within cubicLimitSlack packets of cwnd (or, in slow
	// start, above half of it, as a paced sender fills the window late).
	cubicLimitSlack = 3

	cubicSlowStartPacingGain = 2.0
	cubicPacingGain          = 1.25
)

type cubicState uint8

const (
	cubicSlowStart cubicState = iota
	cubicCongestionAvoidance
	cubicRecovery
)

func (s cubicState) String() string {
	switch s {
	case cubicSlowStart:
		return "slow_start"
	case cubicCongestionAvoidance:
		return "congestion_avoidance"
	default:
		return "recovery"
	}
}

// CubicController is CUBIC (RFC 9438) with QUIC's slow start and recovery
// (RFC 9002 section 7) and this package's pacer. Create it with NewCubic.
//
// Windows are kept in bytes as float64 so that the per-ACK increments of
// congestion avoidance, often a fraction of a byte, are not rounded away.
type CubicController struct {
	rtt      qc.RTTStats
	datagram int
	pace     pacer

	cwnd     float64 // bytes
	ssthresh float64 // bytes; +Inf until the first congestion event

	// Recovery (RFC 9002 section 7.3.2), by packet number rather than send
	// time: packet numbers of one connection's 1-RTT space only increase,
	// and two packets may share a timestamp.
	largestSent int64 // largest packet number sent; -1: none
	recoveryEnd int64 // largest packet number sent when the window was last reduced; -1: never
	inRecovery  bool  // no packet sent after recoveryEnd has been acknowledged yet

	// CUBIC state (RFC 9438 section 4).
	wMax       float64 // W_max, bytes: the window before the last reduction (fast convergence applied)
	cwndPrior  float64 // cwnd before the last reduction
	wEst       float64 // W_est, the Reno-friendly estimate, bytes
	epochValid bool    // a congestion avoidance epoch is running
	epochStart qc.Time // t_epoch, shifted forward by app-limited time
	k          float64 // K, seconds
	origin     float64 // the window W_cubic returns to at t = K, bytes
	lastAck    qc.Time // time of the previous event, for app-limited epoch shifts

	// loss rate of the last completed round trip, for Stats
	roundEnd   int64 // a round ends when a packet above this is acknowledged
	roundAcked int
	roundLost  int
	lossRate   float64

	mu    sync.Mutex
	stats Stats
}

var (
	_ qc.Controller = (*CubicController)(nil)
	_ StatsReporter = (*CubicController)(nil)
)

// NewCubic returns a CUBIC controller (RFC 9438) for a connection.
func NewCubic(info qc.Info) *CubicController {
	d := datagramSize(info)
	c := &CubicController{
		rtt:         info.RTT,
		datagram:    d,
		pace:        newPacer(d),
		ssthresh:    math.Inf(1),
		largestSent: -1,
		recoveryEnd: -1,
		roundEnd:    -1,
	}
	c.cwnd = c.clamp(float64(cubicInitialWindowPackets * d))
	c.publish()
	return c
}

func (c *CubicController) minWindow() float64 {
	return float64(cubicMinWindowPackets * c.datagram)
}

func (c *CubicController) maxWindow() float64 {
	return float64(cubicMaxWindowPackets * c.datagram)
}

func (c *CubicController) clamp(w float64) float64 {
	return max(min(w, c.maxWindow()), c.minWindow())
}

func (c *CubicController) srtt() time.Duration {
	if c.rtt != nil {
		if s := c.rtt.SmoothedRTT(); s > 0 {
			return s
		}
	}
	return cubicDefaultRTT
}

func (c *CubicController) state() cubicState {
	switch {
	case c.inRecovery:
		return cubicRecovery
	case c.cwnd < c.ssthresh:
		return cubicSlowStart
	default:
		return cubicCongestionAvoidance
	}
}

// pacingRate is in bytes/s: twice the window per RTT in slow start, so that
// the window can double, and 1.25 times after.
func (c *CubicController) pacingRate() float64 {
	gain := cubicPacingGain
	if c.cwnd < c.ssthresh {
		gain = cubicSlowStartPacingGain
	}
	return gain * c.cwnd / c.srtt().Seconds()
}

// OnPacketSent implements qc.Controller.
func (c *CubicController) OnPacketSent(p qc.SentPacket) {
	c.pace.sent(p.Time, p.Bytes, c.pacingRate())
	c.largestSent = max(c.largestSent, p.PacketNumber)
}

// OnAppLimited implements qc.Controller. Nothing to do: OnEvent grows the
// window only when the bytes in flight before an ACK show that the window
// was in use (RFC 9438 section 5.8, RFC 9002 section 7.8), and freezes the
// cubic clock while it was not.
func (c *CubicController) OnAppLimited(int) {}

// SetMaxDatagramSize implements qc.Controller.
func (c *CubicController) SetMaxDatagramSize(s int) {
	if s <= 0 || s == c.datagram {
		return
	}
	c.datagram = s
	c.pace.datagram = s
	c.cwnd = c.clamp(c.cwnd)
	// K depends on the segment size: start a new epoch on the next ACK.
	c.epochValid = false
	c.publish()
}

// OnEvent implements qc.Controller. As in RFC 9002's OnAckReceived,
// congestion signals are handled before the acknowledgements, so that the
// ACK that reports a loss or an ECN-CE mark does not grow the window.
func (c *CubicController) OnEvent(e *qc.Event) {
	if e.ECNCongestion {
		// The CE marks belong to this ACK's packets: the congestion event
		// has the largest acknowledged packet's send time.
		if n := len(e.Acked); n > 0 {
			c.onCongestion(e.Acked[n-1].PacketNumber)
		} else if !c.inRecovery {
			c.onCongestion(c.largestSent)
		}
	}
	for i := range e.Lost {
		l := &e.Lost[i]
		if l.MTUProbe || l.ByPTO {
			continue // not a congestion signal
		}
		c.roundLost++
		c.onCongestion(l.PacketNumber)
	}

	acked := 0
	var largestAcked int64 = -1
	for i := range e.Acked {
		a := &e.Acked[i]
		largestAcked = max(largestAcked, a.PacketNumber)
		c.roundAcked++
		if a.PacketNumber <= c.recoveryEnd {
			continue // sent before the current recovery period began
		}
		c.inRecovery = false
		acked += a.Bytes
	}
	if acked > 0 {
		c.grow(e, acked)
	}
	c.lastAck = e.Time
	if largestAcked > c.roundEnd {
		if n := c.roundAcked + c.roundLost; n > 0 && c.roundEnd >= 0 {
			c.lossRate = float64(c.roundLost) / float64(n)
		}
		c.roundAcked, c.roundLost = 0, 0
		c.roundEnd = c.largestSent
	}
	c.publish()
}

// onCongestion handles a loss or ECN-CE mark of packet pn: it starts a
// recovery period and reduces the window (RFC 9438 sections 4.6 and 4.7)
// unless pn was sent before the current period began.
func (c *CubicController) onCongestion(pn int64) {
	if pn <= c.recoveryEnd {
		return
	}
	c.recoveryEnd = c.largestSent
	c.inRecovery = true
	c.epochValid = false

	c.cwndPrior = c.cwnd
	if c.cwnd < c.wMax {
		// Fast convergence: the available share shrank; release some of it.
		c.wMax = c.cwnd * (1 + cubicBeta) / 2
	} else {
		c.wMax = c.cwnd
	}
	c.ssthresh = max(c.cwnd*cubicBeta, c.minWindow())
	c.cwnd = c.clamp(c.ssthresh)
}

// cwndLimited reports whether the window was in use before an ACK.
func (c *CubicController) cwndLimited(priorInFlight int) bool {
	inFlight := float64(priorInFlight)
	if c.cwnd < c.ssthresh && inFlight > c.cwnd/2 {
		return true
	}
	return inFlight+float64(cubicLimitSlack*c.datagram) >= c.cwnd
}

// grow applies acked newly acknowledged bytes, all sent after the last
// recovery period began.
func (c *CubicController) grow(e *qc.Event, acked int) {
	if !c.cwndLimited(e.PriorInFlight) {
		// Application limited: keep the window, and stop the cubic clock so
		// that the window does not jump once the sender uses it again.
		if c.epochValid && e.Time.After(c.lastAck) {
			c.epochStart = c.epochStart.Add(e.Time.Sub(c.lastAck))
		}
		return
	}
	if c.cwnd < c.ssthresh {
		// Slow start (RFC 9002 section 7.3.1).
		c.cwnd = c.clamp(c.cwnd + float64(acked))
		return
	}

	mss := float64(c.datagram)
	if !c.epochValid {
		c.epochValid = true
		c.epochStart = e.Time
		c.wEst = c.cwnd
		if c.wMax > c.cwnd {
			c.k = math.Cbrt((c.wMax - c.cwnd) / (cubicC * mss))
			c.origin = c.wMax
		} else {
			// No reduction to return from (or the window already exceeds
			// W_max): the curve starts in its convex part.
			c.k = 0
			c.origin = c.cwnd
		}
	}

	// Reno-friendly estimate (section 4.3), alpha 1 once it reached the
	// window before the reduction.
	alpha := cubicAlpha
	if c.wEst >= c.cwndPrior {
		alpha = 1
	}
	c.wEst += alpha * float64(acked) * mss / c.cwnd

	t := e.Time.Sub(c.epochStart).Seconds()
	if c.wCubic(t) < c.wEst {
		c.cwnd = c.clamp(max(c.cwnd, c.wEst))
		return
	}
	// Concave or convex region (sections 4.4 and 4.5): head for W_cubic one
	// RTT ahead, at most 1.5 times the window.
	target := c.wCubic(t + c.srtt().Seconds())
	target = min(max(target, c.cwnd), 1.5*c.cwnd)
	c.cwnd = c.clamp(c.cwnd + (target-c.cwnd)/c.cwnd*float64(acked))
}

// wCubic is W_cubic(t) in bytes, t in seconds since the epoch began.
func (c *CubicController) wCubic(t float64) float64 {
	d := t - c.k
	return cubicC*float64(c.datagram)*d*d*d + c.origin
}

// CanSend implements qc.Controller.
func (c *CubicController) CanSend(bytesInFlight int) bool {
	return float64(bytesInFlight) < c.cwnd
}

// HasPacingBudget implements qc.Controller.
func (c *CubicController) HasPacingBudget(now qc.Time) bool {
	return c.pace.hasBudget(now, c.pacingRate())
}

// TimeUntilSend implements qc.Controller.
func (c *CubicController) TimeUntilSend(int) qc.Time {
	return c.pace.timeUntilSend(c.pacingRate())
}

// CongestionWindow implements qc.Controller.
func (c *CubicController) CongestionWindow() int { return int(c.cwnd) }

// InSlowStart implements qc.Controller.
func (c *CubicController) InSlowStart() bool { return c.state() == cubicSlowStart }

// InRecovery implements qc.Controller.
func (c *CubicController) InRecovery() bool { return c.inRecovery }

func (c *CubicController) publish() {
	var minRTT time.Duration
	if c.rtt != nil {
		minRTT = c.rtt.MinRTT()
	}
	s := Stats{
		Algorithm:                Cubic,
		State:                    c.state().String(),
		CongestionWindowBytes:    int(c.cwnd),
		PacingRateBytesPerSecond: c.pacingRate(),
		MinRTT:                   minRTT,
		LossRate:                 c.lossRate,
	}
	c.mu.Lock()
	c.stats = s
	c.mu.Unlock()
}

// Stats implements StatsReporter; safe for concurrent use.
func (c *CubicController) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}
