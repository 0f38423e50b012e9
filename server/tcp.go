package server

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/tcpmux"
)

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

// ingressOf is c as ingress opens streams on it (a reverse forward's toward
// the client): QUIC or TCP; nil for anything else.
func ingressOf(c egress.Conn) ingress.Conn {
	switch c := c.(type) {
	case overQUIC:
		return ingress.OverQUIC(c.Conn)
	case overTCP:
		return ingress.OverTCP(c.Conn)
	case *quic.Conn:
		return ingress.OverQUIC(c)
	case *tcpmux.Conn:
		return ingress.OverTCP(c)
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

// acceptTCP accepts TCP connections until the listener is closed, each
// served by serveTCP on a goroutine of its own once it is within the
// limits that apply at accept (admitTCP). Handshakes end with ctx (the
// drain); connections with connCtx. Every goroutine it starts is added to
// wg.
func (s *Server) acceptTCP(ctx, connCtx context.Context, wg *sync.WaitGroup) {
	logger := klog.FromContext(ctx)
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
		src := sourceIP(nc.RemoteAddr())
		if !s.admitTCP(logger, nc.RemoteAddr(), src) {
			_ = nc.Close()
			continue
		}
		wg.Go(func() { s.serveTCP(ctx, connCtx, nc, src) })
	}
}

// admitTCP applies the limits a TCP connection from src meets at accept,
// before it has sent anything (as QUIC's ConnContext applies them before
// the handshake): MaxConnections, the source's handshake rate, its place
// among the source's connections (MaxConnsPerSource: the connection holds
// it from now on, and serveConn takes it over), and a place among the
// connections waiting for their ClientHello. A refusal is counted and
// logged, and reported as false.
func (s *Server) admitTCP(logger klog.Logger, remote net.Addr, src string) bool {
	now := time.Now()
	switch {
	case s.active.Load() >= int64(s.cfg.MaxConnections):
		s.refuseTCP(logger, remote, metrics.RefusedMaxConnections, s.cfg.MaxConnections)
	case !s.limits.allowHandshake(src, now):
		s.refuseTCP(logger, remote, "handshake_rate", s.cfg.HandshakesPerSecond)
	case !s.limits.open(src, now):
		s.refuseTCP(logger, remote, "per_source_limit", s.cfg.MaxConnsPerSource)
	default:
		reason := s.tcpSlots.wait(src)
		if reason == "" {
			return true
		}
		s.limits.closed(src, now)
		limit := s.tcpSlots.maxWaiting
		if reason == metrics.RefusedTCPWaitingPerSource {
			limit = s.tcpSlots.maxWaitingPerSource
		}
		s.refuseTCP(logger, remote, reason, limit)
	}
	return false
}

// tcpRefusals are the log lines of TCP connections refused before their
// handshake, by reason: what happened, and the flag to raise if clients
// need more.
var tcpRefusals = map[string]string{
	metrics.RefusedMaxConnections:         "Refused TCP connection: the server is at its connection limit; raise --max-connections if clients need more",
	"handshake_rate":                      "Refused TCP connection: too many new connections from this address; raise --handshake-rate if clients behind one address need more",
	"per_source_limit":                    "Refused TCP connection: too many from this address; raise --max-conns-per-source if clients behind one address need more",
	metrics.RefusedTCPWaiting:             "Refused TCP connection: too many TCP connections are waiting for their TLS ClientHello; raise --max-tcp-handshakes (4 waiting per handshake) if clients need more",
	metrics.RefusedTCPWaitingPerSource:    "Refused TCP connection: too many TCP connections from this address are waiting for their TLS ClientHello; raise --max-tcp-handshakes (a source may hold a sixteenth) if clients behind one address need more",
	metrics.RefusedTCPHandshakes:          "Refused TCP connection: too many TCP connections are in their TLS handshake; raise --max-tcp-handshakes if clients need more",
	metrics.RefusedTCPHandshakesPerSource: "Refused TCP connection: too many TCP connections from this address are in their TLS handshake; raise --max-tcp-handshakes (a source may hold a sixteenth) if clients behind one address need more",
}

// refuseTCP counts and logs a TCP connection refused before its handshake
// (reason: a refused_connections_total reason); the caller closes it.
func (s *Server) refuseTCP(logger klog.Logger, remote net.Addr, reason string, limit any) {
	s.cfg.Metrics.RefusedConnectionsTotal.WithLabelValues(reason).Inc()
	logger.V(2).Info(tcpRefusals[reason], "remoteAddress", remote.String(), "reason", reason, "limit", limit)
}

// tcpClientHelloTimeout bounds the time from accept to a TCP connection's
// whole first TLS record (its ClientHello). A client sends it as soon as it
// is connected; 3 s leaves room for a lost segment to be sent again two or
// three times (the kernel's retransmission timeout starts at 200 ms to 1 s).
// A constant: no client has a reason to wait, and a longer time only lets
// silent connections hold their places longer.
const tcpClientHelloTimeout = 3 * time.Second

// serveTCP serves a TCP connection from src admitted by admitTCP (holding
// its place among src's connections and a waiting place): it waits for the
// ClientHello (readClientHello), then takes a handshake slot, runs the TLS
// handshake and the HTTP/2 preface, and serves the connection (serveConn)
// until it ends. Every place it holds is given back once, on every path.
func (s *Server) serveTCP(ctx, connCtx context.Context, nc net.Conn, src string) {
	logger := klog.FromContext(ctx)
	m := s.cfg.Metrics
	fail := func(msg string, err error) {
		s.limits.closed(src, time.Now())
		m.TCPHandshakeFailuresTotal.Inc()
		logger.V(4).Info(msg, "remoteAddress", nc.RemoteAddr().String(), "err", err)
	}
	hello, err := readClientHello(ctx, nc)
	if err != nil {
		s.tcpSlots.doneWaiting(src)
		fail("TCP connection sent no ClientHello in time", err)
		_ = nc.Close()
		return
	}
	if reason := s.tcpSlots.handshake(src); reason != "" {
		s.limits.closed(src, time.Now())
		limit := s.tcpSlots.maxHandshakes
		if reason == metrics.RefusedTCPHandshakesPerSource {
			limit = s.tcpSlots.maxHandshakesPerSource
		}
		s.refuseTCP(logger, nc.RemoteAddr(), reason, limit)
		_ = nc.Close()
		return
	}
	c, err := tcpmux.Server(ctx, &helloConn{Conn: nc, hello: hello}, s.cfg.TLS, &s.cfg.TCPMux)
	s.tcpSlots.doneHandshake(src)
	if err != nil {
		fail("TCP handshake failed", err) // tcpmux closed nc
		return
	}
	// It holds its place among src's connections: serveConn takes it over.
	s.serveConn(connCtx, overTCP{c}, true)
	_ = c.CloseWithError(0, "") // waits for its goroutines; closed already
}

// TLS record framing, as readClientHello needs it (RFC 8446 section 5.1).
const (
	tlsRecordHeaderLen = 5
	tlsRecordHandshake = 22
	tlsMaxPlaintext    = 1 << 14
)

// readClientHello reads nc's first TLS record (a client's ClientHello fits
// in one) within tcpClientHelloTimeout and while ctx lasts, and returns it
// to be replayed to the TLS server (helloConn). A header that is not that
// of a handshake record of a valid length is returned as it is, for the
// TLS server to refuse at once. It buffers at most one record (16 KiB).
func readClientHello(ctx context.Context, nc net.Conn) ([]byte, error) {
	_ = nc.SetReadDeadline(time.Now().Add(tcpClientHelloTimeout))
	stop := context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	rec := make([]byte, tlsRecordHeaderLen)
	if _, err := io.ReadFull(nc, rec); err != nil {
		return nil, err
	}
	if n := int(binary.BigEndian.Uint16(rec[3:])); rec[0] == tlsRecordHandshake && n <= tlsMaxPlaintext {
		rec = append(rec, make([]byte, n)...)
		if _, err := io.ReadFull(nc, rec[tlsRecordHeaderLen:]); err != nil {
			return nil, err
		}
	}
	// The TLS handshake sets its own deadline; if ctx ended meanwhile, it
	// fails at once.
	_ = nc.SetReadDeadline(time.Time{})
	return rec, nil
}

// helloConn is a TCP connection whose first record readClientHello has
// read: Read returns it first. Reads must not be concurrent (crypto/tls
// does not make them so).
type helloConn struct {
	net.Conn
	hello []byte
}

func (c *helloConn) Read(p []byte) (int, error) {
	if len(c.hello) == 0 {
		return c.Conn.Read(p)
	}
	n := copy(p, c.hello)
	if c.hello = c.hello[n:]; len(c.hello) == 0 {
		c.hello = nil
	}
	return n, nil
}

// CloseWrite half-closes the TCP connection (tcpmux's graceful close looks
// for it behind the TLS connection).
func (c *helloConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
