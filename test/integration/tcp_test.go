package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/tcpmux"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/udpflow"
	"github.com/quictun/quictun/server"
)

// tcpConn connects to srv's TCP listener as a client pinned to srv's
// certificate; closed when the test ends.
func tcpConn(t *testing.T, srv *testutil.Server) *tcpmux.Conn {
	t.Helper()
	c, err := dialTCP(t, srv)
	require.NoError(t, err)
	return c
}

func dialTCP(t *testing.T, srv *testutil.Server) (*tcpmux.Conn, error) {
	t.Helper()
	pin, err := transport.ParseFingerprint(srv.State.Fingerprint())
	require.NoError(t, err)
	conf, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}})
	require.NoError(t, err)
	return dialTCPWith(t, srv, conf)
}

func dialTCPWith(t *testing.T, srv *testutil.Server, conf *tls.Config) (*tcpmux.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := tcpmux.Dial(ctx, srv.TCPAddr, conf, nil)
	if err == nil {
		t.Cleanup(func() { _ = c.CloseWithError(0, "") })
	}
	return c, err
}

// tcpStream opens a stream on c and writes b (a header and first bytes).
func tcpStream(t *testing.T, c *tcpmux.Conn, b []byte) *tcpmux.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	str, err := c.OpenStreamSync(ctx)
	require.NoError(t, err)
	_, err = str.Write(b)
	require.NoError(t, err)
	_ = str.SetReadDeadline(time.Now().Add(10 * time.Second))
	return str
}

// replyCode reads the server's reply on str: CodeOK, or the code of the
// reset.
func replyCode(t *testing.T, str *tcpmux.Stream) proto.Code {
	t.Helper()
	err := proto.ReadReply(str)
	if err == nil {
		return proto.CodeOK
	}
	code, ok := proto.FromError(err)
	require.True(t, ok, "want a reply or a reset with a code, got %v", err)
	return code
}

// TestTCPTransportCarriesTunnels (issue 24 item 1): a client whose UDP is
// blocked reaches the server over TCP: the same header, authentication and
// rules; TCP tunnels with half-close and UDP flows carried on their streams.
func TestTCPTransportCarriesTunnels(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	uecho := testutil.UDPEchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Allow: []string{"tcp:" + echo, "udp:" + uecho}})
	c := tcpConn(t, srv)
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv.Metrics.ActiveTCPConnections) == 1 },
		10*time.Second, 5*time.Millisecond, "the server counts the TCP connection")

	// A TCP tunnel: 4 MiB echoed, then half-close both ways.
	data := make([]byte, 4<<20)
	_, _ = rand.Read(data)
	str := tcpStream(t, c, signedHeader(t, "tcp:"+echo, time.Now()))
	require.Equal(t, proto.CodeOK, replyCode(t, str))
	_ = str.SetReadDeadline(time.Time{})
	go func() {
		_, _ = str.Write(data)
		_ = str.Close()
	}()
	got, err := io.ReadAll(str)
	require.NoError(t, err, "the echo ends with FIN after ours")
	assert.True(t, bytes.Equal(data, got), "echoed %d of %d bytes", len(got), len(data))

	// A UDP flow: no datagrams on TCP, the packets go framed on the stream.
	h, err := proto.NewHeader("udp:"+uecho, time.Now())
	require.NoError(t, err)
	h.Kind = proto.KindUDP
	uh, err := h.Append(nil, testutil.Secret)
	require.NoError(t, err)
	ustr := tcpStream(t, c, uh)
	require.NoError(t, udpflow.WriteFrame(ustr, []byte("ping over tcp")))
	require.Equal(t, proto.CodeOK, replyCode(t, ustr))
	p, err := udpflow.ReadFrame(ustr, make([]byte, udpflow.MaxPacket))
	require.NoError(t, err)
	assert.Equal(t, "ping over tcp", string(p))
	require.NoError(t, ustr.Close())

	// The rules are the same: a destination not allowed is refused.
	assert.Equal(t, proto.CodeRefused, replyCode(t, tcpStream(t, c, signedHeader(t, "tcp:127.0.0.1:1", time.Now()))))
	// And the server's own TCP listener is never a destination.
	assert.Equal(t, proto.CodeRefused, replyCode(t, tcpStream(t, c, signedHeader(t, "tcp:"+srv.TCPAddr, time.Now()))))
}

