package congestion

import (
	"math"
	"sync"
	"time"

	qc "github.com/quic-go/quic-go/congestion"
)

// BBR parameters. The model and state machine follow BBR as described in
// draft-cardwell-iccrg-bbr-congestion-control (v1), with Linux's extra_acked,
// and two changes taken from draft-ietf-ccwg-bbr (v3): ProbeRTT keeps half a
// BDP in flight rather than four packets, and congestive loss caps bytes in
// flight (inflight_hi). Ours: loss is congestive above a threshold, or when a
// queue that is not bbr's own shows; otherwise it is random, and the estimate
// is scaled up by the random loss rate. That is what keeps a randomly lossy
// link busy. Written from the drafts; no code was copied.
const (
	startupGain         = 2.885 // 2/ln(2): doubles the delivery rate each round
	drainGain           = 1 / startupGain
	cwndGain            = 2.0
	probeUpGain         = 1.25
	probeDownGain       = 0.75
	pacingMargin        = 0.01 // pace 1 % below the estimate to keep queues drained
	fullBWGrowth        = 1.25
	fullBWRounds        = 3
	bwWindowRounds      = 10
	minRTTWindow        = 10 * time.Second
	probeRTTDuration    = 200 * time.Millisecond
	lossBeta            = 0.7
	rttJumpFactor       = 4
	rttJumpRoundsNeeded = 3
	startupQueueRounds  = 2
	renoRounds          = 64
	renoTime            = 2500 * time.Millisecond
	// appLimitedGap is the least idle time after which a sender that had
	// nothing to send counts as application limited (settleAppLimited).
	appLimitedGap = time.Millisecond
	// minBelowSample is how many packets sent below the model make a sample
	// of the random loss rate.
	minBelowSample   = 16
	initialWindow    = 32 // packets, as quic-go
	minWindowPackets = 4
	maxWindowPackets = 10000 // as quic-go
	initialRTT       = 100 * time.Millisecond
	// minPacingInterval bounds the pacing rate from below at a datagram
	// per this interval (about 96 kbit/s at 1,200 bytes): an estimate
	// gone wrong can slow the sender, never silence it (the congestion
	// window still bounds what is in flight on a slower path).
	minPacingInterval = 100 * time.Millisecond
)

var probeBWGains = [...]float64{probeUpGain, probeDownGain, 1, 1, 1, 1, 1, 1}

type bbrState uint8

const (
	bbrStartup bbrState = iota
	bbrDrain
	bbrProbeBW
	bbrProbeRTT
)

func (s bbrState) String() string {
	switch s {
	case bbrStartup:
		return "startup"
	case bbrDrain:
		return "drain"
	case bbrProbeBW:
		return "probe_bw"
	default:
		return "probe_rtt"
	}
}

