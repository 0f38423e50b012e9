package congestion

import (
	"math/rand/v2"
	"time"

	qc "github.com/quic-go/quic-go/congestion"
)

// fakeRTT is a qc.RTTStats the tests set by hand.
type fakeRTT struct{ min, smoothed, latest time.Duration }

func (r *fakeRTT) MinRTT() time.Duration        { return r.min }
func (r *fakeRTT) SmoothedRTT() time.Duration   { return r.smoothed }
func (r *fakeRTT) LatestRTT() time.Duration     { return r.latest }
func (r *fakeRTT) MeanDeviation() time.Duration { return 0 }

// linkSim drives a controller over an emulated path in virtual time: a
// bottleneck of rate bytes/s with a FIFO of queue bytes (tail drop), a fixed
// one-way delay each way, random loss, an ACK for every second packet and
// packet-threshold loss detection, as a QUIC sender sees it.
type linkSim struct {
	c        qc.Controller
	rtt      *fakeRTT
	now      qc.Time
	rate     float64
	oneWay   time.Duration
	loss     float64
	queue    int
	rng      *rand.Rand
	datagram int

	// appLimit, when set, is the sending rate of the application (bytes/s).
	appLimit  float64
	appBudget float64

	nextPN    int64
	inflight  int
	linkFree  qc.Time
	pending   []simPkt // in packet number order
	lostWait  []simPkt // dropped, not yet detected
	delivered int      // bytes acknowledged
	lostBytes int
	// rounds counts ACK events; capRounds those after which a BBR
	// controller's in-flight cap was below one BDP (it limited throughput).
	rounds, capRounds int
}

type simPkt struct {
	pn      int64
	bytes   int
	sent    qc.Time
	arrive  qc.Time // ACK back at the sender; zero if lost
	dropped bool
}

func newLinkSim(c qc.Controller, rtt *fakeRTT, rate float64, oneWay time.Duration, loss float64, queuePackets int) *linkSim {
	return &linkSim{
		c: c, rtt: rtt, now: qc.Time(time.Second), rate: rate, oneWay: oneWay, loss: loss,
		queue: queuePackets * 1252, rng: rand.New(rand.NewPCG(1, 2)), datagram: 1252,
	}
}

func (s *linkSim) send() {
	size := s.datagram
	s.nextPN++
	s.inflight += size
	s.c.OnPacketSent(qc.SentPacket{Time: s.now, PacketNumber: s.nextPN, Bytes: size, BytesInFlight: s.inflight, AckEliciting: true})
	p := simPkt{pn: s.nextPN, bytes: size, sent: s.now}
	start := s.now
	if s.linkFree.After(s.now) {
		start = s.linkFree
	}
	backlog := int(start.Sub(s.now).Seconds() * s.rate)
	switch {
	case backlog+size > s.queue:
		p.dropped = true
	case s.rng.Float64() < s.loss:
		p.dropped = true
		s.linkFree = start.Add(time.Duration(float64(size) / s.rate * 1e9))
	default:
		s.linkFree = start.Add(time.Duration(float64(size) / s.rate * 1e9))
		p.arrive = s.linkFree.Add(2 * s.oneWay)
	}
	s.pending = append(s.pending, p)
}

// run advances virtual time by d, sending whenever the controller allows.
func (s *linkSim) run(d time.Duration) {
	end := s.now.Add(d)
	for s.now.Before(end) {
		s.deliverAcks()
		for s.c.CanSend(s.inflight) && s.c.HasPacingBudget(s.now) && s.appHasData() {
			s.send()
		}
		if !s.appHasData() && s.c.CanSend(s.inflight) {
			s.c.OnAppLimited(s.inflight)
		}
		next := end
		for _, p := range s.pending {
			if !p.dropped {
				if p.arrive.Before(next) {
					next = p.arrive
				}
				break
			}
		}
		if s.c.CanSend(s.inflight) {
			if t := s.c.TimeUntilSend(s.inflight); t.After(s.now) && t.Before(next) {
				next = t
			} else if !t.After(s.now) && !s.c.HasPacingBudget(s.now) {
				next = min(next, s.now.Add(100*time.Microsecond))
			}
		}
		if s.appLimit > 0 {
			next = min(next, s.now.Add(time.Millisecond))
		}
		if next == end && len(s.pending)+len(s.lostWait) > 0 {
			// Only lost packets are left: quic-go's probe timeout would
			// find them; declare them lost after about two round trips.
			if pto := s.now.Add(2 * max(s.rtt.smoothed, time.Millisecond)); pto.Before(end) {
				s.now = pto
				s.declareTailLost()
				continue
			}
		}
		if !next.After(s.now) {
			next = s.now.Add(time.Microsecond)
		}
		if s.appLimit > 0 {
			s.appBudget = min(s.appBudget+s.appLimit*next.Sub(s.now).Seconds(), 64*1024)
		}
		s.now = next
	}
}

func (s *linkSim) appHasData() bool {
	return s.appLimit == 0 || s.appBudget >= float64(s.datagram)
}

func (s *linkSim) deliverAcks() {
	ev := qc.Event{Time: s.now, PriorInFlight: s.inflight}
	var largest int64 = -1
	// The link is a FIFO: ACKs come back in packet number order, so only the
	// front of pending can be due. Dropped packets wait in lostWait until a
	// packet three numbers later is acknowledged.
	i := 0
	for ; i < len(s.pending); i++ {
		p := s.pending[i]
		if p.dropped {
			s.lostWait = append(s.lostWait, p)
			continue
		}
		if p.arrive.After(s.now) {
			break
		}
		ev.Acked = append(ev.Acked, qc.AckedPacket{PacketNumber: p.pn, Bytes: p.bytes, SentTime: p.sent})
		s.inflight -= p.bytes
		s.delivered += p.bytes
		largest = p.pn
		s.rtt.latest = s.now.Sub(p.sent)
		if s.rtt.min == 0 || s.rtt.latest < s.rtt.min {
			s.rtt.min = s.rtt.latest
		}
		s.rtt.smoothed = s.rtt.latest
	}
	s.pending = s.pending[i:]
	if len(ev.Acked) == 0 {
		return
	}
	keep := s.lostWait[:0]
	for _, p := range s.lostWait {
		if p.pn+3 <= largest {
			ev.Lost = append(ev.Lost, qc.LostPacket{PacketNumber: p.pn, Bytes: p.bytes, SentTime: p.sent})
			s.inflight -= p.bytes
			s.lostBytes += p.bytes
			continue
		}
		keep = append(keep, p)
	}
	s.lostWait = keep
	ev.BytesInFlight = s.inflight
	s.c.OnEvent(&ev)
	s.rounds++
	if b, ok := s.c.(*BBRController); ok && b.inflightHi > 0 && b.inflightHi < b.bdp(1) {
		s.capRounds++
	}
}

func (s *linkSim) declareTailLost() {
	ev := qc.Event{Time: s.now, PriorInFlight: s.inflight}
	for _, p := range append(s.lostWait, s.pending...) {
		ev.Lost = append(ev.Lost, qc.LostPacket{PacketNumber: p.pn, Bytes: p.bytes, SentTime: p.sent})
		s.inflight -= p.bytes
		s.lostBytes += p.bytes
	}
	s.pending, s.lostWait = s.pending[:0], s.lostWait[:0]
	ev.BytesInFlight = s.inflight
	s.c.OnEvent(&ev)
}

// goodput runs for d and returns the acknowledged bytes per second.
func (s *linkSim) goodput(d time.Duration) float64 {
	before := s.delivered
	s.run(d)
	return float64(s.delivered-before) / d.Seconds()
}
