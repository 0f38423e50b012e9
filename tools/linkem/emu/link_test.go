package emu

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Unix(1_700_000_000, 0) // test epoch

func TestLinkDelay(t *testing.T) {
	t.Parallel()
	l := NewLink(Params{Delay: 12500 * time.Microsecond}, 1)
	for i := range 100 {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		v := l.Offer(now, 1000)
		require.Equal(t, CauseNone, v.Drop)
		assert.Equal(t, now.Add(12500*time.Microsecond), v.Deliver)
		assert.Equal(t, 1, v.Copies)
	}
}

func TestLinkJitterKeepsOrder(t *testing.T) {
	t.Parallel()
	l := NewLink(Params{Delay: 10 * time.Millisecond, Jitter: 5 * time.Millisecond}, 2)
	var last time.Time
	var sum, n float64
	minD, maxD := time.Hour, time.Duration(0)
	for i := range 20000 {
		now := t0.Add(time.Duration(i) * 100 * time.Microsecond)
		v := l.Offer(now, 100)
		require.False(t, v.Deliver.Before(last), "packet %d overtook its predecessor", i)
		last = v.Deliver
		d := v.Deliver.Sub(now)
		minD, maxD = min(minD, d), max(maxD, d)
		sum += float64(d)
		n++
	}
	assert.GreaterOrEqual(t, minD, 5*time.Millisecond)
	assert.LessOrEqual(t, maxD, 15*time.Millisecond)
	// Keeping order pushes the mean up (a packet waits for slower
	// predecessors), but it stays within the jitter range.
	mean := time.Duration(sum / n)
	assert.Greater(t, mean, 10*time.Millisecond)
	assert.Less(t, mean, 15*time.Millisecond)
}

func TestLinkJitterSparseMeanIsDelay(t *testing.T) {
	t.Parallel()
	// Packets far apart are not held back by order: the mean is the delay.
	l := NewLink(Params{Delay: 10 * time.Millisecond, Jitter: 5 * time.Millisecond}, 3)
	var sum float64
	const n = 20000
	for i := range n {
		now := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		sum += float64(l.Offer(now, 100).Deliver.Sub(now))
	}
	assert.InDelta(t, float64(10*time.Millisecond), sum/n, float64(100*time.Microsecond))
}

func TestLinkBernoulliLoss(t *testing.T) {
	t.Parallel()
	for _, p := range []float64{0, 0.01, 0.02, 0.1, 1} {
		l := NewLink(Params{Loss: p}, 4)
		const n = 200000
		lost := 0
		for i := range n {
			if l.Offer(t0.Add(time.Duration(i)), 100).Drop == CauseLoss {
				lost++
			}
		}
		sigma := math.Sqrt(p * (1 - p) / n)
		assert.InDelta(t, p, float64(lost)/n, 5*sigma+1e-9, "loss %v", p)
		s := l.Stats(t0)
		assert.Equal(t, uint64(lost), s.Dropped["loss"])
		assert.Equal(t, uint64(n), s.RxPackets)
	}
}

func TestLinkGilbertElliott(t *testing.T) {
	t.Parallel()
	// Gilbert model: p=0.01, r=0.25, bad state loses everything.
	// Stationary loss = p/(p+r) = 3.85 %, mean burst length = 1/r = 4.
	p := DefaultParams()
	p.GEP, p.GER = 0.01, 0.25
	l := NewLink(p, 5)
	const n = 400000
	lost, bursts, run := 0, 0, 0
	for i := range n {
		if l.Offer(t0.Add(time.Duration(i)), 100).Drop == CauseGE {
			lost++
			run++
			continue
		}
		if run > 0 {
			bursts++
			run = 0
		}
	}
	assert.InDelta(t, 0.01/(0.01+0.25), float64(lost)/n, 0.003)
	assert.InDelta(t, 4.0, float64(lost)/float64(bursts), 0.3)
}

