package congestion

import (
	"math"
	"sync"
	"testing"
	"time"

	qc "github.com/quic-go/quic-go/congestion"
	"github.com/stretchr/testify/require"
)

const cubicTestMSS = 1200

// cubicFakeRTT is a qc.RTTStats the test sets by hand.
type cubicFakeRTT struct {
	srtt, minRTT time.Duration
}

func (r *cubicFakeRTT) MinRTT() time.Duration        { return r.minRTT }
func (r *cubicFakeRTT) SmoothedRTT() time.Duration   { return r.srtt }
func (r *cubicFakeRTT) LatestRTT() time.Duration     { return r.srtt }
func (r *cubicFakeRTT) MeanDeviation() time.Duration { return r.srtt / 4 }

type cubicSimPacket struct {
	pn    int64
	bytes int
	sent  qc.Time
	mtu   bool
}

// cubicSim drives a CubicController over an ideal path: a fixed RTT, no
// queue, every packet acknowledged (in order, one ACK each) an RTT after it
// was sent unless the test loses it. The sender sends whenever the window
// allows (ack clocking); pacing is not modelled here.
type cubicSim struct {
	t        *testing.T
	c        *CubicController
	rtt      *cubicFakeRTT
	now      qc.Time
	nextPN   int64
	inFlight int
	flight   []cubicSimPacket // FIFO, from head
	head     int
	acked    []qc.AckedPacket
	lost     []qc.LostPacket
}

func newCubicSim(t *testing.T, rtt time.Duration) *cubicSim {
	r := &cubicFakeRTT{srtt: rtt, minRTT: rtt}
	return &cubicSim{
		t:   t,
		c:   NewCubic(qc.Info{RTT: r, MaxDatagramSize: cubicTestMSS}),
		rtt: r,
		now: qc.Time(time.Second), // a nonzero start: the zero Time means "none"
	}
}

func (s *cubicSim) send(bytes int, mtu bool) cubicSimPacket {
	p := cubicSimPacket{pn: s.nextPN, bytes: bytes, sent: s.now, mtu: mtu}
	s.nextPN++
	s.inFlight += bytes
	s.flight = append(s.flight, p)
	s.c.OnPacketSent(qc.SentPacket{
		Time: s.now, PacketNumber: p.pn, Bytes: bytes, BytesInFlight: s.inFlight,
		AckEliciting: true, MTUProbe: mtu,
	})
	return p
}

// sendACKOnly sends a packet that is not ack-eliciting (never reported again).
func (s *cubicSim) sendACKOnly() {
	s.c.OnPacketSent(qc.SentPacket{Time: s.now, PacketNumber: s.nextPN, Bytes: 50, BytesInFlight: s.inFlight})
	s.nextPN++
}

// fill sends full-size packets while the window allows, and while bytes in
// flight stay below limit (0: no limit, the sender is cwnd-limited).
func (s *cubicSim) fill(limit int) {
	for s.c.CanSend(s.inFlight) && (limit == 0 || s.inFlight < limit) {
		s.send(cubicTestMSS, false)
	}
}

func (s *cubicSim) pending() int { return len(s.flight) - s.head }

func (s *cubicSim) pop() cubicSimPacket {
	require.Positive(s.t, s.pending(), "nothing in flight")
	p := s.flight[s.head]
	s.head++
	if s.head > 4096 && s.head*2 > len(s.flight) {
		s.flight = append(s.flight[:0], s.flight[s.head:]...)
		s.head = 0
	}
	return p
}

// event reports the acknowledgement and loss of packets at s.now.
func (s *cubicSim) event(acked, lost []cubicSimPacket, byPTO, ecn bool) {
	s.acked, s.lost = s.acked[:0], s.lost[:0]
	prior := s.inFlight
	for _, p := range acked {
		s.acked = append(s.acked, qc.AckedPacket{PacketNumber: p.pn, Bytes: p.bytes, SentTime: p.sent, MTUProbe: p.mtu})
		s.inFlight -= p.bytes
	}
	for _, p := range lost {
		s.lost = append(s.lost, qc.LostPacket{PacketNumber: p.pn, Bytes: p.bytes, SentTime: p.sent, MTUProbe: p.mtu, ByPTO: byPTO})
		s.inFlight -= p.bytes
	}
	s.c.OnEvent(&qc.Event{
		Time: s.now, PriorInFlight: prior, BytesInFlight: s.inFlight,
		Acked: s.acked, Lost: s.lost, ECNCongestion: ecn,
	})
}