// BBRController is quictun's BBR. Create it with NewBBR.
type BBRController struct {
	rtt           qc.RTTStats
	lossThreshold float64
	datagram      int

	pkts ring
	pace pacer

	// delivery-rate estimator (connection state)
	delivered       int64
	deliveredTime   qc.Time
	firstSentTime   qc.Time
	appLimitedUntil int64 // delivered count up to which samples are app-limited; 0: none
	// An application-limited report waiting for the next packet
	// (settleAppLimited), and when the last ack-eliciting packet went out.
	appLimitedPending  bool
	appLimitedInflight int
	lastSentTime       qc.Time
	// lastFullSent is when the last ack-eliciting packet of a full
	// datagram went out (markSmallPacket).
	lastFullSent     qc.Time
	bytesInFlight    int
	lastSampleAppLtd bool

	// round trips
	round              int64
	nextRoundDelivered int64
	roundDelivered     int // bytes acknowledged in the current round
	roundLost          int // bytes lost in the current round
	roundLostPackets   int
	roundAckedPackets  int
	roundMaxInFlight   int
	roundMinRTT        time.Duration
	// cycleMinRTT is the least RTT sample of the current ProbeBW gain cycle,
	// lastCycleMinRTT that of the last completed one. A cycle includes the
	// phase that drains bbr's own queue: if even then the RTT stays above
	// the minimum, the queue is another flow's.
	cycleMinRTT, lastCycleMinRTT time.Duration
	cycleDrained                 bool // the current cycle had its drain (0.75) phase
	// rttJumpRounds counts consecutive rounds whose every RTT sample was
	// above rttJumpFactor times the minimum: the path got longer.
	rttJumpRounds int
	// startupQueueRounds counts consecutive Startup rounds whose every RTT
	// sample showed a queue (checkStartupQueue).
	startupQueueRounds int
	lossRate           float64 // of the last completed round
	// randomLoss is the path's random loss rate: lost over sent packets in
	// rounds that show no queue and do not probe beyond the model,
	// exponentially weighted by packet count (lossLost, lossSent), so the
	// first such round gives a full estimate and each later one counts as
	// many packets as it had.
	randomLoss         float64
	lossLost, lossSent float64
	// loss is the share of all ack-eliciting packets lost (TailCopies).
	loss packetLoss
	// belowSent and belowLost count the reported packets that were sent
	// below the model, since the last sample (learnRandomLoss).
	belowSent, belowLost int

	// model
	bwSlots    [bwWindowRounds]float64
	bwSlotRnd  [bwWindowRounds]int64
	maxBW      float64 // bytes/s
	minRTT     time.Duration
	minRTTTime qc.Time

	// state machine
	state             bbrState
	pacingGain        float64
	cwndGainNow       float64
	cycleIndex        int
	cycleStart        qc.Time
	filledPipe        bool
	fullBW            float64
	fullBWCount       int
	probeRTTDoneTime  qc.Time
	probeRTTRoundDone bool
	priorCwnd         int

	// ACK aggregation (Linux BBR's extra_acked): how far ACKs ran ahead of
	// the estimated bandwidth, max over two windows of 5 rounds; the window
	// makes room for it, or bursty ACKs (Wi-Fi, delayed ACKs, busy hosts)
	// would starve the sender.
	ackEpochStart  qc.Time
	ackEpochAcked  int
	extraAcked     [2]int
	extraAckedIdx  int
	extraAckedRnds int

	cwnd       int
	pacingRate float64
	inflightHi int // 0: no cap
	hiGrowth   int // packets added to inflightHi per round while probing
	// lastCongestion is when the last congestive round ended (its round
	// number and time): for renoRounds rounds or renoTime after it,
	// whichever ends first, the cap grows by a packet per round only.
	lastCongestionRound int64
	lastCongestionTime  qc.Time
	congestiveRounds    int64

	mu    sync.Mutex
	stats Stats
}

var _ qc.Controller = (*BBRController)(nil)

// NewBBR returns a BBR controller for a connection.
func NewBBR(info qc.Info, o Options) *BBRController {
	th := o.LossThreshold
	if th <= 0 {
		th = DefaultLossThreshold
	}
	b := &BBRController{
		rtt:           info.RTT,
		lossThreshold: th,
		datagram:      datagramSize(info),
		pace:          newPacer(datagramSize(info)),
		state:         bbrStartup,
		pacingGain:    startupGain,
		cwndGainNow:   startupGain,
	}
	b.cwnd = initialWindow * b.datagram
	b.setPacingRate()
	b.publish()
	return b
}

func (b *BBRController) minWindow() int { return minWindowPackets * b.datagram }

// bdp is the estimated bandwidth-delay product times gain; 0 without a model.
func (b *BBRController) bdp(gain float64) int {
	if b.maxBW == 0 || b.minRTT == 0 {
		return 0
	}
	return int(gain * b.bw() * b.minRTT.Seconds())
}

// OnPacketSent implements qc.Controller.
func (b *BBRController) OnPacketSent(p qc.SentPacket) {
	b.bytesInFlight = p.BytesInFlight
	if !p.AckEliciting {
		// An ACK-only packet is not paced: quic-go sends it whether or not
		// the bucket has budget, and it is never acknowledged, so it is in
		// no delivery-rate sample. Charged to the bucket, the ACKs of the
		// receiving side of a bulk transfer (thousands a second) took the
		// budget of its window updates whenever its rate was low; those
		// went out late, their samples measured what the ACKs left, and
		// the estimate fell to the floor: the sender waited for credit
		// (loopback bulk 1 Gbit/s instead of 2-3). Linux does not pace
		// pure ACKs either.
		return
	}
	b.pace.sent(p.Time, p.Bytes, b.pacingRate)
	b.settleAppLimited(p.Time)
	b.markSmallPacket(p)
	b.lastSentTime = p.Time
	if p.BytesInFlight-p.Bytes <= 0 || b.deliveredTime.IsZero() {
		// Nothing was in flight, or nothing was ever delivered: the next
		// delivery-rate interval starts now. quic-go reports 1-RTT packets
		// only but counts the handshake's in flight, so a connection's
		// first 1-RTT packets leave with bytes in flight this controller
		// never saw. Left at zero, the first sample's interval ran from
		// quic-go's clock origin, an hour before the process started, and
		// measured a bandwidth of a few bytes per hour: on every
		// connection, and when Startup ended on it (small exchanges whose
		// later samples fell under the minimum RTT), the pacing rate was
		// 0.02 B/s and the connection went silent for hours.
		b.firstSentTime, b.deliveredTime = p.Time, p.Time
	}
	b.pkts.add(p.PacketNumber, sentState{
		appLimited:    b.appLimitedUntil != 0,
		belowModel:    b.sendingBelowModel(p.BytesInFlight),
		bytes:         p.Bytes,
		txInFlight:    p.BytesInFlight,
		delivered:     b.delivered,
		deliveredTime: b.deliveredTime,
		firstSentTime: b.firstSentTime,
		sentTime:      p.Time,
	})
}

