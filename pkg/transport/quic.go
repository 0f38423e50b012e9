package transport

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/quictun/quictun/pkg/congestion"
)

// QUICOptions are the tunables of a QUIC connection that quictun exposes.
type QUICOptions struct {
	// IdleTimeout closes a connection that received nothing for this long. It
	// bounds how long a blackout the tunnel survives; both ends must agree.
	IdleTimeout time.Duration
	// KeepAlivePeriod sends a PING after this long without traffic. The
	// default, 25 s, is WireGuard's persistent keep-alive: under the 30 s
	// after which many NATs and firewalls (and Linux conntrack, for a UDP
	// mapping that has seen one reply) forget a UDP mapping, and, with the
	// client's heartbeats off while idle, the only packet an idle
	// connection sends.
	KeepAlivePeriod time.Duration
	// HandshakeTimeout bounds the handshake.
	HandshakeTimeout time.Duration
	// MaxIncomingStreams bounds concurrent tunnels per connection.
	MaxIncomingStreams int64
	// Allow0RTT lets the server accept 0-RTT data.
	Allow0RTT bool
	// DisablePathMTUDiscovery keeps packets at 1280 bytes (room for FEC framing).
	DisablePathMTUDiscovery bool
	// Congestion selects the congestion controller of this side's sending
	// direction; LossThreshold tunes bbr.
	Congestion    congestion.Algorithm
	LossThreshold float64
	// Rate is the fixed controller's goodput in bytes/s (--rate).
	Rate float64
	// MaxProbeTimeout caps QUIC's backed-off probe timeout (quic-go: 60 s).
	MaxProbeTimeout time.Duration
	// FullReceiveWindows starts the receive windows at their maximum (6 MiB
	// a stream, 15 MiB a connection) instead of growing them from 512 KiB
	// and 1 MiB as the application reads: for the client, which has
	// verified its server. On a path that loses many packets a hole stops
	// the application's reads for several round trips, so the windows never
	// grow and the sender waits at 512 KiB (at 50 % loss a download got 7-13
	// Mbit/s of a 100 Mbit/s link in the simulation, 52-69 with full windows;
	// pkg/congestion TestHeavyLossSimnet). The server keeps them small: a
	// peer that has not proven the secret gets no more than it needs.
	FullReceiveWindows bool
}

// DefaultQUICOptions are the defaults of both endpoints.
func DefaultQUICOptions() QUICOptions {
	return QUICOptions{
		IdleTimeout:        90 * time.Second,
		KeepAlivePeriod:    25 * time.Second,
		HandshakeTimeout:   3 * time.Second,
		MaxIncomingStreams: 10000,
		Allow0RTT:          true,
		Congestion:         congestion.Default,
		MaxProbeTimeout:    500 * time.Millisecond,
	}
}

// QUICConfig turns o into a quic.Config.
func QUICConfig(o QUICOptions) *quic.Config {
	c := &quic.Config{
		MaxIdleTimeout:                 o.IdleTimeout,
		KeepAlivePeriod:                o.KeepAlivePeriod,
		HandshakeIdleTimeout:           o.HandshakeTimeout,
		MaxIncomingStreams:             o.MaxIncomingStreams,
		MaxIncomingUniStreams:          -1,
		Allow0RTT:                      o.Allow0RTT,
		EnableDatagrams:                true, // heartbeats and tail-loss probes (pkg/liveness)
		DisablePathMTUDiscovery:        o.DisablePathMTUDiscovery,
		InitialStreamReceiveWindow:     512 << 10,
		MaxStreamReceiveWindow:         6 << 20,
		InitialConnectionReceiveWindow: 1 << 20,
		MaxConnectionReceiveWindow:     15 << 20,
		Congestion:                     congestion.Factory(o.Congestion, congestion.Options{LossThreshold: o.LossThreshold, Rate: o.Rate}),
		MaxProbeTimeout:                o.MaxProbeTimeout,
	}
	if o.FullReceiveWindows {
		c.InitialStreamReceiveWindow, c.InitialConnectionReceiveWindow = c.MaxStreamReceiveWindow, c.MaxConnectionReceiveWindow
	}
	return c
}

// ListenUDP opens the UDP socket a quic.Transport runs on. The caller owns it and
// must close it after the Transport: quic-go does not close a socket it was given.
func ListenUDP(address string) (*net.UDPConn, error) {
	ua, err := net.ResolveUDPAddr("udp", address)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", address, err)
	}
	return net.ListenUDP("udp", ua) // its *net.OpError reads "listen udp ADDRESS: ..."
}

// Linger gives the peers of conns time to acknowledge what was sent last
// before the connections are closed (CONNECTION_CLOSE discards unacknowledged
// data): it returns when every connection has ended, after three probe
// timeouts of the slowest connection (at least 200 ms, at most 3 s), or when
// ctx is done.
func Linger(ctx context.Context, conns []*quic.Conn) {
	var wait time.Duration
	for _, c := range conns {
		st := c.ConnectionStats()
		wait = max(wait, 3*(st.SmoothedRTT+4*st.MeanDeviation+26*time.Millisecond))
	}
	t := time.NewTimer(min(max(wait, 200*time.Millisecond), 3*time.Second))
	defer t.Stop()
	for _, c := range conns {
		select {
		case <-c.Context().Done():
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// HandshakeComplete reports, without waiting, whether c's handshake has
// completed (c.HandshakeComplete() is closed); c is a *quic.Conn or an
// interface over one.
func HandshakeComplete(c interface{ HandshakeComplete() <-chan struct{} }) bool {
	select {
	case <-c.HandshakeComplete():
		return true
	default:
		return false
	}
}