// ackOldest acknowledges the oldest packet in flight one RTT after it was sent.
func (s *cubicSim) ackOldest(ecn bool) cubicSimPacket {
	p := s.pop()
	if due := p.sent.Add(s.rtt.srtt); due.After(s.now) {
		s.now = due
	}
	s.event([]cubicSimPacket{p}, nil, false, ecn)
	return p
}

// loseOldest declares the oldest packet in flight lost, now.
func (s *cubicSim) loseOldest(byPTO bool) cubicSimPacket {
	p := s.pop()
	s.event(nil, []cubicSimPacket{p}, byPTO, false)
	return p
}

// run sends and acknowledges until the clock reaches until.
func (s *cubicSim) run(until qc.Time, limit int) {
	for {
		s.fill(limit)
		if s.pending() == 0 || s.flight[s.head].sent.Add(s.rtt.srtt).After(until) {
			break
		}
		s.ackOldest(false)
	}
	if until.After(s.now) {
		s.now = until
	}
}

// slowStartTo runs slow start for the given number of round trips from a
// fresh controller: the window is then 32·2^rounds packets, all in flight.
func (s *cubicSim) slowStartTo(rounds int) {
	start := s.now
	s.run(start.Add(time.Duration(rounds)*s.rtt.srtt), 0)
	require.Equal(s.t, 32<<rounds*cubicTestMSS, s.c.CongestionWindow())
	require.True(s.t, s.c.InSlowStart())
}

func TestCubicInitialState(t *testing.T) {
	c := NewCubic(qc.Info{MaxDatagramSize: cubicTestMSS, RTT: &cubicFakeRTT{}})
	var _ qc.Controller = NewCubic(qc.Info{})
	require.Equal(t, 32*cubicTestMSS, c.CongestionWindow())
	require.True(t, c.InSlowStart())
	require.False(t, c.InRecovery())
	require.True(t, c.CanSend(32*cubicTestMSS-1))
	require.False(t, c.CanSend(32*cubicTestMSS))
	st := c.Stats()
	require.Equal(t, Cubic, st.Algorithm)
	require.Equal(t, "slow_start", st.State)
	require.Equal(t, 32*cubicTestMSS, st.CongestionWindowBytes)
	// No RTT sample yet: 100 ms, times 2 in slow start.
	require.InDelta(t, 2*32*cubicTestMSS/0.1, st.PacingRateBytesPerSecond, 1e-6)
	require.Zero(t, st.BandwidthBytesPerSecond)
}

func TestCubicFactory(t *testing.T) {
	ctrl := Factory(Cubic, Options{})(qc.Info{MaxDatagramSize: cubicTestMSS, RTT: &cubicFakeRTT{}})
	_, ok := ctrl.(*CubicController)
	require.True(t, ok)
	st, ok := StatsOf(ctrl)
	require.True(t, ok)
	require.Equal(t, Cubic, st.Algorithm)
}

func TestCubicSlowStartDoublesPerRTT(t *testing.T) {
	s := newCubicSim(t, 50*time.Millisecond)
	start := s.now
	for r := 1; r <= 6; r++ {
		s.run(start.Add(time.Duration(r)*s.rtt.srtt), 0)
		require.Equal(t, 32<<r*cubicTestMSS, s.c.CongestionWindow(), "round %d", r)
		require.True(t, s.c.InSlowStart())
		require.Equal(t, "slow_start", s.c.Stats().State)
	}
	// ACK-only packets do not disturb anything.
	s.sendACKOnly()
	require.Equal(t, 32<<6*cubicTestMSS, s.c.CongestionWindow())
}

