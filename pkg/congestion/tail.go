package congestion

import (
	"time"

	qc "github.com/quic-go/quic-go/congestion"
)

// Tail copies (quic-go's congestion.TailCopier, patch 0011). The last packet
// before a sender runs out of data, a request or a reply's last packet, has
// no later packet whose acknowledgement reveals its loss: lost, it waits for
// a probe timeout, more than a round trip, and on a path that loses 30 % of
// its packets each way most short exchanges lose one. bbr asks for copies of
// such a packet, sent a little after it if nothing follows, as many as make
// its loss unlikely at the path's measured loss rate, unless the loss may be
// a queue's overflow (a congestive round is recent), where copies would add
// to it. A bulk sender, whose next packet follows within the delay, sends
// none.
const (
	// tailLossWindow is how many packets the loss estimate remembers (an
	// exponentially weighted mean), tailLossMinSample how many it needs.
	tailLossWindow    = 100
	tailLossMinSample = 20
	// tailResidual: copies until a tail packet is lost with at most this
	// probability (each copy lost independently at the measured rate).
	tailResidual  = 0.02
	maxTailCopies = 3
	// The copies leave an eighth of the minimum RTT after the packet, within
	// these bounds: late enough that a burst of loss that took the packet is
	// likely over, early enough to be far ahead of the probe timeout.
	tailCopyDelayMin = time.Millisecond
	tailCopyDelayMax = 10 * time.Millisecond
)

// packetLoss is the share of ack-eliciting packets the path loses, over all
// of them (not only those sent below bbr's model): a lightly used
// connection, which never leaves Startup nor fills a round, learns it too.
type packetLoss struct {
	rate float64
	n    int // packets counted, up to tailLossWindow
}

func (l *packetLoss) add(lost bool) {
	x := 0.0
	if lost {
		x = 1
	}
	if l.n < tailLossWindow {
		l.n++
	}
	l.rate += (x - l.rate) / float64(l.n)
}

// copies returns how many copies of a tail packet bring its loss to at most
// tailResidual at the measured rate, at most maxTailCopies.
func (l *packetLoss) copies() int {
	if l.n < tailLossMinSample || l.rate <= tailResidual {
		return 0
	}
	n := 0
	for q := l.rate; q > tailResidual && n < maxTailCopies; q *= l.rate {
		n++
	}
	return n
}

var _ qc.TailCopier = (*BBRController)(nil)

// TailCopies implements qc.TailCopier.
func (b *BBRController) TailCopies() (int, time.Duration) {
	if b.recentCongestion() {
		return 0, 0
	}
	n := b.loss.copies()
	if n == 0 {
		return 0, 0
	}
	after := tailCopyDelayMax
	if b.minRTT > 0 {
		after = min(max(b.minRTT/8, tailCopyDelayMin), tailCopyDelayMax)
	}
	return n, after
}
