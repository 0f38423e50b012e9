package congestion

import (
	"testing"
	"time"

	qc "github.com/quic-go/quic-go/congestion"
	"github.com/stretchr/testify/assert"
)

// TestTailCopiesFollowTheLossRate: as many copies as bring a tail packet's
// loss to 2 % at the measured rate, at most 3; none before 20 packets were
// counted, none while a congestive round is recent; the copies leave an
// eighth of the minimum RTT later, within 1-10 ms.
func TestTailCopiesFollowTheLossRate(t *testing.T) {
	for _, tc := range []struct {
		name          string
		lost, packets int
		minRTT        time.Duration
		congested     bool
		copies        int
		after         time.Duration
	}{
		{"no loss", 0, 100, 25 * time.Millisecond, false, 0, 0},
		{"1 %", 1, 100, 25 * time.Millisecond, false, 0, 0},
		{"5 %", 5, 100, 25 * time.Millisecond, false, 1, 3125 * time.Microsecond},
		{"10 %", 10, 100, 25 * time.Millisecond, false, 1, 3125 * time.Microsecond},
		{"20 %", 20, 100, 100 * time.Millisecond, false, 2, 10 * time.Millisecond},
		{"30 %", 30, 100, 100 * time.Millisecond, false, 3, 10 * time.Millisecond},
		{"50 %", 50, 100, 200 * time.Microsecond, false, 3, time.Millisecond},
		{"too few packets", 5, 19, 25 * time.Millisecond, false, 0, 0},
		{"congestion", 30, 100, 25 * time.Millisecond, true, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBBR(qc.Info{MaxDatagramSize: 1200}, Options{})
			b.minRTT = tc.minRTT
			for i := range tc.packets {
				// Losses spread over the sample, as random loss comes.
				b.loss.add(i%(tc.packets/max(tc.lost, 1)) == 0 && i/(tc.packets/max(tc.lost, 1)) < tc.lost)
			}
			if tc.congested {
				b.round, b.lastCongestionRound = 10, 9
			}
			n, after := b.TailCopies()
			assert.Equal(t, tc.copies, n)
			assert.Equal(t, tc.after, after)
		})
	}
}