func TestCubicLossReducesByBeta(t *testing.T) {
	s := newCubicSim(t, 50*time.Millisecond)
	s.slowStartTo(2)
	before := float64(s.c.CongestionWindow())
	s.now = s.now.Add(s.rtt.srtt)
	s.loseOldest(false)
	require.InDelta(t, 0.7*before, float64(s.c.CongestionWindow()), 1)
	require.True(t, s.c.InRecovery())
	require.False(t, s.c.InSlowStart())
	st := s.c.Stats()
	require.Equal(t, "recovery", st.State)
	require.Equal(t, s.c.CongestionWindow(), st.CongestionWindowBytes)
	// After slow start the pacing gain is 1.25.
	require.InDelta(t, 1.25*s.c.cwnd/0.05, st.PacingRateBytesPerSecond, 1e-3)
}

func TestCubicOneReductionPerRecoveryPeriod(t *testing.T) {
	s := newCubicSim(t, 50*time.Millisecond)
	s.slowStartTo(2)
	w0 := float64(s.c.CongestionWindow())
	s.now = s.now.Add(s.rtt.srtt)
	s.loseOldest(false)
	reduced := s.c.CongestionWindow()
	require.InDelta(t, 0.7*w0, float64(reduced), 1)

	// More losses of packets sent before the recovery period began, one per
	// event and several in one event, and an ECN-CE mark on such a packet.
	s.loseOldest(false)
	s.event(nil, []cubicSimPacket{s.pop(), s.pop(), s.pop()}, false, false)
	s.ackOldest(true)
	require.Equal(t, reduced, s.c.CongestionWindow())
	require.True(t, s.c.InRecovery())

	// ACKs of packets sent before the recovery period do not grow the window
	// nor end recovery.
	for s.pending() > 0 {
		s.ackOldest(false)
	}
	require.Equal(t, reduced, s.c.CongestionWindow())
	require.True(t, s.c.InRecovery())

	// A packet sent after the reduction is acknowledged: recovery ends.
	s.fill(0)
	s.ackOldest(false)
	require.False(t, s.c.InRecovery())
	require.False(t, s.c.InSlowStart())
	require.Equal(t, "congestion_avoidance", s.c.Stats().State)
	require.GreaterOrEqual(t, s.c.CongestionWindow(), reduced)

	// A loss of a packet sent after the reduction starts a new period, with
	// fast convergence: the window is below the last W_max.
	w1 := s.c.cwnd
	s.loseOldest(false)
	require.True(t, s.c.InRecovery())
	require.InDelta(t, 0.7*w1, s.c.cwnd, 1e-6)
	require.InDelta(t, w1*(1+0.7)/2, s.c.wMax, 1e-6)
}

func TestCubicNonCongestionLossesIgnored(t *testing.T) {
	s := newCubicSim(t, 50*time.Millisecond)
	probe := s.send(1400, true)
	s.fill(0)
	w := s.c.CongestionWindow()

	// A lost MTU probe says nothing about congestion.
	s.now = s.now.Add(s.rtt.srtt)
	require.Equal(t, probe, s.pop())
	s.event(nil, []cubicSimPacket{probe}, false, false)
	require.Equal(t, w, s.c.CongestionWindow())
	require.False(t, s.c.InRecovery())
	require.True(t, s.c.InSlowStart())

	// Nor do packets given up on by a probe timeout.
	s.now = s.now.Add(3 * s.rtt.srtt)
	s.event(nil, []cubicSimPacket{s.pop(), s.pop(), s.pop()}, true, false)
	require.Equal(t, w, s.c.CongestionWindow())
	require.False(t, s.c.InRecovery())
	require.True(t, s.c.InSlowStart())
	require.Equal(t, "slow_start", s.c.Stats().State)
}

func TestCubicECNCongestionReduces(t *testing.T) {
	s := newCubicSim(t, 50*time.Millisecond)
	s.slowStartTo(1)
	w := float64(s.c.CongestionWindow())
	// The ACK carrying the CE mark does not grow the window first.
	s.ackOldest(true)
	require.InDelta(t, 0.7*w, float64(s.c.CongestionWindow()), 1)
	require.True(t, s.c.InRecovery())
	// A loss in the same recovery period does not reduce again.
	s.loseOldest(false)
	require.InDelta(t, 0.7*w, float64(s.c.CongestionWindow()), 1)
}

