package integration

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	quicproxy "github.com/quic-go/quic-go/integrationtests/tools/proxy"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/server"
)

// TestResumeTunnelOpenedAs0RTT (issue 34): a tunnel opened as 0-RTT data
// (a client started with a session ticket, the application connecting
// while its first handshake is still running) is resumable once the
// server accepted the 0-RTT data: it survives a blackout longer than the
// idle timeout, every byte once and in order (SHA-256 both ways). Such
// tunnels were never resumable before, and reset at every upgrade.
func TestResumeTunnelOpenedAs0RTT(t *testing.T) {
	t.Parallel()
	const part = 256 << 10
	dest, gate, dests := serveGated(t, part)
	srvSide := newResumeSide(server.NewResumeMetrics)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + dest}, QUIC: shortIdle,
		Mutate: func(c *server.Config) { c.Resume = srvSide.egress(time.Minute) }})
	var dark atomic.Bool
	// 40 ms each way: the handshake takes 80 ms or more, so the tunnel
	// opened just after the client starts goes as 0-RTT data.
	proxy := lossyProxy(t, srv, 40*time.Millisecond, &dark, nil)
	tickets := &countingCache{ClientSessionCache: transport.NewStickySessionCache(4)}
	shareTickets := func(o *transport.ClientTLSOptions) { o.SessionCache = tickets }

	first := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + dest, ServerAddr: proxy, WaitReady: true, TLS: shareTickets})
	require.Eventually(t, func() bool { return tickets.puts.Load() > 0 }, 10*time.Second, 10*time.Millisecond, "the server sent a session ticket")
	first.Stop(t)

	cliSide := newResumeSide(client.NewResumeMetrics)
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + dest, ServerAddr: proxy, QUIC: shortIdle, TLS: shareTickets,
		Mutate: func(c *client.Config) { c.Resume = cliSide.ingress(time.Minute) }})
	app, far := startGated(t, cl.Addr, part, gate, dests)
	require.Equal(t, 1.0, promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("ok_0rtt")), "the client's first connection resumed with 0-RTT")
	require.Equal(t, 1, cliSide.table.Len(), "the client holds the tunnel opened as 0-RTT data as resumable")
	require.Equal(t, 1, srvSide.table.Len(), "so does the server")

	darkUntilParked(t, &dark, gate, srvSide, cliSide)
	checkGated(t, app, far, part, srvSide, cliSide)
}