// OnAppLimited implements qc.Controller. quic-go reports the connection
// application limited whenever it finds nothing to pack, which also happens
// for a moment between two writes of an application that writes as fast as
// it can (a stream holds one Write's data at a time). Such a lull costs
// nothing and its samples are the path's; marking them kept bbr in Startup
// for a whole download on a lossy path (Startup ends on samples that are
// not application limited). So the report is held until the next packet:
// only a sender that then stayed idle longer than appLimitedGap is marked
// (settleAppLimited).
func (b *BBRController) OnAppLimited(bytesInFlight int) {
	b.appLimitedPending, b.appLimitedInflight = true, bytesInFlight
}

// markSmallPacket marks the sender application limited when it sends an
// ack-eliciting packet short of a full datagram and sent no full one for a
// round trip (at least appLimitedGap): it had less than a datagram to send
// (Linux's rule: less than a segment queued), with or without a report.
// Such a sender sends control frames or small writes: the receiving side of
// a bulk transfer sends only ACKs, window updates and PINGs, a fraction of a
// millisecond apart when they follow one another, and quic-go reports
// nothing when it returns to read the next packets first. Taken for samples
// of the path, a few dozen bytes per round trip replaced an estimate of
// hundreds of Mbit/s with 0.3 Mbit/s, and the receiver's window updates
// were paced at that. A bulk sender's short packet (the end of a write)
// follows full ones and counts as before.
func (b *BBRController) markSmallPacket(p qc.SentPacket) {
	if p.Bytes >= b.datagram {
		b.lastFullSent = p.Time
		return
	}
	if b.lastFullSent.IsZero() || p.Time.Sub(b.lastFullSent) > max(b.minRTT, appLimitedGap) {
		b.appLimitedUntil = max(b.delivered+int64(p.BytesInFlight), 1)
	}
}

// settleAppLimited decides a pending application-limited report when the
// next ack-eliciting packet goes out at now.
func (b *BBRController) settleAppLimited(now qc.Time) {
	if !b.appLimitedPending {
		return
	}
	b.appLimitedPending = false
	gap := 4 * time.Duration(float64(b.datagram)/max(b.pacingRate, 1)*float64(time.Second))
	// At most an eighth of the path's RTT: on loopback (RTT ~0.2 ms) a
	// lull of 1 ms is five round trips of a sender with nothing to send,
	// and counting its samples as the path's held bulk to 1.1 Gbit/s
	// (2.9 with every report counted at once).
	idle := appLimitedGap
	if b.minRTT > 0 {
		idle = min(idle, b.minRTT/8)
	}
	if b.lastSentTime.IsZero() || now.Sub(b.lastSentTime) > max(gap, idle) {
		b.appLimitedUntil = max(b.delivered+int64(b.appLimitedInflight), 1)
	}
}

// SetMaxDatagramSize implements qc.Controller.
func (b *BBRController) SetMaxDatagramSize(s int) {
	if s <= 0 {
		return
	}
	b.datagram = s
	b.pace.datagram = s
	b.cwnd = max(b.cwnd, b.minWindow())
	b.publish()
}

// OnEvent implements qc.Controller.
func (b *BBRController) OnEvent(e *qc.Event) {
	b.bytesInFlight = e.BytesInFlight
	b.roundMaxInFlight = max(b.roundMaxInFlight, e.PriorInFlight)

	// The most recently sent of the acknowledged packets gives the sample.
	var cand sentState
	var haveCand bool
	var ackedBytes int
	var rttSample time.Duration
	for i := range e.Acked {
		a := &e.Acked[i]
		s := b.pkts.get(a.PacketNumber)
		if s == nil {
			continue
		}
		b.delivered += int64(s.bytes)
		b.deliveredTime = e.Time
		ackedBytes += s.bytes
		b.roundAckedPackets++
		b.loss.add(false)
		if s.belowModel {
			b.belowSent++
		}
		if !haveCand || s.delivered >= cand.delivered {
			cand, haveCand = *s, true
		}
		b.pkts.remove(s)
	}
	if n := len(e.Acked); n > 0 {
		rttSample = e.Time.Sub(e.Acked[n-1].SentTime)
	}
	b.countLost(e.Lost)
	b.roundDelivered += ackedBytes
	if b.appLimitedUntil != 0 && b.delivered > b.appLimitedUntil {
		b.appLimitedUntil = 0
	}

	roundStart := false
	if haveCand {
		b.firstSentTime = cand.sentTime
		if cand.delivered >= b.nextRoundDelivered {
			b.nextRoundDelivered = b.delivered
			b.round++
			roundStart = true
		}
		b.sampleBandwidth(cand)
	}
	if rttSample > 0 {
		b.updateMinRTT(e.Time, rttSample)
		if b.cycleMinRTT == 0 || rttSample < b.cycleMinRTT {
			b.cycleMinRTT = rttSample
		}
		if b.roundMinRTT == 0 || rttSample < b.roundMinRTT {
			b.roundMinRTT = rttSample
		}
	}
	if roundStart {
		b.endRound()
	}
	b.updateAckAggregation(e.Time, roundStart, ackedBytes)
	b.updateState(e, roundStart, ackedBytes)
	b.setPacingRate()
	b.setCwnd(ackedBytes)
	b.publish()
}

