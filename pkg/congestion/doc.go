// Package congestion holds quictun's congestion controllers. They plug into
// quic-go through the hook our patch set adds (quic.Config.Congestion,
// package github.com/quic-go/quic-go/congestion; see third_party/quic-go).
//
//   - bbr (default): model-based (BBR v1's state machine: startup, drain,
//     probe_bw with eight-phase gain cycling, probe_rtt), paces at the
//     measured bottleneck bandwidth and keeps about two bandwidth-delay
//     products in flight. Loss below LossThreshold per round trip is taken
//     as random, not as congestion, unless a queue that is not bbr's own
//     shows (the RTT stays up through a whole gain cycle, drain phase
//     included); the estimate is divided by (1 - random loss rate), so a
//     lossy link is used at close to its rate. Congestive loss caps bytes in
//     flight (BBRv3's inflight_hi); the cap grows back by a packet per round
//     beside other flows and doubles back when alone.
//   - cubic: RFC 9438 CUBIC with RFC 9002 recovery and this package's pacer.
//   - reno: quic-go's built-in NewReno, untouched (Factory returns nil).
//
// Controllers are driven by one connection's run loop; Stats may be called
// from any goroutine. The package imports nothing of quictun.
package congestion