// TestEarlyTunnelLostBeforeHandshakeNotKept (issue 34): a resumable
// tunnel the server opened from 0-RTT data on a connection whose
// handshake never completed (nothing reached the client) is not kept
// parked: the client opens it anew on its next connection, so it would
// wait for nobody, holding its destination. The server ends it (gave up,
// reason handshake), the destination's connection is reset, and the
// application's bytes arrive once, through the tunnel opened anew.
func TestEarlyTunnelLostBeforeHandshakeNotKept(t *testing.T) {
	t.Parallel()
	dests := make(chan net.Conn, 2)
	dest := testutil.ServeTCP(t, func(c net.Conn) {
		dests <- c
		<-t.Context().Done()
	})
	srvSide := newResumeSide(server.NewResumeMetrics)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + dest},
		Mutate: func(c *server.Config) { c.Resume = srvSide.egress(time.Minute) }})
	var mute atomic.Bool // drop what the server sends
	proxy := directedProxy(t, srv, func(d quicproxy.Direction) bool { return mute.Load() && d == quicproxy.DirectionOutgoing })
	tickets := &countingCache{ClientSessionCache: transport.NewStickySessionCache(4)}
	shareTickets := func(o *transport.ClientTLSOptions) { o.SessionCache = tickets }
	first := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + dest, ServerAddr: proxy, WaitReady: true, TLS: shareTickets})
	require.Eventually(t, func() bool { return tickets.puts.Load() > 0 }, 10*time.Second, 10*time.Millisecond, "the server sent a session ticket")
	first.Stop(t)

	mute.Store(true)
	cliSide := newResumeSide(client.NewResumeMetrics)
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + dest, ServerAddr: proxy, TLS: shareTickets,
		Mutate: func(c *client.Config) { c.Resume = cliSide.ingress(time.Minute) }})
	app := dial(t, cl.Addr)
	_, err := app.Write([]byte("first"))
	require.NoError(t, err)
	var early net.Conn
	select {
	case early = <-dests:
	case <-time.After(30 * time.Second):
		t.Fatal("the server never opened the 0-RTT tunnel")
	}
	// The server's connection ends at its handshake timeout: the tunnel
	// is ended, not kept, and its destination reset.
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srvSide.metrics.GaveUp.WithLabelValues(resume.GaveUpHandshake)) == 1
	}, 30*time.Second, 10*time.Millisecond, "the server ended the tunnel whose connection never completed its handshake")
	assert.Zero(t, srvSide.table.Len(), "nothing held for it")
	_ = early.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(early)
	assert.Equal(t, "first", string(got))
	assert.True(t, errors.Is(err, syscall.ECONNRESET), "the destination sees a reset, got %v", err)

	mute.Store(false)
	var again net.Conn
	select {
	case again = <-dests:
	case <-time.After(30 * time.Second):
		t.Fatal("the client did not open the tunnel anew")
	}
	_, err = app.Write([]byte(", then more"))
	require.NoError(t, err)
	require.NoError(t, app.CloseWrite())
	_ = again.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err = io.ReadAll(again)
	require.NoError(t, err)
	assert.Equal(t, "first, then more", string(got), "every byte once, through the tunnel opened anew")
}

// directedProxy puts a UDP proxy in front of srv that drops the packets
// drop says to, by direction.
func directedProxy(t *testing.T, srv *testutil.Server, drop func(quicproxy.Direction) bool) string {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	sa, err := net.ResolveUDPAddr("udp", srv.Addr)
	require.NoError(t, err)
	p := &quicproxy.Proxy{Conn: pc, ServerAddr: sa,
		DropPacket: func(d quicproxy.Direction, _, _ net.Addr, _ []byte) bool { return drop(d) }}
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Close(); _ = pc.Close() })
	return pc.LocalAddr().String()
}

// countingCache is a TLS session cache that counts the tickets stored.
type countingCache struct {
	tls.ClientSessionCache
	puts atomic.Int32
}

func (c *countingCache) Put(key string, cs *tls.ClientSessionState) {
	if cs != nil {
		c.puts.Add(1)
	}
	c.ClientSessionCache.Put(key, cs)
}

// TestResumableProxyTunnelPipelinedBytesOnce: a resumable tunnel through
// the HTTP CONNECT entry point whose application sent bytes right after
// its request (written with the stream header, resume.Config.Written)
// delivers them once: the first attachment wrote them again before
// 1ec6dcf ("early bytes|early bytes|later bytes").
func TestResumableProxyTunnelPipelinedBytesOnce(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srvSide, cliSide := newResumeSide(server.NewResumeMetrics), newResumeSide(client.NewResumeMetrics)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo},
		Mutate: func(c *server.Config) { c.Resume = srvSide.egress(time.Minute) }})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:1", WaitReady: true, Mutate: func(c *client.Config) {
		c.Forwards = []client.Forward{{Listener: ln, Proxy: ingress.HTTPConnect{}}}
		c.Resume = cliSide.ingress(time.Minute)
	}})

	code, c, br := httpConnect(t, ln.Addr().String(), echo, "early bytes|")
	require.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool { return cliSide.table.Len() == 1 }, 10*time.Second, 10*time.Millisecond, "the tunnel is resumable")
	_, err = io.WriteString(c, "later bytes")
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Equal(t, "early bytes|later bytes", string(got))
}
