package integration

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/proxy"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/socks5"
	"github.com/quictun/quictun/pkg/udpflow"
	"github.com/quictun/quictun/server"
)

// startProxy runs a client whose only entry point is p and returns its address.
func startProxy(t *testing.T, srv *testutil.Server, p ingress.Proxy) (string, *testutil.Client) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:1", WaitReady: true, Mutate: func(cfg *client.Config) {
		cfg.Forwards = []client.Forward{{Listener: ln, Proxy: p}}
	}})
	return ln.Addr().String(), c
}

// socksConnect does a raw SOCKS5 CONNECT to host:port and returns the REP
// byte and the connection.
func socksConnect(t *testing.T, addr, host string, port int) (byte, net.Conn) {
	t.Helper()
	c := socksRequest(t, addr, host, port)
	rep, err := socksReply(c)
	require.NoError(t, err)
	return rep, c
}

// socksRequest sends a raw SOCKS5 greeting and CONNECT to host:port at
// once and reads the answer to the greeting (the client gives it at once).
func socksRequest(t *testing.T, addr, host string, port int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	req := []byte{5, 1, 0, 5, 1, 0, 3, byte(len(host))}
	req = append(req, host...)
	req = append(req, byte(port>>8), byte(port))
	_, err = c.Write(req)
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	method := make([]byte, 2)
	_, err = io.ReadFull(c, method)
	require.NoError(t, err)
	require.Equal(t, []byte{5, 0}, method, "method: no authentication")
	_ = c.SetReadDeadline(time.Time{})
	return c
}

// socksReply reads the answer to socksRequest's CONNECT and returns its REP byte.
func socksReply(c net.Conn) (byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	resp := make([]byte, 10)
	if _, err := io.ReadFull(c, resp); err != nil {
		return 0, err
	}
	return resp[1], nil
}

// TestSOCKS5Proxy (issue 12 item 4): a SOCKS5 entry point carries CONNECTs
// to destinations the application names (by IP or by name, resolved by the
// server), and answers a destination the server's rules refuse with
// "connection not allowed by ruleset" (2), one that does not answer with
// "connection refused" (5).
func TestSOCKS5Proxy(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	_, port, _ := net.SplitHostPort(echo)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo, "tcp:127.0.0.1:1"}})
	addr, c := startProxy(t, srv, ingress.SOCKS5{})

	d, err := proxy.SOCKS5("tcp", addr, nil, proxy.Direct)
	require.NoError(t, err)
	conn, err := d.Dial("tcp", echo)
	require.NoError(t, err)
	echoCheck(t, conn, 256<<10)
	_ = conn.Close()

	p, _ := strconv.Atoi(port)
	rep, conn2 := socksConnect(t, addr, "localhost", p)
	assert.Equal(t, byte(socks5.ReplySucceeded), rep, "a name the server resolves to an allowed address")
	echoCheck(t, conn2, 256<<10)

	rep, _ = socksConnect(t, addr, "127.0.0.1", 22)
	assert.Equal(t, byte(socks5.ReplyNotAllowed), rep, "not allowed by ruleset")
	rep, _ = socksConnect(t, addr, "127.0.0.1", 1)
	assert.Equal(t, byte(socks5.ReplyConnectionRefused), rep, "allowed, but nothing listens")
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(c.Metrics.StreamsTotal.WithLabelValues("refused")) == 1 &&
			promtest.ToFloat64(c.Metrics.StreamsTotal.WithLabelValues("dial_failed")) == 1
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.RefusedTotal.WithLabelValues("tcp", "not_allowed")))
}

// TestSOCKS5ProxyCredentials: with credentials set, a client without them
// (or with wrong ones) is turned away before any stream is opened.
func TestSOCKS5ProxyCredentials(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	addr, c := startProxy(t, srv, ingress.SOCKS5{Credentials: ingress.NewProxyCredentials(socks5.UserPass{User: "app", Password: "s3cret"})})
	for _, auth := range []*proxy.Auth{nil, {User: "app", Password: "wrong"}} {
		d, err := proxy.SOCKS5("tcp", addr, auth, proxy.Direct)
		require.NoError(t, err)
		_, err = d.Dial("tcp", echo)
		require.Error(t, err)
	}
	d, err := proxy.SOCKS5("tcp", addr, &proxy.Auth{User: "app", Password: "s3cret"}, proxy.Direct)
	require.NoError(t, err)
	conn, err := d.Dial("tcp", echo)
	require.NoError(t, err)
	echoCheck(t, conn, 256<<10)
	assert.Equal(t, 2.0, promtest.ToFloat64(c.Metrics.StreamsTotal.WithLabelValues("bad_token")), "bad requests are counted")
	assert.Equal(t, 1.0, promtest.ToFloat64(c.Metrics.ProxyAuthFailuresTotal.WithLabelValues("socks5", "missing")))
	assert.Equal(t, 1.0, promtest.ToFloat64(c.Metrics.ProxyAuthFailuresTotal.WithLabelValues("socks5", "wrong")))
	assert.Equal(t, 0.0, promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("refused")), "the server saw nothing of them")
}

