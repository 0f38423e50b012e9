package congestion

import (
	"math"
	"time"

	qc "github.com/quic-go/quic-go/congestion"
)

// minPacingDelay is the shortest wait the pacer asks for: Go's timers
// oversleep shorter ones anyway, and the bucket makes up for the delay.
const minPacingDelay = time.Millisecond

// pacer is a token bucket refilled at the pacing rate. Its depth allows a
// burst of max(burstPackets, what the rate sends in burstTime), so that a
// sender woken late by the timer catches up and GSO batches stay full. Go's
// timers oversleep short waits by about a millisecond on a loaded host, and
// BBR paces at (not above) its estimate: a shallower bucket would lose the
// time overslept, the estimate would follow the lower rate down, and so on.
type pacer struct {
	budget   int // bytes, at last
	last     qc.Time
	datagram int
}

const burstPackets = 10

func newPacer(datagram int) pacer { return pacer{datagram: datagram} }

// burstTime is how much of the rate the bucket holds.
const burstTime = 2 * time.Millisecond

func (p *pacer) maxBurst(rate float64) int {
	return max(burstPackets*p.datagram, int(rate*burstTime.Seconds()))
}

// budgetAt is the number of bytes that may leave at now, for rate in bytes/s.
// A rate that is not positive (or NaN) does not pace: timeUntilSend
// reports "now" for it, and the two must agree, or the sender's loop spins.
func (p *pacer) budgetAt(now qc.Time, rate float64) int {
	if p.last.IsZero() || !(rate > 0) {
		return p.maxBurst(rate)
	}
	b := p.budget
	if d := now.Sub(p.last); d > 0 {
		// Rounded, not truncated: at timeUntilSend's instant the product
		// is the missing bytes give or take a float's last bit, and
		// truncating 57.99999 to 57 left the bucket a byte short at its
		// own deadline, so the sender woke, found no budget and was given
		// the same deadline again (a busy loop; in a synctest bubble, where
		// the clock stands still, forever).
		b += int(min(math.Round(rate*d.Seconds()), float64(p.maxBurst(rate))))
	}
	return min(b, p.maxBurst(rate))
}

func (p *pacer) sent(now qc.Time, bytes int, rate float64) {
	p.budget = max(p.budgetAt(now, rate)-bytes, 0)
	p.last = now
}

func (p *pacer) hasBudget(now qc.Time, rate float64) bool {
	return p.budgetAt(now, rate) >= p.datagram
}

// timeUntilSend is when the bucket holds a full datagram again; zero means now.
func (p *pacer) timeUntilSend(rate float64) qc.Time {
	if p.last.IsZero() || p.budget >= p.datagram || !(rate > 0) {
		return 0
	}
	wait := time.Duration(math.Ceil(float64(p.datagram-p.budget) / rate * float64(time.Second)))
	return p.last.Add(max(wait, minPacingDelay))
}