// cubicAfterLoss runs slow start to 32·2^rounds packets, loses one packet,
// and runs until the first post-recovery ACK started the CUBIC epoch.
func cubicAfterLoss(t *testing.T, rtt time.Duration, rounds int) *cubicSim {
	s := newCubicSim(t, rtt)
	s.slowStartTo(rounds)
	s.now = s.now.Add(rtt)
	s.loseOldest(false)
	require.True(t, s.c.InRecovery())
	for s.c.InRecovery() {
		s.ackOldest(false)
		s.fill(0)
	}
	require.True(t, s.c.epochValid)
	require.Equal(t, s.now, s.c.epochStart)
	return s
}

func TestCubicGrowthReturnsToWMaxAtK(t *testing.T) {
	const rtt = 100 * time.Millisecond
	s := cubicAfterLoss(t, rtt, 5) // W_max = 1024 packets
	wMax := float64(1024 * cubicTestMSS)
	require.InDelta(t, wMax, s.c.wMax, 1e-6)
	// K = cbrt(W_max·(1-β)/C) in packets.
	k := math.Cbrt(1024 * (1 - 0.7) / 0.4)
	require.InDelta(t, k, s.c.k, 1e-6)
	epoch := s.c.epochStart
	at := func(sec float64) qc.Time { return epoch.Add(time.Duration(sec * float64(time.Second))) }

	// Concave: at K/2 the window is between the reduced one and W_max, close
	// to the curve.
	s.run(at(k/2), 0)
	w := float64(s.c.CongestionWindow())
	require.Greater(t, w, 0.9*wMax)
	require.Less(t, w, wMax)
	require.InEpsilon(t, s.c.wCubic(k/2), w, 0.02)

	// At K the window is back at W_max.
	s.run(at(k), 0)
	require.InEpsilon(t, wMax, float64(s.c.CongestionWindow()), 0.03)

	// Convex beyond: at 1.5 K it has gone well past W_max.
	s.run(at(1.5*k), 0)
	w = float64(s.c.CongestionWindow())
	require.Greater(t, w, 1.03*wMax)
	require.InEpsilon(t, s.c.wCubic(1.5*k), w, 0.03)
	require.Equal(t, "congestion_avoidance", s.c.Stats().State)
}

func TestCubicRenoFriendlyRegion(t *testing.T) {
	// A short RTT and a small window: Reno's additive increase outpaces the
	// cubic curve, and the window follows W_est.
	const rtt = 5 * time.Millisecond
	s := cubicAfterLoss(t, rtt, 1) // W_max = 64 packets
	s.run(s.c.epochStart.Add(500*time.Millisecond), 0)
	w := float64(s.c.CongestionWindow())
	require.Greater(t, w, s.c.wCubic(0.5)+2*cubicTestMSS)
	require.InDelta(t, s.c.wEst, s.c.cwnd, 1e-6)
	// W_est grows by 3(1-β)/(1+β) ≈ 0.53 packets per RTT from 44.8 packets
	// until it reaches the window before the reduction (64), then by one
	// packet per RTT (RFC 9438 section 4.3): 100 RTTs in all.
	alpha := 3 * (1 - 0.7) / (1 + 0.7)
	toPrior := (64 - 0.7*64) / alpha
	require.InDelta(t, 64+(100-toPrior), w/cubicTestMSS, 3)
}

