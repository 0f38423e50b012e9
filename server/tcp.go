package server

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/tcpmux"
)

// maxTCPHandshakes bounds the TCP connections in their TLS handshake at
// once (QUIC's equivalent is quic-go's queue of incoming handshakes): more
// are closed at once, as over the handshake rate.
const maxTCPHandshakes = 256

// tunnelConn is what serveConn uses of a connection, QUIC or TCP.
type tunnelConn interface {
	egress.Conn
	AcceptStream(ctx context.Context) (egress.TunnelStream, error)
	// verified lifts the pre-authentication bounds once the peer has
	// proven the secret: its stream limit to maxStreams (if above the
	// current one) and, on TCP, its receive windows to the full ones.
	verified(maxStreams int64)
	LocalAddr() net.Addr
	// asQUIC is the QUIC connection, nil on TCP (no datagrams, liveness or
	// QUIC statistics).
	asQUIC() *quic.Conn
}

// overQUIC is a QUIC connection as a tunnelConn.
type overQUIC struct{ *quic.Conn }

func (c overQUIC) AcceptStream(ctx context.Context) (egress.TunnelStream, error) {
	s, err := c.Conn.AcceptStream(ctx)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (c overQUIC) asQUIC() *quic.Conn { return c.Conn }

// verified raises the stream limit (our quic-go patch 0005); QUIC's windows
// grow by themselves as the application reads.
func (c overQUIC) verified(maxStreams int64) {
	if maxStreams > 0 {
		c.RaiseMaxIncomingStreams(maxStreams)
	}
}

// overTCP is a tcpmux connection as a tunnelConn.
type overTCP struct{ *tcpmux.Conn }

func (c overTCP) AcceptStream(ctx context.Context) (egress.TunnelStream, error) {
	s, err := c.Conn.AcceptStream(ctx)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (c overTCP) asQUIC() *quic.Conn { return nil }

func (c overTCP) verified(maxStreams int64) {
	c.RaiseMaxIncomingStreams(maxStreams) // never lowers it
	c.OpenReceiveWindows()
}

// quicOf is the QUIC connection behind c (a tunnelConn or a bare
// *quic.Conn), nil for a TCP one.
func quicOf(c egress.Conn) *quic.Conn {
	switch c := c.(type) {
	case tunnelConn:
		return c.asQUIC()
	case *quic.Conn:
		return c
	}
	return nil
}

// transportOf names the transport for logs: "quic", or "tcp" for nil.
func transportOf(q *quic.Conn) string {
	if q == nil {
		return "tcp"
	}
	return "quic"
}

// acceptTCP accepts TCP connections until the listener is closed: the
// connection limits apply before the TLS handshake (as QUIC's ConnContext
// applies them), then serveConn serves it as a QUIC connection is served.
// Handshakes end with ctx (the drain); connections with connCtx. Every
// goroutine it starts is added to wg.
func (s *Server) acceptTCP(ctx, connCtx context.Context, wg *sync.WaitGroup) {
	logger := klog.FromContext(ctx)
	m := s.cfg.Metrics
	var pause time.Duration
	for {
		nc, err := s.cfg.TCP.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return
			}
			// Out of file descriptors and the like: wait, as net/http does.
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			logger.Error(err, "Accepting a TCP connection failed; retrying", "retryIn", pause)
			select {
			case <-time.After(pause):
				continue
			case <-ctx.Done():
				return
			}
		}
		pause = 0
		if s.active.Load() >= int64(s.cfg.MaxConnections) {
			m.RefusedConnectionsTotal.WithLabelValues(metrics.RefusedMaxConnections).Inc()
			_ = nc.Close()
			continue
		}
		if !s.limits.allowHandshake(sourceIP(nc.RemoteAddr()), time.Now()) {
			m.RefusedConnectionsTotal.WithLabelValues("handshake_rate").Inc()
			_ = nc.Close()
			continue
		}
		select {
		case s.tcpHandshakes <- struct{}{}:
		default:
			m.RefusedConnectionsTotal.WithLabelValues(metrics.RefusedTCPHandshakes).Inc()
			_ = nc.Close()
			continue
		}
		wg.Go(func() {
			c, err := tcpmux.Server(ctx, nc, s.cfg.TLS, &s.cfg.TCPMux)
			<-s.tcpHandshakes
			if err != nil {
				m.TCPHandshakeFailuresTotal.Inc()
				logger.V(4).Info("TCP handshake failed", "remoteAddress", nc.RemoteAddr().String(), "err", err)
				return
			}
			s.serveConn(connCtx, overTCP{c})
			_ = c.CloseWithError(0, "") // waits for its goroutines; closed already
		})
	}
}
