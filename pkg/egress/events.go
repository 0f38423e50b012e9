package egress

import (
	"time"

	"github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/pkg/udpflow"
)

// Events are what a Handler reports as it serves streams, named by what
// happened; the label values are the ones this package and those it uses
// define (proto.Code names, endpoint refusal reasons, Auth* and
// ReplayUnrecorded* below, udpflow drop reasons). The daemon's metrics
// implement them (metrics.Server: quictun_server_*, and on the client
// quictun_client_reverse_*), NopEvents ignores them. Hellos and checks are
// no tunnels: of them only AuthFailed and ReplayUnrecorded are reported.
type Events interface {
	// TunnelOpened and TunnelClosed report a spliced TCP or unix tunnel:
	// the tunnel.Registry reports them as it runs it.
	tunnel.Metrics
	// The UDP flows: their opens and ends, drops, packets, and the bytes
	// their queues hold.
	udpflow.Events
	// StreamFailed reports a tunnel stream (TCP, unix or UDP) reset with
	// code, the name of its proto.Code, before it was spliced or relayed.
	StreamFailed(code string)
	// AuthFailed reports a stream header that failed shared-secret
	// authentication, or whose client certificate the auth hook refused,
	// by reason (AuthFailureReasons); the connection is closed (not for
	// AuthHookUnavailable).
	AuthFailed(reason string)
	// DestinationRefused reports a destination the rules (or the checked
	// dialer) refused, by network (tcp, udp, unix) and reason
	// (endpoint.RefusalReasons).
	DestinationRefused(network, reason string)
	// ReplayUnrecorded reports a verified header whose nonce the replay
	// cache did not record, by reason (ReplayUnrecordedReasons).
	ReplayUnrecorded(reason string)
	// ReplayCacheSize reports the nonces the replay cache holds, at each
	// change.
	ReplayCacheSize(n int)
	// Dialed reports how long a dial to a destination took, failed or not.
	Dialed(d time.Duration)
	// UDPSocketBuffers reports a change of the receive buffers of the UDP
	// flows' sockets to their destinations (as the kernel books them).
	UDPSocketBuffers(delta float64)
}

// Reasons a stream header failed shared-secret authentication
// (Events.AuthFailed).
const (
	// AuthNoMAC: the header carries no MAC (the client has no secret).
	AuthNoMAC = "no_mac"
	// AuthUnknownKey: the key ID names no key the Handler holds (a wrong
	// secret, or a key removed in a rotation).
	AuthUnknownKey = "unknown_key"
	// AuthBadMAC: the key ID matches but the MAC does not.
	AuthBadMAC = "bad_mac"
	// AuthHookUnavailable: the key ID is not the server's, or the client
	// presented a certificate, and the auth hook (Config.KeyHook,
	// Config.CertHook) did not answer, was busy, or answered what the
	// server refuses: the stream was refused with overloaded (its
	// connection is not closed).
	AuthHookUnavailable = "hook_unavailable"
	// AuthHookRefused: the auth hook said no (403 or 404) to the client's
	// certificate (Config.CertHook): the stream was refused with
	// auth_failed and its connection closed.
	AuthHookRefused = "hook_refused"
)

// AuthFailureReasons lists the reasons of Events.AuthFailed, for
// pre-creating metric labels.
func AuthFailureReasons() []string {
	return []string{AuthNoMAC, AuthUnknownKey, AuthBadMAC, AuthHookUnavailable, AuthHookRefused}
}

// Reasons a verified header's nonce was not recorded in the replay cache
// (Events.ReplayUnrecorded).
const (
	// ReplayUnrecordedCacheFull: the cache holds its MaxReplayEntries (1-RTT
	// streams up to three quarters of them).
	ReplayUnrecordedCacheFull = "cache_full"
	// ReplayUnrecordedConnQuota: the connection recorded its
	// MaxReplayEntriesPerConn.
	ReplayUnrecordedConnQuota = "conn_quota"
)

// ReplayUnrecordedReasons lists the reasons of Events.ReplayUnrecorded, for
// pre-creating metric labels.
func ReplayUnrecordedReasons() []string {
	return []string{ReplayUnrecordedCacheFull, ReplayUnrecordedConnQuota}
}

// NopEvents is an Events that reports nothing.
type NopEvents struct {
	tunnel.NopMetrics
	udpflow.NopEvents
}

// StreamFailed implements Events.
func (NopEvents) StreamFailed(string) {}

// AuthFailed implements Events.
func (NopEvents) AuthFailed(string) {}

// DestinationRefused implements Events.
func (NopEvents) DestinationRefused(string, string) {}

// ReplayUnrecorded implements Events.
func (NopEvents) ReplayUnrecorded(string) {}

// ReplayCacheSize implements Events.
func (NopEvents) ReplayCacheSize(int) {}

// Dialed implements Events.
func (NopEvents) Dialed(time.Duration) {}

// UDPSocketBuffers implements Events.
func (NopEvents) UDPSocketBuffers(float64) {}