func TestCubicAppLimitedDoesNotGrow(t *testing.T) {
	t.Run("slow start", func(t *testing.T) {
		s := newCubicSim(t, 50*time.Millisecond)
		// Two packets in flight at a time, for many round trips.
		s.run(s.now.Add(5*time.Second), 2*cubicTestMSS)
		require.Equal(t, 32*cubicTestMSS, s.c.CongestionWindow())
		require.True(t, s.c.InSlowStart())
		s.c.OnAppLimited(s.inFlight)
		require.Equal(t, 32*cubicTestMSS, s.c.CongestionWindow())
	})

	t.Run("congestion avoidance", func(t *testing.T) {
		const rtt = 100 * time.Millisecond
		s := cubicAfterLoss(t, rtt, 2) // W_max 128 packets, K ≈ 4.6 s
		s.run(s.now.Add(5*rtt), 0)
		// Drain to a small flight; a few ACKs at the start still see a full window.
		s.run(s.now.Add(rtt), 4*cubicTestMSS)
		w := s.c.CongestionWindow()
		epoch := s.c.epochStart
		s.c.OnAppLimited(s.inFlight)
		s.run(s.now.Add(10*time.Second), 4*cubicTestMSS)
		require.Equal(t, w, s.c.CongestionWindow(), "grew while app-limited")
		// The cubic clock stood still meanwhile.
		require.InDelta(t, float64(10*time.Second), float64(s.c.epochStart.Sub(epoch)), float64(2*rtt))
		// Back to a full window: growth continues along the curve rather
		// than jumping to where 10 s later on it would be.
		s.run(s.now.Add(2*rtt), 0)
		require.Greater(t, s.c.CongestionWindow(), w)
		require.Less(t, float64(s.c.CongestionWindow()), 1.15*float64(w))
	})
}

func TestCubicMinimumWindow(t *testing.T) {
	s := newCubicSim(t, 50*time.Millisecond)
	for range 40 {
		// Each loss is of a packet sent after the previous reduction.
		p := s.send(cubicTestMSS, false)
		s.now = s.now.Add(s.rtt.srtt)
		for s.pending() > 1 {
			s.ackOldest(false)
		}
		require.Equal(t, p, s.pop())
		s.event(nil, []cubicSimPacket{p}, false, false)
		require.GreaterOrEqual(t, s.c.CongestionWindow(), 2*cubicTestMSS)
	}
	require.Equal(t, 2*cubicTestMSS, s.c.CongestionWindow())
	require.True(t, s.c.CanSend(cubicTestMSS))
	require.False(t, s.c.CanSend(2*cubicTestMSS))
}

func TestCubicMaximumWindow(t *testing.T) {
	s := newCubicSim(t, 10*time.Millisecond)
	c := s.c
	// Acknowledge far more than the maximum in slow start, in big events.
	for range 12 {
		s.fill(0)
		var batch []cubicSimPacket
		for s.pending() > 0 {
			batch = append(batch, s.pop())
		}
		s.now = s.now.Add(s.rtt.srtt)
		s.event(batch, nil, false, false)
	}
	require.Equal(t, 10000*cubicTestMSS, c.CongestionWindow())
}

func TestCubicSetMaxDatagramSize(t *testing.T) {
	s := newCubicSim(t, 50*time.Millisecond)
	c := s.c
	for _, d := range []int{1452, 1200, 1500, 0, -1, 1, 65527, 1200} {
		require.NotPanics(t, func() { c.SetMaxDatagramSize(d) })
		require.GreaterOrEqual(t, c.CongestionWindow(), 2*c.datagram)
		require.Equal(t, c.datagram, c.pace.datagram)
		require.Positive(t, c.datagram)
	}

	// Down to the minimum window at 1200 bytes, then the size goes down and
	// up: the minimum is rescaled and the controller keeps working.
	for range 30 {
		p := s.send(cubicTestMSS, false)
		require.Equal(t, p, s.pop())
		s.event(nil, []cubicSimPacket{p}, false, false)
	}
	require.Equal(t, 2*1200, c.CongestionWindow())
	c.SetMaxDatagramSize(1000)
	require.Equal(t, 2*1200, c.CongestionWindow())
	require.Equal(t, 1000, c.pace.datagram)
	c.SetMaxDatagramSize(1500)
	require.Equal(t, 2*1500, c.CongestionWindow())
	require.Equal(t, 1500, c.pace.datagram)
	require.GreaterOrEqual(t, c.Stats().CongestionWindowBytes, 2*1500)

	// Growth still works after the change.
	s.fill(0)
	s.now = s.now.Add(s.rtt.srtt)
	for s.pending() > 0 {
		s.ackOldest(false)
	}
	require.GreaterOrEqual(t, c.CongestionWindow(), 2*1500)
	require.False(t, c.InRecovery())
}