// TestTCPTransportAuthentication: the TCP listener asks what the QUIC one
// asks: a wrong secret closes the connection with auth_failed, a silent
// connection is closed at the auth timeout, a wrong pin fails the handshake.
func TestTCPTransportAuthentication(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.IdleAuthTimeout = 500 * time.Millisecond
	}})

	c := tcpConn(t, srv)
	h, err := proto.NewHeader("tcp:"+echo, time.Now())
	require.NoError(t, err)
	b, err := h.Append(nil, []byte("a wrong secret, 32 bytes long..."))
	require.NoError(t, err)
	tcpStream(t, c, b)
	<-c.Context().Done()
	var app *quic.ApplicationError
	require.ErrorAs(t, context.Cause(c.Context()), &app)
	assert.Equal(t, proto.CodeAuthFailed, proto.Code(app.ErrorCode))

	silent := tcpConn(t, srv)
	select {
	case <-silent.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a connection that proves nothing stays open")
	}
	require.ErrorAs(t, context.Cause(silent.Context()), &app)
	assert.Equal(t, proto.CodeTimeout, proto.Code(app.ErrorCode))

	other, err := transport.LoadOrCreateState(t.TempDir(), "", "")
	require.NoError(t, err)
	pin, err := transport.ParseFingerprint(other.Fingerprint())
	require.NoError(t, err)
	conf, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}})
	require.NoError(t, err)
	_, err = dialTCPWith(t, srv, conf)
	require.ErrorIs(t, err, transport.ErrFingerprintMismatch)
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv.Metrics.TCPHandshakeFailuresTotal) == 1 },
		10*time.Second, 10*time.Millisecond)
}

// TestTCPTransportLimits: the per-source connection limit and the
// pre-authentication stream budget hold on TCP.
func TestTCPTransportLimits(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.MaxConnsPerSource = 1
		c.MaxUnverifiedStreamsPerConn = 2
	}})
	c := tcpConn(t, srv)
	// Before a verified header: two streams of credit.
	_, err := c.OpenStream()
	require.NoError(t, err)
	_, err = c.OpenStream()
	require.NoError(t, err)
	_, err = c.OpenStream()
	require.ErrorIs(t, err, tcpmux.ErrStreamLimit)

	second, err := dialTCP(t, srv)
	if err == nil { // refused after the handshake, with overloaded
		<-second.Context().Done()
		var app *quic.ApplicationError
		require.ErrorAs(t, context.Cause(second.Context()), &app)
		assert.Equal(t, proto.CodeOverloaded, proto.Code(app.ErrorCode))
	} else {
		var ne net.Error
		require.True(t, errors.As(err, &ne) || errors.Is(err, io.EOF), "refused: %v", err)
	}
	assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.RefusedConnectionsTotal.WithLabelValues("per_source_limit")))
}

// udpGate drops every datagram both ways while closed: a network that
// blocks UDP, on the client's sockets (its first and its rescue sockets).
type udpGate struct{ blocked atomic.Bool }

func (g *udpGate) wrap(pc net.PacketConn) net.PacketConn { return &gatedConn{PacketConn: pc, g: g} }

type gatedConn struct {
	net.PacketConn
	g *udpGate
}

func (c *gatedConn) WriteTo(p []byte, addr net.Addr) (int, error) {
	if c.g.blocked.Load() {
		return len(p), nil
	}
	return c.PacketConn.WriteTo(p, addr)
}

func (c *gatedConn) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		n, addr, err := c.PacketConn.ReadFrom(p)
		if err != nil || !c.g.blocked.Load() {
			return n, addr, err
		}
	}
}

// tcpEcho sends msg through the client's listener and reads it back.
func tcpEcho(addr, msg string, timeout time.Duration) error {
	nc, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer func() { _ = nc.Close() }()
	_ = nc.SetDeadline(time.Now().Add(timeout))
	if _, err := nc.Write([]byte(msg)); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(nc, got); err != nil {
		return err
	}
	if string(got) != msg {
		return errors.New("echo differs")
	}
	return nil
}