// countLost forgets the lost packets and counts them in the round's loss
// (and, sent below the model, in the random-loss sample); MTU probes and
// packets declared lost by a probe timeout are not the path's loss.
func (b *BBRController) countLost(lost []qc.LostPacket) {
	for i := range lost {
		l := &lost[i]
		below := false
		if s := b.pkts.get(l.PacketNumber); s != nil {
			below = s.belowModel
			b.pkts.remove(s)
			if !l.MTUProbe {
				b.loss.add(true) // a packet given up by a probe timeout too: a lost tail
			}
		}
		if l.MTUProbe || l.ByPTO {
			continue
		}
		if below {
			b.belowSent++
			b.belowLost++
		}
		b.roundLost += l.Bytes
		b.roundLostPackets++
	}
}

func (b *BBRController) updateAckAggregation(now qc.Time, roundStart bool, acked int) {
	if acked == 0 || b.maxBW == 0 {
		return
	}
	if roundStart {
		if b.extraAckedRnds++; b.extraAckedRnds >= 5 {
			b.extraAckedRnds = 0
			b.extraAckedIdx ^= 1
			b.extraAcked[b.extraAckedIdx] = 0
		}
	}
	expected := int(b.bw() * now.Sub(b.ackEpochStart).Seconds())
	if b.ackEpochStart.IsZero() || b.ackEpochAcked <= expected || b.ackEpochAcked+acked >= 1<<30 {
		b.ackEpochStart, b.ackEpochAcked, expected = now, 0, 0
	}
	b.ackEpochAcked += acked
	extra := min(b.ackEpochAcked-expected, b.cwnd)
	b.extraAcked[b.extraAckedIdx] = max(b.extraAcked[b.extraAckedIdx], extra)
}

// sampleBandwidth computes the delivery rate since cand was sent and feeds
// the max filter (an app-limited sample only when it raises the maximum).
func (b *BBRController) sampleBandwidth(cand sentState) {
	sendElapsed := cand.sentTime.Sub(cand.firstSentTime)
	ackElapsed := b.deliveredTime.Sub(cand.deliveredTime)
	interval := max(sendElapsed, ackElapsed)
	b.lastSampleAppLtd = cand.appLimited
	// An interval shorter than the path's RTT is ACK compression, not
	// bandwidth (Linux BBR drops these too): such samples overestimate the
	// bottleneck, and a pacing rate above it builds a standing queue.
	if interval <= 0 || (b.minRTT > 0 && interval < b.minRTT) || cand.firstSentTime.IsZero() || cand.deliveredTime.IsZero() {
		return
	}
	delivered := float64(b.delivered - cand.delivered)
	bw := delivered / interval.Seconds()
	if cand.appLimited && bw < b.maxBW {
		return
	}
	slot := b.round % bwWindowRounds
	if b.bwSlotRnd[slot] != b.round {
		b.bwSlotRnd[slot], b.bwSlots[slot] = b.round, 0
	}
	b.bwSlots[slot] = max(b.bwSlots[slot], bw)
	b.recomputeMaxBW()
}

// bw is the model's bottleneck bandwidth: the delivery-rate filter's
// maximum, divided by the share of packets that random loss (loss without a
// queue) takes. Lost packets crossed the bottleneck, or would have, as
// delivered ones did; without this, random loss p drives the pacing rate to
// (1-p)² of the link (each round paces at what was delivered, and delivers
// that less p). Applied to the filter's output rather than to each sample,
// so that noisy samples are not amplified.
func (b *BBRController) bw() float64 {
	return b.maxBW / (1 - min(b.randomLoss, b.lossThreshold))
}

