package congestion

import (
	"testing"
	"time"

	qc "github.com/quic-go/quic-go/congestion"
	"github.com/stretchr/testify/require"
)

// receiverSim drives the controller of the receiving side of a bulk
// transfer on loopback, as quic-go does: an ACK-only packet for every
// other data packet, sent whether or not the pacer has budget, a PING with
// every 20th ACK, and a 60 B window update (MAX_STREAM_DATA) due every
// millisecond, which waits for the pacer and the window. Each packet is
// followed by an application-limited report (unless noReports), and the
// data sender acknowledges the ack-eliciting packets one RTT later.
type receiverSim struct {
	b *BBRController
	// noReports: quic-go returns from its send loop without an
	// application-limited report when more received packets wait (a busy
	// receiver), so a report may never come.
	noReports bool
	now       qc.Time
	rtt       time.Duration
	pn        int64
	inFlight  int
	acks      []qc.AckedPacket // ack-eliciting packets not yet acknowledged
	ackCount  int
	updateDue qc.Time // a window update waits since then; 0: none
	// worstUpdateDelay is the longest a window update waited for the
	// pacer (or the window), sent or still waiting.
	worstUpdateDelay time.Duration
}

func (s *receiverSim) send(bytes int, ackEliciting bool) {
	s.pn++
	if ackEliciting {
		s.inFlight += bytes
		s.acks = append(s.acks, qc.AckedPacket{PacketNumber: s.pn, Bytes: bytes, SentTime: s.now})
	}
	s.b.OnPacketSent(qc.SentPacket{Time: s.now, PacketNumber: s.pn, Bytes: bytes, BytesInFlight: s.inFlight, AckEliciting: ackEliciting})
	if !s.noReports {
		s.b.OnAppLimited(s.inFlight)
	}
}

// run simulates d in steps of 10 us: a data packet arrives every step
// (1,250 B per 10 us: 1 Gbit/s), a window update is due every ms.
func (s *receiverSim) run(d time.Duration) {
	const step = 10 * time.Microsecond
	for end := s.now.Add(d); s.now < end; s.now = s.now.Add(step) {
		// the sender's acknowledgements of what left an RTT ago
		var acked []qc.AckedPacket
		for len(s.acks) > 0 && s.now.Sub(s.acks[0].SentTime) >= s.rtt {
			acked = append(acked, s.acks[0])
			s.inFlight -= s.acks[0].Bytes
			s.acks = s.acks[1:]
		}
		if len(acked) > 0 {
			s.b.OnEvent(&qc.Event{Time: s.now, PriorInFlight: s.inFlight + sumBytes(acked), BytesInFlight: s.inFlight, Acked: acked})
		}
		if s.updateDue == 0 && s.now%qc.Time(time.Millisecond) == 0 {
			s.updateDue = s.now
		}
		if s.updateDue != 0 {
			s.worstUpdateDelay = max(s.worstUpdateDelay, s.now.Sub(s.updateDue))
		}
		if s.updateDue != 0 && s.b.CanSend(s.inFlight) && s.b.HasPacingBudget(s.now) {
			s.updateDue = 0
			s.send(60, true)
		}
		if s.now%qc.Time(2*step) == 0 { // an ACK for every other data packet
			s.ackCount++
			ping := s.ackCount%20 == 0 && s.b.CanSend(s.inFlight) && s.b.HasPacingBudget(s.now)
			s.send(45, ping)
		}
	}
}

func sumBytes(a []qc.AckedPacket) int {
	n := 0
	for _, p := range a {
		n += p.Bytes
	}
	return n
}

// TestBBRReceiverKeepsItsWindowUpdatesFlowing: the receiving side of a
// bulk transfer sends ACKs, PINGs and window updates only. Its estimate
// must not fall to what those few bytes measure, and its window updates
// must not wait behind its ACKs: before, one pair of control packets a
// fraction of a millisecond apart counted as a sample of the path and
// replaced an estimate of hundreds of Mbit/s, the ACKs (charged to the
// bucket, unmeasured) then took all of the pacing rate, and the window
// updates left every 10-25 ms: loopback bulk through the tunnel ran at
// 1 Gbit/s instead of 2-3 for the rest of the connection (bench loopback,
// "slow pairs").
func TestBBRReceiverKeepsItsWindowUpdatesFlowing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		noReports bool
	}{{"reported application limited", false}, {"no reports (a busy receiver)", true}} {
		t.Run(tc.name, func(t *testing.T) {
			b := receiverAt(100 * mbit) // a first exchange gave the model of the path
			s := &receiverSim{b: b, now: qc.Time(time.Second), rtt: 200 * time.Microsecond, noReports: tc.noReports}
			s.run(2 * time.Second)
			require.Greater(t, b.round, int64(1000), "rounds simulated")
			require.Greater(t, b.Stats().BandwidthBytesPerSecond, 50*mbit,
				"control frames are no sample of the path (estimate %.2f Mbit/s)", b.Stats().BandwidthBytesPerSecond/mbit)
			require.LessOrEqual(t, s.worstUpdateDelay, time.Millisecond, "a window update waited for the pacer")
		})
	}
}

