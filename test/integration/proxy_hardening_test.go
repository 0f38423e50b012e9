package integration

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/socks5"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/udpflow"
)

// TestSOCKS5UDPAssociateBoundToOneSource (issue 21 item 5): an association
// relays the datagrams of one application socket only: the address and port
// the ASSOCIATE request declared, or, when it declared 0.0.0.0:0, the first
// socket that sent. Another local socket on the same IP address is dropped
// (foreign_source), so it cannot borrow an authenticated association.
func TestSOCKS5UDPAssociateBoundToOneSource(t *testing.T) {
	t.Parallel()
	echo := testutil.UDPEchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"udp:" + echo}})
	ep := netip.MustParseAddrPort(echo)
	hdr := socks5.AppendUDPHeader(nil, socks5.Addr{IP: ep.Addr(), Port: ep.Port()})
	for _, tc := range []struct {
		name string
		// declare is the address the ASSOCIATE request names, given the
		// two sockets' addresses; the first socket is the one served.
		declare func(first, second netip.AddrPort) socks5.Addr
		// secondFirst: the second socket sends before the first.
		secondFirst bool
	}{
		{name: "declared address and port", secondFirst: true, declare: func(first, _ netip.AddrPort) socks5.Addr {
			return socks5.Addr{IP: first.Addr(), Port: first.Port()}
		}},
		{name: "declared port only", secondFirst: true, declare: func(first, _ netip.AddrPort) socks5.Addr {
			return socks5.Addr{IP: netip.IPv4Unspecified(), Port: first.Port()}
		}},
		{name: "first sender", declare: func(_, _ netip.AddrPort) socks5.Addr {
			return socks5.Addr{IP: netip.IPv4Unspecified()}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, c := startProxy(t, srv, ingress.SOCKS5{})
			first, second := udpSocket(t), udpSocket(t)
			_, relay := socksAssociateFrom(t, addr, tc.declare(addrPortOf(first), addrPortOf(second)))
			if tc.secondFirst {
				_, err := second.WriteToUDP(append(append([]byte(nil), hdr...), "early"...), relay)
				require.NoError(t, err)
				require.Eventually(t, func() bool {
					return promtest.ToFloat64(c.Metrics.UDP.DropsTotal.WithLabelValues(udpflow.DropForeignSource)) == 1
				}, 5*time.Second, 10*time.Millisecond, "the undeclared socket is dropped before the declared one sent")
			}
			require.True(t, udpRoundTrip(t, first, relay, hdr, "mine"), "the association's socket is relayed")
			drops := promtest.ToFloat64(c.Metrics.UDP.DropsTotal.WithLabelValues(udpflow.DropForeignSource))
			_, err := second.WriteToUDP(append(append([]byte(nil), hdr...), "borrowed"...), relay)
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				return promtest.ToFloat64(c.Metrics.UDP.DropsTotal.WithLabelValues(udpflow.DropForeignSource)) == drops+1
			}, 5*time.Second, 10*time.Millisecond, "another local port on the same IP is dropped")
			_ = second.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			_, err = second.Read(make([]byte, 2048))
			require.Error(t, err, "no answer to the other socket")
			assert.Equal(t, 1.0, promtest.ToFloat64(c.Metrics.UDP.FlowsActive), "one flow: the association's socket's")
		})
	}
}

// udpSocket opens a UDP socket on 127.0.0.1, closed at the end of the test.
func udpSocket(t *testing.T) *net.UDPConn {
	t.Helper()
	s, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func addrPortOf(s *net.UDPConn) netip.AddrPort {
	return netip.MustParseAddrPort(s.LocalAddr().String())
}

// udpRoundTrip sends msg with hdr through relay from s (a few tries: UDP)
// and reports whether the echo came back.
func udpRoundTrip(t *testing.T, s *net.UDPConn, relay *net.UDPAddr, hdr []byte, msg string) bool {
	t.Helper()
	buf := make([]byte, 2048)
	for range 5 {
		_, err := s.WriteToUDP(append(append([]byte(nil), hdr...), msg...), relay)
		require.NoError(t, err)
		_ = s.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := s.Read(buf)
		if err != nil {
			continue
		}
		_, payload, err := socks5.ParseUDP(buf[:n])
		require.NoError(t, err)
		if string(payload) == msg {
			return true
		}
	}
	return false
}

// socksAssociateFrom opens a SOCKS5 UDP ASSOCIATE on addr declaring client
// (DST.ADDR and DST.PORT) and returns the control connection and the relay.
func socksAssociateFrom(t *testing.T, addr string, client socks5.Addr) (net.Conn, *net.UDPAddr) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	ip := client.IP.As4()
	req := []byte{5, 1, 0, 5, 3, 0, 1, ip[0], ip[1], ip[2], ip[3], byte(client.Port >> 8), byte(client.Port)}
	_, err = c.Write(req)
	require.NoError(t, err)
	resp := make([]byte, 2+10)
	_, err = io.ReadFull(c, resp)
	require.NoError(t, err)
	require.Equal(t, []byte{5, 0, 5, 0, 0, 1}, resp[:6], "UDP ASSOCIATE succeeded with an IPv4 relay address")
	_ = c.SetDeadline(time.Time{})
	return c, &net.UDPAddr{IP: net.IP(resp[6:10]), Port: int(resp[10])<<8 | int(resp[11])}
}