// recomputeMaxBW takes the maximum over the last bwWindowRounds rounds. It
// runs only when a sample enters the filter, so that while the sender is
// application limited (samples that are not fed) the estimate is kept, not
// aged out: an interactive lull must not forget the path.
func (b *BBRController) recomputeMaxBW() {
	m := 0.0
	for i, v := range b.bwSlots {
		if b.round-b.bwSlotRnd[i] < bwWindowRounds {
			m = max(m, v)
		}
	}
	b.maxBW = m
}

func (b *BBRController) updateMinRTT(now qc.Time, sample time.Duration) {
	expired := b.minRTT != 0 && now.Sub(b.minRTTTime) > minRTTWindow
	if b.minRTT == 0 || sample <= b.minRTT || expired {
		b.minRTT, b.minRTTTime = sample, now
	}
	if expired && b.state != bbrProbeRTT {
		// Drain the queue for a moment so that the next samples see the path's own RTT.
		b.enterProbeRTT()
	}
}

// endRound closes the loss accounting of a round trip and tells random loss
// from congestion. Random loss is independent of how much bbr sends and
// needs no queue; congestive loss comes with a queue that is not bbr's own
// (the RTT stayed up through the last gain cycle, whose drain phase empties
// bbr's queue, and through this round), or, where the buffer is too shallow
// for a queue to show, rises with what is in flight: a round that pushed
// beyond the model's BDP and lost significantly more than the random rate.
// Only such rounds count as congestion; they cap bytes in flight at 0.7 of
// what was in flight, and each later round raises the cap (as BBRv3's
// inflight_hi and its probe-up). A round's loss rate says nothing alone: at
// 30 % random loss every round loses about 30 %.
func (b *BBRController) endRound() {
	total := b.roundDelivered + b.roundLost
	b.lossRate = 0
	if total > 0 {
		b.lossRate = float64(b.roundLost) / float64(total)
	}
	queued := b.queueAt(b.lastCycleMinRTT, 3, 2) && b.queueAt(b.roundMinRTT, 3, 2)
	b.checkStartupQueue()
	sent := b.roundAckedPackets + b.roundLostPackets
	tooMuchLoss := b.congestiveRound(queued, sent)
	// Below-model packets are a clean sample only while no queue shows at
	// all: a queue filled by another flow drops them too (a shallow one
	// drains between that flow's losses, so the gain cycle may not show it).
	b.learnRandomLoss(queued || b.queueAt(b.roundMinRTT, 5, 4))
	switch {
	case tooMuchLoss:
		base := b.roundMaxInFlight
		if b.inflightHi > 0 {
			base = min(base, b.inflightHi)
		}
		b.inflightHi = max(int(lossBeta*float64(base)), b.minWindow())
		b.hiGrowth = 1
		b.lastCongestionRound, b.lastCongestionTime = b.round, b.deliveredTime
		b.congestiveRounds++
		if b.state == bbrProbeBW && b.pacingGain > 1 {
			b.advanceCycle(b.deliveredTime)
		}
	case b.inflightHi > 0 && (b.queueAt(b.lastCycleMinRTT, 3, 2) || b.recentCongestion()):
		// Sharing a queue with other flows: raise the cap by a packet per
		// round, as Reno and Cubic's friendly region do, so that the flows
		// converge to their shares instead of bbr taking the queue back.
		b.inflightHi += b.datagram
		b.hiGrowth = 1
	case b.inflightHi > 0:
		// A clean round: raise the cap, twice as much as last round, so that
		// it is gone after about ten clean rounds unless loss comes back.
		b.inflightHi += b.hiGrowth * b.datagram
		b.hiGrowth = min(2*b.hiGrowth, 1<<16)
		if t := b.bdp(cwndGain); t > 0 && b.inflightHi > t+3*b.datagram {
			b.inflightHi = 0 // above what the model wants: no longer a limit
		}
	}
	b.roundDelivered, b.roundLost, b.roundLostPackets, b.roundAckedPackets = 0, 0, 0, 0
	// A path that became much longer (a reroute, or a link that was fast
	// when the connection started) leaves a stale minimum RTT that makes the
	// window a fraction of the new BDP for up to 10 s. No queue of another
	// flow multiplies the RTT by rttJumpFactor (a queue as deep as 3 BDP
	// does not), so after a few such rounds the old minimum is dropped.
	if b.minRTT > 0 && b.roundMinRTT > rttJumpFactor*b.minRTT {
		if b.rttJumpRounds++; b.rttJumpRounds >= rttJumpRoundsNeeded {
			b.minRTT, b.minRTTTime = b.roundMinRTT, b.deliveredTime
			b.rttJumpRounds = 0
		}
	} else {
		b.rttJumpRounds = 0
	}
	b.roundMaxInFlight = b.bytesInFlight
	b.roundMinRTT = 0
}