// TestTCPFallbackAndReturn (issue 24 item 1): with UDP blocked from the
// start the first tunnel goes over TCP; when UDP works again new tunnels go
// over QUIC while the TCP-carried one finishes intact; when UDP is blocked
// mid-session new tunnels go over TCP again.
// connTransports is the transport of each connection in cs.
func connTransports(cs []transport.ConnStats) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Transport)
	}
	return out
}

func TestTCPFallbackAndReturn(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Allow: []string{"tcp:" + echo}})
	gate := &udpGate{}
	gate.blocked.Store(true)
	start := time.Now()
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WrapConn: gate.wrap,
		Mutate: func(c *client.Config) {
			c.TCPServerAddr = srv.TCPAddr
			c.DrainTimeout = 500 * time.Millisecond // the tunnel opened as UDP was cut waits on QUIC
		}})
	transport := func(name string) float64 { return promtest.ToFloat64(cl.Metrics.Transport.WithLabelValues(name)) }

	require.NoError(t, tcpEcho(cl.Addr, "first", 20*time.Second), "the first tunnel, over TCP")
	t.Logf("first tunnel over TCP %v after the client's start (loaded machine)", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, 1.0, transport("tcp"))
	assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.ActiveTCPConnections))
	// /connections on both ends lists the TCP connection as such.
	assert.Contains(t, connTransports(srv.ConnStats()), client.TransportTCP)
	assert.Contains(t, connTransports(cl.ConnStats()), client.TransportTCP)

	// A long tunnel opened over TCP...
	long, err := net.Dial("tcp", cl.Addr)
	require.NoError(t, err)
	defer func() { _ = long.Close() }()
	_, err = long.Write([]byte("before"))
	require.NoError(t, err)
	buf := make([]byte, 6)
	_, err = io.ReadFull(long, buf)
	require.NoError(t, err)
	tunnels := cl.Client.Registry().List(time.Now())
	require.NotEmpty(t, tunnels)
	for _, tn := range tunnels { // the long one, and maybe the first one's end
		assert.Equal(t, "tcp", tn.Transport, "/tunnels says which transport carries it")
	}

	// ...UDP comes back: new tunnels go over QUIC.
	gate.blocked.Store(false)
	back := time.Now()
	require.Eventually(t, func() bool { return tcpEcho(cl.Addr, "quic", 5*time.Second) == nil && transport("quic") == 1 },
		30*time.Second, 50*time.Millisecond, "new tunnels back on QUIC")
	t.Logf("new tunnels on QUIC %v after UDP came back", time.Since(back).Round(time.Millisecond))
	// The TCP-carried tunnel is intact, and the TCP connection stays for it.
	_, err = long.Write([]byte("after!"))
	require.NoError(t, err)
	_, err = io.ReadFull(long, buf)
	require.NoError(t, err)
	assert.Equal(t, "after!", string(buf))
	assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.ActiveTCPConnections), "held by its tunnel")
	require.NoError(t, long.(*net.TCPConn).CloseWrite())
	_, err = io.ReadAll(long)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv.Metrics.ActiveTCPConnections) == 0 },
		20*time.Second, 50*time.Millisecond, "the TCP connection closes after its last tunnel")

	// UDP blocked mid-session: new tunnels go over TCP.
	gate.blocked.Store(true)
	cut := time.Now()
	require.Eventually(t, func() bool { return tcpEcho(cl.Addr, "mid", 2*time.Second) == nil && transport("tcp") == 1 },
		30*time.Second, 10*time.Millisecond, "new tunnels over TCP after UDP is cut")
	t.Logf("new tunnels over TCP %v after UDP was cut mid-session", time.Since(cut).Round(time.Millisecond))
}

// TestNoTCPWhileQUICWorks: with UDP working the client opens no TCP
// connection (issue 24's no-regression target).
func TestNoTCPWhileQUICWorks(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Allow: []string{"tcp:" + echo}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true,
		Mutate: func(c *client.Config) { c.TCPServerAddr = srv.TCPAddr }})
	for range 5 {
		require.NoError(t, tcpEcho(cl.Addr, "hello", 10*time.Second))
	}
	time.Sleep(2 * client.DefaultFallbackDelay) // past the fallback delay
	assert.Equal(t, 1.0, promtest.ToFloat64(cl.Metrics.Transport.WithLabelValues("quic")))
	assert.Equal(t, 0.0, promtest.ToFloat64(srv.Metrics.ActiveTCPConnections))
	assert.Equal(t, 0.0, promtest.ToFloat64(srv.Metrics.TCPHandshakeFailuresTotal))
	assert.Equal(t, 0.0, promtest.ToFloat64(srv.Metrics.RefusedConnectionsTotal.WithLabelValues("handshake_rate")))
}

