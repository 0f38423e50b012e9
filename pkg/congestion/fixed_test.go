package congestion

import (
	"testing"
	"time"

	qc "github.com/quic-go/quic-go/congestion"
	"github.com/stretchr/testify/require"
)

func newTestFixed(rate float64) (*FixedController, *fakeRTT) {
	rtt := &fakeRTT{}
	return NewFixed(qc.Info{RTT: rtt, MaxDatagramSize: datagram}, Options{Rate: rate}), rtt
}

// At a rate the link carries, loss does not slow the fixed controller: it
// sends what random loss takes on top (the target: 50 Mbit/s at
// 30 % loss keeps at least 45 of goodput), and no queue builds, so the
// guard stays off.
func TestFixedHoldsItsRateThroughLoss(t *testing.T) {
	for _, loss := range []float64{0, 0.3, 0.5} {
		f, rtt := newTestFixed(50 * mbit)
		s := newLinkSim(f, rtt, 100*mbit, 12500*time.Microsecond, loss, 256)
		s.run(time.Second)
		g := s.goodput(5 * time.Second)
		require.Greater(t, g, 0.9*50*mbit, "loss %.0f%%: goodput %.1f Mbit/s", loss*100, g/mbit)
		require.Equal(t, "rate", f.Stats().State, "loss %.0f%%", loss*100)
		require.InDelta(t, loss, f.Stats().LossRate, 0.05)
	}
}

// A rate above what the link carries builds a standing queue: the guard
// cuts the rate within a second, so a wrong --rate (or another flow's queue)
// does not flatten the link, and it settles near the link's rate.
func TestFixedGuardBacksOffOnAQueue(t *testing.T) {
	f, rtt := newTestFixed(50 * mbit)
	s := newLinkSim(f, rtt, 20*mbit, 12500*time.Microsecond, 0, 400)
	s.run(time.Second)
	st := f.Stats()
	require.Equal(t, "guard", st.State)
	require.Less(t, st.PacingRateBytesPerSecond, 25*mbit, "cut within a second")
	lost0, del0 := s.lostBytes, s.delivered
	g := s.goodput(5 * time.Second)
	require.Greater(t, g, 0.7*20*mbit, "it still uses the link")
	require.Less(t, float64(s.lostBytes-lost0), 0.1*float64(s.delivered-del0), "no standing overflow")
	// The link widens: the queue is gone and the rate comes back.
	s.rate = 100 * mbit
	s.run(2 * time.Second)
	require.Equal(t, "rate", f.Stats().State)
	require.InDelta(t, 50*mbit, f.Stats().PacingRateBytesPerSecond, 2*mbit)
}

func TestFixedParsesAndStats(t *testing.T) {
	a, err := ParseAlgorithm("fixed")
	require.NoError(t, err)
	require.Equal(t, Fixed, a)
	c := Factory(Fixed, Options{Rate: 10 * mbit})(qc.Info{RTT: &fakeRTT{}, MaxDatagramSize: datagram})
	st, ok := StatsOf(c)
	require.True(t, ok)
	require.Equal(t, Fixed, st.Algorithm)
	require.InDelta(t, 10*mbit, st.PacingRateBytesPerSecond, 1)
}