// recentCongestion tells whether the last congestive round is recent:
// within renoRounds rounds or renoTime, whichever ends first (BBRv3's
// bound on how long it cruises before probing again, so that it probes no
// faster than a Reno or Cubic flow beside it regrows). Until then the cap
// grows as theirs does, a packet per round; a shallow queue shows no delay
// to say it is shared, so the doubling regrowth would take the queue back
// from them within ten rounds.
func (b *BBRController) recentCongestion() bool {
	return b.lastCongestionRound > 0 && b.round-b.lastCongestionRound < renoRounds &&
		b.deliveredTime.Sub(b.lastCongestionTime) < renoTime
}

// sendingBelowModel tells whether a packet sent now with inFlight bytes in
// flight goes below bbr's model of the path (ProbeBW's down phase,
// ProbeRTT), where no bottleneck overflows. ProbeRTT holds half a BDP in
// flight. The down phase paces below the estimate, but a sender held by its
// window (the cap after congestion is 0.7 of what was in flight, which may
// be more than the BDP) keeps the same bytes in flight, and a shallow
// buffer as full, as before: its packets are below the model only while
// the window leaves room (an eighth). (Not inFlight <= BDP: at 50 % loss
// the lost packets stay in flight until declared lost, and no packet would
// qualify.)
func (b *BBRController) sendingBelowModel(inFlight int) bool {
	if b.state == bbrProbeRTT {
		return true
	}
	return b.state == bbrProbeBW && b.pacingGain < 1 && inFlight < b.cwnd-b.cwnd/8
}

// learnRandomLoss folds the fate of the packets sent below the model into
// the estimate of the path's random loss, once there are enough of them
// (minBelowSample), unless a queue that is not bbr's own shows (its
// overflow is not the path's). Only such packets
// count: loss of packets sent at or above the model may be the overflow
// of a buffer too shallow to show as delay, and taken for random loss it
// would raise the estimate, the estimate the pacing rate, and the pacing
// rate the overflow, without end. Packets sent below the model are lost
// at the path's random rate alone.
func (b *BBRController) learnRandomLoss(queued bool) {
	if b.belowSent < minBelowSample {
		return
	}
	if !queued {
		const keep = 3.0 / 4 // per sample (one ProbeBW cycle): about the last four cycles
		b.lossLost = b.lossLost*keep + float64(b.belowLost)
		b.lossSent = b.lossSent*keep + float64(b.belowSent)
		b.randomLoss = b.lossLost / b.lossSent
	}
	b.belowSent, b.belowLost = 0, 0
}

// checkStartupQueue ends Startup once its own queue shows through whole
// rounds (every RTT sample of startupQueueRounds rounds in a row is half the
// minimum above it): the pipe is full. The bandwidth plateau, Startup's other
// exit, may never come where the sender is limited by flow control at times
// (samples marked application-limited do not count), as on a path that loses
// half its packets, whose holes hold the receiver's window.
func (b *BBRController) checkStartupQueue() {
	if b.state != bbrStartup {
		return
	}
	// As the plateau, only while the sender fills the pipe: a sender that
	// is application limited (a client sending window updates beside a
	// download) sees the queue of the other direction's data, not a full
	// pipe of its own.
	if b.lastSampleAppLtd || !b.queueAt(b.roundMinRTT, 3, 2) {
		b.startupQueueRounds = 0
		return
	}
	if b.startupQueueRounds++; b.startupQueueRounds >= startupQueueRounds {
		b.filledPipe = true
	}
}

// congestiveRound tells whether the round that ends lost packets to
// congestion: sent packets were acknowledged or declared lost in it. In
// Startup loss never ends the round's growth by itself (the bandwidth
// plateau does): Startup overshoots by design, and on a randomly lossy path
// its loss is the path's.
func (b *BBRController) congestiveRound(queued bool, sent int) bool {
	if b.state == bbrStartup || b.roundLostPackets == 0 || sent == 0 {
		return false
	}
	if b.lossRate > b.lossThreshold {
		return true // more than any random loss bbr accepts
	}
	// Loss beyond the random rate: more than its expectation plus z
	// standard deviations of a binomial draw of sent packets.
	p := b.randomLoss
	expected := p * float64(sent)
	sd := math.Sqrt(expected * (1 - p))
	switch {
	case queued:
		// Beside a foreign queue, loss over the random rate is the
		// queue's: back off as the loss-based flow that fills it does.
		return float64(b.roundLostPackets) > expected+sd
	case b.lossSent > 0 && b.roundMaxInFlight > b.bdp(1)+3*b.datagram:
		// No queue shows, but bbr pushed beyond its BDP: loss that rises
		// with inflight is a buffer too shallow to show as delay (judged
		// once the random rate has been measured). The estimate is itself
		// a sample (of lossSent packets), so its error counts too: early
		// on, or at 30 % loss, a round judged against a rate a few points
		// low looks congestive (in the simulator at 30 %, four such rounds
		// in the first two seconds). The rate is taken with one loss and
		// one delivery added (Laplace), never 0 from a short clean sample.
		p := (b.lossLost + 1) / (b.lossSent + 2)
		expected := p * float64(sent)
		sd := math.Sqrt(expected * (1 - p) * (1 + float64(sent)/b.lossSent))
		return float64(b.roundLostPackets) > expected+3*sd+2
	}
	return false
}