func TestLinkRateLimitAndTailDrop(t *testing.T) {
	t.Parallel()
	// 8 Mbit/s = 1000 B per ms. Queue 10 000 B.
	l := NewLink(Params{RateBits: 8e6, QueueBytes: 10000, Delay: 5 * time.Millisecond}, 6)
	// A burst of 20 packets of 1000 B at the same instant: the queue bound
	// counts every byte not yet sent (the packet in service too), so 10 fit
	// and the rest are tail dropped.
	var delivered []time.Time
	drops := 0
	for range 20 {
		v := l.Offer(t0, 1000)
		if v.Drop == CauseQueue {
			drops++
			continue
		}
		require.Equal(t, CauseNone, v.Drop)
		delivered = append(delivered, v.Deliver)
	}
	assert.Len(t, delivered, 10)
	assert.Equal(t, 10, drops)
	for i, d := range delivered {
		// Serialization: packet i leaves the bottleneck at (i+1) ms.
		assert.Equal(t, t0.Add(time.Duration(i+1)*time.Millisecond+5*time.Millisecond), d, "packet %d", i)
	}
	s := l.Stats(t0)
	assert.Equal(t, uint64(10), s.Dropped["queue"])
	assert.Equal(t, int64(10000), s.RateBacklogBytes)

	// Sustained offer at twice the rate: the delivered rate equals the link rate.
	l2 := NewLink(Params{RateBits: 8e6}, 7)
	var first, last time.Time
	bytes := 0
	for i := range 10000 {
		now := t0.Add(time.Duration(i) * 500 * time.Microsecond) // 2000 B/ms offered
		v := l2.Offer(now, 1000)
		if v.Drop != CauseNone {
			continue
		}
		if first.IsZero() {
			first = v.Deliver
		}
		last = v.Deliver
		bytes += 1000
	}
	rate := float64(bytes-1000) * 8 / last.Sub(first).Seconds()
	assert.InEpsilon(t, 8e6, rate, 0.01)
}

func TestLinkBlackout(t *testing.T) {
	t.Parallel()
	l := NewLink(Params{Delay: time.Millisecond}, 8)
	l.Blackout(t0, 5*time.Second)
	l.Blackout(t0, time.Second) // shorter: does not cut the first short
	assert.Equal(t, CauseBlackout, l.Offer(t0.Add(4*time.Second), 100).Drop)
	assert.True(t, l.InBlackout(t0.Add(4999*time.Millisecond)))
	assert.Equal(t, time.Second, l.BlackoutRemaining(t0.Add(4*time.Second)))
	assert.Equal(t, CauseNone, l.Offer(t0.Add(5*time.Second), 100).Drop)
	assert.False(t, l.InBlackout(t0.Add(5*time.Second)))
}

func TestLinkDuplicateAndReorder(t *testing.T) {
	t.Parallel()
	l := NewLink(Params{Delay: 10 * time.Millisecond, Duplicate: 0.1, Reorder: 0.05, ReorderDelay: 2 * time.Millisecond}, 9)
	const n = 100000
	dups, reord := 0, 0
	for i := range n {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		v := l.Offer(now, 100)
		if v.Copies == 2 {
			dups++
		}
		if v.Reordered {
			reord++
			assert.Equal(t, now.Add(12*time.Millisecond), v.Deliver)
		}
	}
	assert.InDelta(t, 0.1, float64(dups)/n, 0.005)
	assert.InDelta(t, 0.05, float64(reord)/n, 0.004)
	s := l.Stats(t0)
	assert.Equal(t, uint64(dups), s.Duplicated)
	assert.Equal(t, uint64(reord), s.Reordered)
}

func TestLinkSetParamsLive(t *testing.T) {
	t.Parallel()
	l := NewLink(Params{Delay: time.Millisecond}, 10)
	assert.Equal(t, t0.Add(time.Millisecond), l.Offer(t0, 1).Deliver)
	l.SetParams(Params{Delay: 20 * time.Millisecond})
	now := t0.Add(time.Second)
	assert.Equal(t, now.Add(20*time.Millisecond), l.Offer(now, 1).Deliver)
}

func TestLinkDeterministicSeed(t *testing.T) {
	t.Parallel()
	run := func() []Cause {
		l := NewLink(Params{Loss: 0.3}, 42)
		out := make([]Cause, 100)
		for i := range out {
			out[i] = l.Offer(t0, 1).Drop
		}
		return out
	}
	assert.Equal(t, run(), run())
}