func TestCubicPacing(t *testing.T) {
	r := &cubicFakeRTT{srtt: 100 * time.Millisecond, minRTT: 100 * time.Millisecond}
	c := NewCubic(qc.Info{RTT: r, MaxDatagramSize: cubicTestMSS})
	rate := 2 * float64(32*cubicTestMSS) / 0.1 // slow start: 768 kB/s
	require.InDelta(t, rate, c.Stats().PacingRateBytesPerSecond, 1e-6)

	t0 := qc.Time(time.Second)
	require.True(t, c.HasPacingBudget(t0))
	require.Zero(t, c.TimeUntilSend(0))

	// A burst of 10 packets leaves at once, then the bucket is empty.
	sent := 0
	for pn := int64(0); c.HasPacingBudget(t0); pn++ {
		c.OnPacketSent(qc.SentPacket{Time: t0, PacketNumber: pn, Bytes: cubicTestMSS, BytesInFlight: (sent + 1) * cubicTestMSS, AckEliciting: true})
		sent++
		require.Less(t, sent, 100)
	}
	require.Equal(t, 10, sent)
	require.False(t, c.HasPacingBudget(t0))
	require.False(t, c.HasPacingBudget(t0.Add(time.Millisecond)))

	// The next packet may leave one packet's time at the pacing rate later.
	next := c.TimeUntilSend(sent * cubicTestMSS)
	wait := next.Sub(t0)
	want := time.Duration(cubicTestMSS / rate * float64(time.Second))
	require.InDelta(t, float64(want), float64(wait), float64(time.Microsecond))
	require.False(t, c.HasPacingBudget(next.Add(-100*time.Microsecond)))
	require.True(t, c.HasPacingBudget(next.Add(time.Microsecond)))

	// After a long pause the bucket holds a burst again, not more.
	later := t0.Add(time.Second)
	n := 0
	for pn := int64(100); c.HasPacingBudget(later); pn++ {
		c.OnPacketSent(qc.SentPacket{Time: later, PacketNumber: pn, Bytes: cubicTestMSS, AckEliciting: true})
		n++
		require.Less(t, n, 100)
	}
	require.Equal(t, 10, n)

	// A faster path paces faster.
	r.srtt = 10 * time.Millisecond
	require.InDelta(t, 10*rate, c.pacingRate(), 1e-6)
}

func TestCubicStatsConcurrent(t *testing.T) {
	s := newCubicSim(t, 20*time.Millisecond)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st := s.c.Stats()
			if st.Algorithm != Cubic || st.CongestionWindowBytes < 2*cubicTestMSS {
				panic("bad stats")
			}
		}
	}()
	s.slowStartTo(3)
	s.loseOldest(false)
	s.run(s.now.Add(time.Second), 0)
	s.c.SetMaxDatagramSize(1400)
	s.run(s.now.Add(100*time.Millisecond), 0)
	close(stop)
	wg.Wait()
	require.Equal(t, s.c.CongestionWindow(), s.c.Stats().CongestionWindowBytes)
}

func TestCubicNoAllocationsPerPacket(t *testing.T) {
	s := cubicAfterLoss(t, 50*time.Millisecond, 3)
	s.run(s.now.Add(time.Second), 0)
	c := s.c
	acked := make([]qc.AckedPacket, 1)
	ev := &qc.Event{Acked: acked}
	pn := s.nextPN + 1000
	now := s.now
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		c.OnPacketSent(qc.SentPacket{Time: now, PacketNumber: pn, Bytes: cubicTestMSS, BytesInFlight: c.CongestionWindow(), AckEliciting: true})
		acked[0] = qc.AckedPacket{PacketNumber: pn, Bytes: cubicTestMSS, SentTime: now}
		ev.Time, ev.PriorInFlight, ev.BytesInFlight = now, c.CongestionWindow(), c.CongestionWindow()-cubicTestMSS
		c.OnEvent(ev)
		_ = c.HasPacingBudget(now)
		_ = c.TimeUntilSend(0)
		_ = c.CanSend(0)
		pn++
	})
	require.Zero(t, allocs)
}