// httpConnect sends a CONNECT for target and returns the status code, the
// connection and its reader.
func httpConnect(t *testing.T, addr, target, extra string) (int, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n"+extra)
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	_ = c.SetDeadline(time.Time{})
	return resp.StatusCode, c, br
}

// TestHTTPConnectProxy: an HTTP CONNECT entry point answers 200 and carries
// the bytes (including bytes the application sent right after its request),
// 403 for a destination the rules refuse, 502 when the dial fails, 405 for
// other methods.
func TestHTTPConnectProxy(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo, "tcp:127.0.0.1:1"}})
	addr, _ := startProxy(t, srv, ingress.HTTPConnect{})

	code, c, br := httpConnect(t, addr, echo, "early bytes|")
	require.Equal(t, http.StatusOK, code)
	_, err := io.WriteString(c, "later bytes")
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Equal(t, "early bytes|later bytes", string(got), "bytes sent with the request are not lost")

	code, c, _ = httpConnect(t, addr, echo, "")
	require.Equal(t, http.StatusOK, code)
	echoCheck(t, c, 256<<10)

	code, _, _ = httpConnect(t, addr, "127.0.0.1:22", "")
	assert.Equal(t, http.StatusForbidden, code)
	code, _, _ = httpConnect(t, addr, "127.0.0.1:1", "")
	assert.Equal(t, http.StatusBadGateway, code)

	g, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer g.Close()
	_, err = io.WriteString(g, "GET http://"+echo+"/ HTTP/1.1\r\nHost: "+echo+"\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(g), nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.True(t, strings.Contains(resp.Header.Get("Allow"), "CONNECT"))
}

// socksAssociate opens a SOCKS5 UDP ASSOCIATE on addr declaring no client
// address (0.0.0.0:0) and returns the control connection and the relay
// address.
func socksAssociate(t *testing.T, addr string) (net.Conn, *net.UDPAddr) {
	t.Helper()
	return socksAssociateFrom(t, addr, socks5.Addr{IP: netip.IPv4Unspecified()})
}

// TestSOCKS5UDPAssociate: datagrams sent to the SOCKS5 relay with the UDP
// request header reach the destination they name (checked by the server's
// udp: rules) and the answers come back with the header naming it; packets
// from another address than the control connection's are dropped; closing
// the control connection ends the association and its flows.
func TestSOCKS5UDPAssociate(t *testing.T) {
	t.Parallel()
	echo := testutil.UDPEchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"udp:" + echo}})
	addr, c := startProxy(t, srv, ingress.SOCKS5{})
	ctrl, relay := socksAssociate(t, addr)
	app, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer app.Close()
	ep := netip.MustParseAddrPort(echo)
	hdr := socks5.AppendUDPHeader(nil, socks5.Addr{IP: ep.Addr(), Port: ep.Port()})
	buf := make([]byte, 70000)
	for i, size := range []int{10, 1000, 5000} {
		want := packet(uint32(i), size)
		got := false
		for try := 0; try < 5 && !got; try++ {
			_, err := app.WriteToUDP(append(append([]byte(nil), hdr...), want...), relay)
			require.NoError(t, err)
			_ = app.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, err := app.Read(buf)
			if err != nil {
				continue
			}
			from, payload, err := socks5.ParseUDP(buf[:n])
			require.NoError(t, err)
			assert.Equal(t, echo, from.String(), "the answer names its source")
			require.Equal(t, uint32(i), checkPacket(t, payload))
			got = true
		}
		require.True(t, got, "packet %d never answered", i)
	}
	// A destination the rules do not allow: refused by the server.
	bad := socks5.AppendUDPHeader(nil, socks5.Addr{IP: netip.MustParseAddr("127.0.0.1"), Port: 9})
	_, err = app.WriteToUDP(append(bad, "x"...), relay)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(c.Metrics.UDP.FlowsTotal.WithLabelValues("refused")) == 1
	}, 5*time.Second, 10*time.Millisecond)
	// Another source address is not the association's client.
	other, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	require.NoError(t, err)
	defer other.Close()
	_, err = other.WriteToUDP(append(append([]byte(nil), hdr...), "y"...), relay)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(c.Metrics.UDP.DropsTotal.WithLabelValues(udpflow.DropForeignSource)) == 1
	}, 5*time.Second, 10*time.Millisecond)

	assert.Equal(t, 1.0, promtest.ToFloat64(c.Metrics.UDP.FlowsActive))
	_ = ctrl.Close()
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(c.Metrics.UDP.FlowsActive) == 0 && promtest.ToFloat64(srv.Metrics.UDP.FlowsActive) == 0
	}, 5*time.Second, 10*time.Millisecond, "closing the control connection ends the flows")
	_, err = app.WriteToUDP(append(append([]byte(nil), hdr...), "z"...), relay)
	if err == nil {
		_ = app.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err = app.Read(buf)
		assert.Error(t, err, "the relay is closed")
	}
}