// queueAt tells whether rtt, the least RTT sample of a round, shows a queue:
// it exceeds num/den of the minimum RTT plus a millisecond. The least sample
// is used because ACK delay and jitter raise single samples, while a queue
// at the bottleneck raises all of them.
func (b *BBRController) queueAt(rtt time.Duration, num, den time.Duration) bool {
	return b.minRTT > 0 && rtt > 0 && rtt > b.minRTT*num/den+time.Millisecond
}

func (b *BBRController) updateState(e *qc.Event, roundStart bool, ackedBytes int) {
	if roundStart && !b.filledPipe && !b.lastSampleAppLtd {
		if b.maxBW >= b.fullBW*fullBWGrowth {
			b.fullBW, b.fullBWCount = b.maxBW, 0
		} else if b.fullBWCount++; b.fullBWCount >= fullBWRounds {
			b.filledPipe = true
		}
	}
	switch b.state {
	case bbrStartup:
		if b.filledPipe {
			b.state, b.pacingGain, b.cwndGainNow = bbrDrain, drainGain, startupGain
		}
	case bbrDrain:
		if t := b.bdp(1); t > 0 && e.BytesInFlight <= t {
			b.enterProbeBW(e.Time)
		}
	case bbrProbeBW:
		if b.phaseDone(e) {
			b.advanceCycle(e.Time)
		}
	case bbrProbeRTT:
		b.handleProbeRTT(e.Time, roundStart)
	}
	// Drain may finish on the same ACK that filled the pipe.
	if b.state == bbrDrain {
		if t := b.bdp(1); t > 0 && e.BytesInFlight <= t {
			b.enterProbeBW(e.Time)
		}
	}
}

func (b *BBRController) enterProbeBW(now qc.Time) {
	b.state, b.cwndGainNow = bbrProbeBW, cwndGain
	// Start in a random phase other than the one that drains (as BBR does),
	// from a deterministic source: the delivered count.
	b.cycleIndex = 2 + int(b.delivered/int64(max(b.datagram, 1)))%(len(probeBWGains)-2)
	b.cycleMinRTT, b.cycleDrained = 0, false
	b.pacingGain = probeBWGains[b.cycleIndex]
	b.cycleStart = now
}

func (b *BBRController) phaseDone(e *qc.Event) bool {
	full := e.Time.Sub(b.cycleStart) > b.minRTT
	switch {
	case b.pacingGain > 1:
		return full && (len(e.Lost) > 0 || e.PriorInFlight >= b.bdp(b.pacingGain))
	case b.pacingGain < 1:
		return full || e.PriorInFlight <= b.bdp(1)
	default:
		return full
	}
}

func (b *BBRController) advanceCycle(now qc.Time) {
	b.cycleIndex = (b.cycleIndex + 1) % len(probeBWGains)
	switch b.cycleIndex {
	case 0:
		// only a cycle that drained bbr's own queue says whose a queue is
		if b.cycleDrained {
			b.lastCycleMinRTT = b.cycleMinRTT
		}
		b.cycleMinRTT, b.cycleDrained = 0, false
	case 1:
		b.cycleDrained = true
	}
	b.pacingGain = probeBWGains[b.cycleIndex]
	b.cycleStart = now
}

func (b *BBRController) enterProbeRTT() {
	b.priorCwnd = max(b.priorCwnd, b.cwnd)
	b.state, b.pacingGain, b.cwndGainNow = bbrProbeRTT, 1, 1
	b.probeRTTDoneTime, b.probeRTTRoundDone = 0, false
}

func (b *BBRController) probeRTTCwnd() int {
	return max(b.bdp(0.5), b.minWindow())
}

