// Package congestion holds quictun's congestion controllers. They plug into
// quic-go through the hook our patch set adds (quic.Config.Congestion,
// package github.com/quic-go/quic-go/congestion; see third_party/quic-go).
//
//   - bbr (default): model-based (BBR v1's state machine: startup, drain,
//     probe_bw with eight-phase gain cycling, probe_rtt), paces at the
//     measured bottleneck bandwidth and keeps about two bandwidth-delay
//     products in flight. Loss below LossThreshold per round trip is taken as
//     random, not as congestion: it neither lowers the window nor the
//     bandwidth estimate (lost bytes count as carried while no queue has built
//     up), so a lossy link is used at close to its rate. A round with more
//     loss than that caps bytes in flight (BBRv3's inflight_hi); clean rounds
//     lift the cap again.
//   - cubic: RFC 9438 CUBIC with RFC 9002 recovery and this package's pacer.
//   - reno: quic-go's built-in NewReno, untouched (Factory returns nil).
//
// Controllers are driven by one connection's run loop; Stats may be called
// from any goroutine. The package imports nothing of quictun.
package congestion