// TestIdleProxyConnectionsDoNotStopForwards (issue 21 item 5): connections
// to a proxy entry point that have not authenticated and sent their request
// wait in a budget of their own, not in --max-connections: more idle ones
// than --max-connections leave a TCP and a UDP forward working.
func TestIdleProxyConnectionsDoNotStopForwards(t *testing.T) {
	t.Parallel()
	echo, udpEcho := testutil.EchoServer(t), testutil.UDPEchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo, "udp:" + udpEcho}})
	const limit = 20
	var proxyAddr string
	udpAddr, c := udpForward(t, srv, "udp:"+udpEcho, func(cfg *client.Config) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		proxyAddr = ln.Addr().String()
		tcp, err := token.NewSource(token.PluginFixed, "tcp:"+echo, nil)
		require.NoError(t, err)
		cfg.Tokens = tcp
		cfg.MaxConnections = limit
		cfg.Forwards = append(cfg.Forwards, client.Forward{Listener: ln, Proxy: ingress.SOCKS5{
			Credentials: ingress.NewProxyCredentials(socks5.UserPass{User: "app", Password: "s3cret"}),
		}})
	})
	for i := range limit + 5 {
		idle, err := net.Dial("tcp", proxyAddr)
		if !assert.NoError(t, err, "idle proxy connection %d", i) {
			continue
		}
		t.Cleanup(func() { _ = idle.Close() })
	}
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(c.Metrics.AcceptedTotal) == limit+5
	}, 5*time.Second, 10*time.Millisecond, "the idle proxy connections were accepted")

	app := udpSocket(t)
	dst, err := net.ResolveUDPAddr("udp", udpAddr)
	require.NoError(t, err)
	got := false
	for try := 0; try < 5 && !got; try++ {
		_, err := app.WriteToUDP(packet(7, 100), dst)
		require.NoError(t, err)
		_ = app.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 2048)
		n, err := app.Read(buf)
		got = err == nil && checkPacket(t, buf[:n]) == 7
	}
	assert.True(t, got, "the UDP forward carries a flow")

	conn, err := net.Dial("tcp", c.Addr)
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = conn.Write([]byte("x"))
	require.NoError(t, err)
	_, err = io.ReadFull(conn, make([]byte, 1))
	require.NoError(t, err, "the TCP forward carries a connection")
	_ = conn.SetDeadline(time.Time{})
	echoCheck(t, conn, 64<<10)
	assert.Equal(t, 0.0, promtest.ToFloat64(c.Metrics.StreamsTotal.WithLabelValues("overloaded")), "nothing refused for the limit")
	assert.Equal(t, 0.0, promtest.ToFloat64(c.Metrics.UDP.DropsTotal.WithLabelValues(udpflow.DropFlowLimit)), "nothing dropped for the limit")
}

// TestProxyBudgets: proxy connections still sending their request hold one
// of --max-proxy-handshakes (more are reset) for at most the handshake
// timeout; a request read while --max-connections are in use is answered
// 503 (HTTP CONNECT) and counted as overloaded.
func TestProxyBudgets(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true, Mutate: func(cfg *client.Config) {
		cfg.MaxConnections, cfg.MaxProxyHandshakes = 1, 2
		cfg.Forwards = []client.Forward{{Listener: ln, Proxy: ingress.HTTPConnect{}}}
	}})
	addr := ln.Addr().String()
	var idle []net.Conn
	for range 2 {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		idle = append(idle, conn)
	}
	require.Eventually(t, func() bool { return promtest.ToFloat64(c.Metrics.AcceptedTotal) == 2 }, 5*time.Second, 10*time.Millisecond)
	// Beyond the handshake budget: reset (so soon on loopback that the
	// dial itself may see it).
	third, err := net.Dial("tcp", addr)
	if err == nil {
		defer third.Close()
		_ = third.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = third.Read(make([]byte, 1))
	}
	require.ErrorIs(t, err, syscall.ECONNRESET, "beyond the handshake budget: reset")
	assert.Equal(t, 1.0, promtest.ToFloat64(c.Metrics.StreamsTotal.WithLabelValues("overloaded")))

	// The forward holds the only --max-connections slot.
	fw, err := net.Dial("tcp", c.Addr)
	require.NoError(t, err)
	defer fw.Close()
	_ = fw.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = fw.Write([]byte("x"))
	require.NoError(t, err)
	_, err = io.ReadFull(fw, make([]byte, 1))
	require.NoError(t, err, "the forward's tunnel is open")
	// The idle ones are closed at the handshake timeout, which frees the budget.
	for _, conn := range idle {
		_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		_, err := conn.Read(make([]byte, 1))
		require.Error(t, err)
		assert.NotErrorIs(t, err, os.ErrDeadlineExceeded, "closed by the client")
	}
	c2, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = io.WriteString(c2, "CONNECT "+echo+" HTTP/1.1\r\nHost: "+echo+"\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c2), &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "read, but --max-connections are in use")
	assert.Equal(t, 2.0, promtest.ToFloat64(c.Metrics.StreamsTotal.WithLabelValues("overloaded")))
}
