package transport

import (
	"fmt"
	"net"
	"time"

	"github.com/quic-go/quic-go"
)

// QUICOptions are the tunables of a QUIC connection that quictun exposes.
type QUICOptions struct {
	// IdleTimeout closes a connection that received nothing for this long. It
	// bounds how long a blackout the tunnel survives; both ends must agree.
	IdleTimeout time.Duration
	// KeepAlivePeriod sends a PING after this long without traffic.
	KeepAlivePeriod time.Duration
	// HandshakeTimeout bounds the handshake.
	HandshakeTimeout time.Duration
	// MaxIncomingStreams bounds concurrent tunnels per connection.
	MaxIncomingStreams int64
	// Allow0RTT lets the server accept 0-RTT data.
	Allow0RTT bool
}

// DefaultQUICOptions are the defaults of both endpoints.
func DefaultQUICOptions() QUICOptions {
	return QUICOptions{
		IdleTimeout:        90 * time.Second,
		KeepAlivePeriod:    5 * time.Second,
		HandshakeTimeout:   3 * time.Second,
		MaxIncomingStreams: 10000,
		Allow0RTT:          true,
	}
}

// QUICConfig turns o into a quic.Config.
func QUICConfig(o QUICOptions) *quic.Config {
	return &quic.Config{
		MaxIdleTimeout:                 o.IdleTimeout,
		KeepAlivePeriod:                o.KeepAlivePeriod,
		HandshakeIdleTimeout:           o.HandshakeTimeout,
		MaxIncomingStreams:             o.MaxIncomingStreams,
		MaxIncomingUniStreams:          -1,
		Allow0RTT:                      o.Allow0RTT,
		EnableDatagrams:                true, // heartbeats and tail-loss probes (pkg/liveness)
		InitialStreamReceiveWindow:     512 << 10,
		MaxStreamReceiveWindow:         6 << 20,
		InitialConnectionReceiveWindow: 1 << 20,
		MaxConnectionReceiveWindow:     15 << 20,
	}
}

// ListenUDP opens the UDP socket a quic.Transport runs on. The caller owns it and
// must close it after the Transport: quic-go does not close a socket it was given.
func ListenUDP(address string) (*net.UDPConn, error) {
	ua, err := net.ResolveUDPAddr("udp", address)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", address, err)
	}
	c, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("listen udp %s: %w", address, err)
	}
	return c, nil
}