func (b *BBRController) handleProbeRTT(now qc.Time, roundStart bool) {
	if b.probeRTTDoneTime.IsZero() {
		if b.bytesInFlight <= b.probeRTTCwnd() {
			b.probeRTTDoneTime = now.Add(max(probeRTTDuration, b.minRTT))
			b.probeRTTRoundDone = false
			b.nextRoundDelivered = b.delivered
		}
		return
	}
	if roundStart {
		b.probeRTTRoundDone = true
	}
	if b.probeRTTRoundDone && now.After(b.probeRTTDoneTime) {
		b.minRTTTime = now
		b.cwnd = max(b.cwnd, b.priorCwnd)
		b.priorCwnd = 0
		if b.filledPipe {
			b.enterProbeBW(now)
		} else {
			b.state, b.pacingGain, b.cwndGainNow = bbrStartup, startupGain, startupGain
		}
	}
}

func (b *BBRController) setPacingRate() {
	if b.maxBW == 0 {
		srtt := initialRTT
		if b.rtt != nil && b.rtt.SmoothedRTT() > 0 {
			srtt = b.rtt.SmoothedRTT()
		}
		b.pacingRate = b.pacingGain * float64(b.cwnd) / srtt.Seconds()
		return
	}
	rate := b.pacingGain * b.bw() * (1 - pacingMargin)
	if b.filledPipe || rate > b.pacingRate {
		b.pacingRate = max(rate, float64(b.datagram)/minPacingInterval.Seconds())
	}
}

func (b *BBRController) setCwnd(ackedBytes int) {
	target := b.bdp(b.cwndGainNow)
	if target > 0 {
		target += 3 * b.sendQuantum() // room for send batches
		if b.filledPipe {
			// at most half a BDP (or four send batches where the BDP is
			// tiny, as on loopback): more only builds a standing queue
			target += min(max(b.extraAcked[0], b.extraAcked[1]), max(b.bdp(0.5), 4*b.sendQuantum()))
		}
	}
	switch {
	case target == 0:
		// no model yet: grow as slow start does
		b.cwnd = min(b.cwnd+ackedBytes, maxWindowPackets*b.datagram)
	case b.filledPipe:
		b.cwnd = min(b.cwnd+ackedBytes, target)
	case b.cwnd < target || b.delivered < int64(initialWindow*b.datagram):
		b.cwnd += ackedBytes
	}
	b.cwnd = max(b.cwnd, b.minWindow())
	if b.state == bbrProbeRTT {
		b.cwnd = min(b.cwnd, b.probeRTTCwnd())
	}
	if b.inflightHi > 0 {
		b.cwnd = max(min(b.cwnd, b.inflightHi), b.minWindow())
	}
}

// sendQuantum is the size of the batches the sender emits (quic-go packs up
// to 64 KiB per GSO send): the pacing rate's worth of 1 ms, at least two
// packets, at most 64 KiB, as Linux sizes TSO bursts. On paths whose RTT is
// mostly end-host processing (loopback, a LAN) the BDP is tiny and these
// batches, not the BDP, must fit in the window.
func (b *BBRController) sendQuantum() int {
	return min(max(int(b.pacingRate/1000), 2*b.datagram), 64<<10)
}

// CanSend implements qc.Controller.
func (b *BBRController) CanSend(bytesInFlight int) bool { return bytesInFlight < b.cwnd }

// HasPacingBudget implements qc.Controller.
func (b *BBRController) HasPacingBudget(now qc.Time) bool {
	return b.pace.hasBudget(now, b.pacingRate)
}

// TimeUntilSend implements qc.Controller.
func (b *BBRController) TimeUntilSend(int) qc.Time { return b.pace.timeUntilSend(b.pacingRate) }

// CongestionWindow implements qc.Controller.
func (b *BBRController) CongestionWindow() int { return b.cwnd }

// InSlowStart implements qc.Controller: BBR's Startup.
func (b *BBRController) InSlowStart() bool { return b.state == bbrStartup }

// InRecovery implements qc.Controller: BBR has no loss recovery state.
func (b *BBRController) InRecovery() bool { return false }

func (b *BBRController) publish() {
	b.mu.Lock()
	b.stats = Stats{
		Algorithm:                BBR,
		State:                    b.state.String(),
		CongestionWindowBytes:    b.cwnd,
		PacingRateBytesPerSecond: b.pacingRate,
		BandwidthBytesPerSecond:  b.bw(),
		MinRTT:                   b.minRTT,
		InflightCap:              b.inflightHi,
		LossRate:                 b.lossRate,
		RandomLoss:               b.randomLoss,
		PacketLoss:               b.loss.rate,
		RoundTrips:               b.round,
		CongestiveRoundTrips:     b.congestiveRounds,
	}
	b.mu.Unlock()
}

// Stats implements StatsReporter; safe for concurrent use.
func (b *BBRController) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}
