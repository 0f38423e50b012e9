// Package congestion holds quictun's congestion controllers. They plug into
// quic-go through the hook our patch set adds (quic.Config.Congestion,
// package github.com/quic-go/quic-go/congestion; see third_party/quic-go).
//
//   - bbr (default): model-based (BBR v1's state machine: startup, drain,
//     probe_bw with eight-phase gain cycling, probe_rtt), paces at the
//     measured bottleneck bandwidth and keeps about two bandwidth-delay
//     products in flight.
//
// # How bbr tells random loss from congestion
//
// A path that loses 10-50 % of its packets at random (radio, satellite,
// long-haul links: quictun's purpose) loses about that share in every round
// trip, so no per-round loss rate can tell it from a full queue. bbr uses
// the signals random loss does not move:
//   - A queue. Congestive loss comes with a queue that is not bbr's own: the
//     least RTT of a whole gain cycle, drain phase included (which empties
//     bbr's own queue), and of the round stays above 1.5 times the path's
//     minimum. Beside such a queue, loss beyond the random rate is
//     congestion, and bbr backs off as the loss-based flow that fills it.
//   - Loss that rises with what is in flight. Where the buffer is too
//     shallow for a queue to show as delay, overflow comes when bbr sends
//     beyond its BDP (ProbeBW's up phase): a round that had more than the
//     BDP in flight and lost significantly more than the random rate (three
//     standard deviations of a binomial draw, widened by the estimate's own
//     error: it is a sample too, and early on or at 30 % loss a few points
//     off) is congestion.
//   - The random rate is measured only on packets sent below the model
//     (ProbeBW's down phase, ProbeRTT, while the window leaves room: a
//     sender held by its cap keeps a shallow buffer full whatever its
//     pacing), where no bottleneck overflows, as a packet-weighted moving
//     average. Measured on every packet, the overflow
//     of a shallow buffer would pass for random loss, raise the estimate,
//     the estimate the pacing rate, and the pacing rate the overflow.
//
// Congestive rounds cap bytes in flight at 0.7 of what was in flight
// (BBRv3's inflight_hi); the cap grows back by a packet per round, as a
// Reno or Cubic flow beside it regrows, for 64 rounds or 2.5 s after the
// last congestive round (whichever ends first: BBRv3's bound on how long
// it cruises before it probes again) and while a queue shows; after that
// it doubles each clean round. A shallow queue shows no delay to say it is
// shared: doubling at once took it back from a kernel Cubic flow within
// ten rounds (on the bench's 30 ms queue Cubic kept 16-21 % of the link). The bandwidth estimate is the
// delivery rate divided by (1 - random loss rate), at most Options.
// LossThreshold (75 %), which is also the loss rate beyond which a round is
// congestion whatever the queue shows. Startup never ends on loss alone
// (its overshoot and a lossy path both lose): it ends on the bandwidth
// plateau or when its own queue shows through two whole rounds. quic-go
// reports the sender application limited whenever it finds nothing to
// pack, also between two writes of a bulk sender; bbr counts it only when
// the sender then stays idle for over a millisecond or an eighth of the RTT,
// whichever is shorter (or four packets at the
// pacing rate), so that such lulls do not keep Startup from ending. A
// sender whose ack-eliciting packet is short of a datagram, with no full
// one for a round trip, is application limited at once (it had less than a
// packet to send), and ACK-only packets are not paced (quic-go sends them
// anyway; they are never measured): the receiving side of a transfer, which
// sends only ACKs, window updates and PINGs, keeps its estimate and its
// window updates flowing. Before, a few of its control packets replaced
// the estimate with a few hundred kbit/s, the ACKs took all of that pacing
// rate, and the sender waited for credit (loopback bulk at 1 Gbit/s
// instead of 2.5).
//
// The figures (pkg/congestion TestHeavyLossSimnet, 100 Mbit/s, 25 ms RTT,
// random loss both ways): 20 % loss moved 3.7 Mbit/s before this, 30 %
// 1.7, 50 % nothing; now about 93-98 at 1-30 % and 50-90 at 50 % (the loss
// is before the bottleneck, as netem and tools/linkem drop). The client also
// starts its receive windows at their maximum (transport.QUICOptions.
// FullReceiveWindows): at 50 % loss the holes hold the receiver's reads, the
// windows never grow from 512 KiB, and the sender waits.
//
// # Tail copies
//
// A request's or a reply's last packets have no later packet whose
// acknowledgement reveals their loss soon; a lost one waits for a probe
// timeout, or for the next packet's acknowledgement and 9/8 RTT. bbr
// measures the share of all its packets lost (about the last 100, Stats.
// PacketLoss) and asks quic-go (patch 0011, congestion.TailCopier) for
// copies of the last packets with stream data (up to 4, each sent within
// the delay of the one before) once the sender runs dry: as many copies of
// each as bring its loss to 2 % (1 above 2 %, 2 above 14 %, 3 above 27 %),
// an eighth of the minimum RTT after the last (1-10 ms), none while a
// congestive round is recent. A bulk sender's next packet follows sooner,
// so it sends none. In the simulator (TestTailCopiesShortExchangesAtHeavyLoss,
// 30 % loss each way, RTT 100 ms) a 16 B request with a 1000 B reply takes
// 116 ms instead of 227 on average.
//
//   - cubic: RFC 9438 CUBIC with RFC 9002 recovery and this package's pacer.
//   - reno: quic-go's built-in NewReno, untouched (Factory returns nil).
//
// Controllers are driven by one connection's run loop; Stats may be called
// from any goroutine. The package imports nothing of quictun.
package congestion