// TestTCPFallbackSeveralServersWithCA (issue 30 I3): a client of several
// servers that verifies them with a CA (--ca-file) and names none
// (--server-name) verifies each QUIC server against its own host; its TCP
// fallback, which reaches the first server, must do the same. It had no
// name to verify, so crypto/tls refused every TCP handshake and a client
// whose UDP is blocked never connected.
func TestTCPFallbackSeveralServersWithCA(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	pool, cert := testutil.ServerCA(t, "127.0.0.1")
	caSigned := func(c *server.Config) {
		c.TLS = transport.ServerTLSConfigFor(transport.NewServerCertificate(cert), [32]byte{1}, nil)
	}
	first := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Allow: []string{"tcp:" + echo}, Mutate: caSigned})
	second := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Allow: []string{"tcp:" + echo}, Mutate: caSigned})
	gate := &udpGate{}
	gate.blocked.Store(true)
	cl := testutil.StartClient(t, first, testutil.ClientOptions{Token: "tcp:" + echo, WrapConn: gate.wrap,
		TLS: func(o *transport.ClientTLSOptions) { o.Fingerprints, o.RootCAs = nil, pool }, // no ServerName, as with several --server-endpoint
		Mutate: func(c *client.Config) {
			c.Servers = []string{first.Addr, second.Addr}
			c.TCPServerAddr = first.TCPAddr
		}})
	require.NoError(t, tcpEcho(cl.Addr, "over tcp, CA-verified", 30*time.Second), "the first tunnel, over TCP")
	assert.Equal(t, 1.0, promtest.ToFloat64(cl.Metrics.Transport.WithLabelValues("tcp")))
	assert.Equal(t, 1.0, promtest.ToFloat64(first.Metrics.ActiveTCPConnections))
}

// TestFirstTunnelOf0RTTDialWithUDPBlocked: a client holding a session ticket
// (restarted with --session-file, as the systemd unit runs it) dials with
// 0-RTT, so its first tunnel goes out at once on a connection whose handshake
// cannot finish while UDP is blocked. Once the client turns to TCP (after
// --fallback-delay) the tunnel moves there, its bytes re-sent, instead of
// waiting for the QUIC handshake to time out: here a minute, beyond the
// bound below (before the move it took the whole timeout, 3 s by default).
func TestFirstTunnelOf0RTTDialWithUDPBlocked(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Allow: []string{"tcp:" + echo}})
	cache := transport.NewStickySessionCache(4)
	withCache := func(o *transport.ClientTLSOptions) { o.SessionCache = cache }
	first := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, TLS: withCache, WaitReady: true})
	echoCheck(t, dial(t, first.Addr), 1000) // the server sends a session ticket after the handshake
	first.Stop(t)

	gate := &udpGate{}
	gate.blocked.Store(true)
	logs := failureLog(t, 4, "client")
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, TLS: withCache, WrapConn: gate.wrap, Logger: logs.logger(),
		QUIC:   func(o *transport.QUICOptions) { o.HandshakeTimeout = time.Minute },
		Mutate: func(c *client.Config) { c.TCPServerAddr = srv.TCPAddr }})
	start := time.Now()
	msg := make([]byte, 64<<10) // more than one write: the copy kept for the re-send
	_, _ = rand.Read(msg)
	c := dial(t, cl.Addr)
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	go func() { _, _ = c.Write(msg); _ = c.CloseWrite() }()
	got, err := io.ReadAll(c)
	require.NoError(t, err, "the first tunnel, dialed with 0-RTT into blocked UDP, moved to TCP")
	require.Equal(t, msg, got, "re-sent intact, in order")
	t.Logf("first tunnel echoed %v after the client's start (loaded machine)", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, 1.0, promtest.ToFloat64(cl.Metrics.Transport.WithLabelValues("tcp")))
}