// receiverAt is a bbr in ProbeBW on a 200 us path whose bandwidth estimate
// is bw (bytes per second), as the receiving side of a transfer is after
// its first exchange.
func receiverAt(bw float64) *BBRController {
	b, rtt := newTestBBR(Options{})
	rtt.min, rtt.smoothed, rtt.latest = 200*time.Microsecond, 200*time.Microsecond, 200*time.Microsecond
	b.state, b.filledPipe, b.pacingGain, b.cwndGainNow = bbrProbeBW, true, 1, cwndGain
	b.minRTT, b.minRTTTime = 200*time.Microsecond, qc.Time(time.Second)
	b.bwSlots[0], b.maxBW = bw, bw
	b.setPacingRate()
	b.setCwnd(0)
	return b
}

// TestBBRReceiverWithALowEstimateStillSendsWindowUpdates: whatever the
// estimate (the floor here), ACK-only packets do not take the budget of the
// ack-eliciting ones: quic-go sends them regardless and they are never
// measured.
func TestBBRReceiverWithALowEstimateStillSendsWindowUpdates(t *testing.T) {
	b := receiverAt(0.5 * mbit)
	s := &receiverSim{b: b, now: qc.Time(time.Second), rtt: 200 * time.Microsecond}
	s.run(500 * time.Millisecond)
	require.LessOrEqual(t, s.worstUpdateDelay, time.Millisecond, "a window update waited for the pacer")
}

// ACK-only packets leave the pacer's bucket as it was.
func TestBBRDoesNotPaceACKOnlyPackets(t *testing.T) {
	b, _ := newTestBBR(Options{})
	b.maxBW, b.bwSlots[0], b.filledPipe, b.minRTT = 1*mbit, 1*mbit, true, time.Millisecond
	b.setPacingRate()
	now := qc.Time(time.Second)
	sendOne(b, now, 1)
	for pn := int64(2); pn < 1000; pn++ {
		b.OnPacketSent(qc.SentPacket{Time: now, PacketNumber: pn, Bytes: 45, BytesInFlight: datagram})
	}
	require.True(t, b.HasPacingBudget(now), "45 kB of ACKs took the budget of a 1 Mbit/s pacer")
	require.Zero(t, b.TimeUntilSend(0))
}

// A packet short of a datagram, with no full one sent for a round trip, is
// application limited at once, reported or not, however soon it follows
// the one before: two control frames 20 us apart are not a sample of the
// path. The short end of a bulk write, right after full datagrams, is not
// (and a writer's lull is judged as before,
// TestBBRAppLimitedOnlyAfterAnIdleGap).
func TestBBRAppLimitedShortPackets(t *testing.T) {
	b, _ := newTestBBR(Options{})
	b.minRTT, b.pacingRate = 200*time.Microsecond, 12.5e6
	now := qc.Time(time.Second)
	b.OnPacketSent(qc.SentPacket{Time: now, PacketNumber: 1, Bytes: 60, BytesInFlight: 60, AckEliciting: true})
	require.True(t, b.pkts.get(1).appLimited, "60 bytes, nothing before")
	b.appLimitedUntil = 0
	now = now.Add(20 * time.Microsecond)
	b.OnPacketSent(qc.SentPacket{Time: now, PacketNumber: 2, Bytes: 45, BytesInFlight: 105, AckEliciting: true})
	require.True(t, b.pkts.get(2).appLimited, "45 bytes 20 us later, no report")

	b, _ = newTestBBR(Options{})
	b.minRTT, b.pacingRate = 200*time.Microsecond, 12.5e6
	for pn := int64(1); pn <= 3; pn++ {
		sendOne(b, now, pn)
	}
	b.OnPacketSent(qc.SentPacket{Time: now, PacketNumber: 4, Bytes: 700, BytesInFlight: 3*datagram + 700, AckEliciting: true})
	require.False(t, b.pkts.get(4).appLimited, "the end of a write, after full datagrams")
	b.OnAppLimited(3*datagram + 700)
	now = now.Add(20 * time.Microsecond)
	sendOne(b, now, 5)
	require.Zero(t, b.appLimitedUntil, "a lull of 20 us between writes")
	now = now.Add(time.Millisecond + time.Microsecond)
	b.OnPacketSent(qc.SentPacket{Time: now, PacketNumber: 6, Bytes: 60, BytesInFlight: 5*datagram + 760, AckEliciting: true})
	require.True(t, b.pkts.get(6).appLimited, "60 bytes, no full datagram for a millisecond")
}
