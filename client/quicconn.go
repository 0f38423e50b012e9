package client

import (
	"context"
	"net"

	"github.com/quic-go/quic-go"

	"github.com/quictun/quictun/pkg/ingress"
)

// quicConn is what a QUIC link uses of its connection: its loop's steps
// (connect, handshake, up, down), monitor and its watch (heartbeats,
// echoes, the packet count), the rescuer (a new path) and steering. It is
// a *quic.Conn (overQUIC), or a fake in the package's tests, so that the
// whole loop, dial -> hello -> serve -> lost -> backoff, runs without a
// network. What only a real connection has (congestion statistics,
// Linger) is read from the session's ingress.Conn (QUIC, nil on a fake).
type quicConn interface {
	// SendDatagram and ReceiveDatagram carry the heartbeats, echoes and
	// tail probes (pkg/liveness, pkg/dgram).
	SendDatagram(b []byte) error
	ReceiveDatagram(ctx context.Context) ([]byte, error)
	Context() context.Context
	HandshakeComplete() <-chan struct{}
	ConnectionState() quic.ConnectionState
	ConnectionStats() quic.ConnectionStats
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
	CloseWithError(quic.ApplicationErrorCode, string) error

	// streams is the connection as the tunnels see it (ingress.OverQUIC).
	streams() ingress.Conn
	// nextConnection is the connection that goes on after the server
	// rejected 0-RTT (quic.Conn.NextConnection).
	nextConnection(ctx context.Context) (quicConn, error)
	// addPath opens a new path from tr (a path rescue, a route change).
	addPath(tr *quic.Transport) (quicPath, error)
}

// quicPath is a path being validated (*quic.Path).
type quicPath interface {
	Probe(ctx context.Context) error
	Switch() error
	Close() error
}

// overQUIC is a *quic.Conn as a quicConn.
type overQUIC struct{ *quic.Conn }

func (q overQUIC) streams() ingress.Conn { return ingress.OverQUIC(q.Conn) }

func (q overQUIC) nextConnection(ctx context.Context) (quicConn, error) {
	next, err := q.NextConnection(ctx)
	if err != nil {
		return nil, err
	}
	return overQUIC{next}, nil
}

func (q overQUIC) addPath(tr *quic.Transport) (quicPath, error) {
	p, err := q.AddPath(tr)
	if err != nil {
		return nil, err
	}
	return p, nil
}