// gatedDialer is the server's dialer, held at will: while held, each dial
// announces itself on dialing and waits for release.
type gatedDialer struct {
	held    atomic.Bool
	dialing chan string
	release chan struct{}
	stop    chan struct{} // closed: no more holding (the test ended)
}

func (g *gatedDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if g.held.Load() {
		select {
		case g.dialing <- address:
		case <-g.stop:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		select {
		case <-g.release:
		case <-g.stop:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var d net.Dialer
	return d.DialContext(ctx, network, address)
}

// TestSOCKS5ProxyAnswersAcceptedDestinationsAtOnce (issue 12: a proxied
// connection's first byte costs one round trip plus the server's dial, as a
// forward's): a destination the server accepted on this connection is
// answered before the server has even dialed it, and the application's
// bytes follow the header; a destination the server has not accepted yet
// waits for its verdict; one it refuses after accepting it (rules reloaded)
// resets the application's connection, and the next connection to it gets
// "not allowed by ruleset".
func TestSOCKS5ProxyAnswersAcceptedDestinationsAtOnce(t *testing.T) {
	t.Parallel()
	echo, other := testutil.EchoServer(t), testutil.EchoServer(t)
	gate := &gatedDialer{dialing: make(chan string), release: make(chan struct{}), stop: make(chan struct{})}
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo, "tcp:" + other},
		Mutate: func(cfg *server.Config) { cfg.Dialer = gate }})
	t.Cleanup(func() { close(gate.stop) }) // before the server stops
	addr, c := startProxy(t, srv, ingress.SOCKS5{})
	hostPort := func(a string) (string, int) {
		ap := netip.MustParseAddrPort(a)
		return ap.Addr().String(), int(ap.Port())
	}
	h, p := hostPort(echo)

	rep, conn := socksConnect(t, addr, h, p)
	require.Equal(t, byte(socks5.ReplySucceeded), rep)
	echoCheck(t, conn, 64<<10) // the server accepted echo on this connection

	gate.held.Store(true)
	rep, conn = socksConnect(t, addr, h, p)
	require.Equal(t, byte(socks5.ReplySucceeded), rep, "answered at once")
	require.Equal(t, echo, <-gate.dialing, "while the server was still to dial the destination")
	_, err := conn.Write([]byte("first bytes")) // sent behind the header, before the dial
	require.NoError(t, err)
	gate.release <- struct{}{}
	got := make([]byte, len("first bytes"))
	_, err = io.ReadFull(conn, got)
	require.NoError(t, err)
	assert.Equal(t, "first bytes", string(got))

	// A destination not accepted yet on this connection: the answer waits
	// for the server, which is held in its dial.
	oh, op := hostPort(other)
	pending := socksRequest(t, addr, oh, op)
	require.Equal(t, other, <-gate.dialing)
	_ = pending.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := pending.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "answered (%d bytes) before the server dialed", n)
	gate.release <- struct{}{}
	rep, err = socksReply(pending)
	require.NoError(t, err)
	assert.Equal(t, byte(socks5.ReplySucceeded), rep)
	gate.held.Store(false)

	// Rules reloaded: echo is no longer allowed.
	srv.SetAllowList(endpoint.MustParseAllowList("tcp:"+other), nil)
	rep, conn = socksConnect(t, addr, h, p)
	require.Equal(t, byte(socks5.ReplySucceeded), rep, "remembered as accepted")
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = conn.Read(make([]byte, 1))
	require.Error(t, err, "the refusal resets the application's connection")
	assert.NotErrorIs(t, err, os.ErrDeadlineExceeded)
	rep, _ = socksConnect(t, addr, h, p)
	assert.Equal(t, byte(socks5.ReplyNotAllowed), rep, "forgotten: the next connection gets the server's answer")
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(c.Metrics.StreamsTotal.WithLabelValues("refused")) == 2
	}, 5*time.Second, 10*time.Millisecond)
}
