package integration

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/server"
)

// attackerConn dials srv as a peer that completes the QUIC handshake (it pins
// the certificate, as anyone can) but does not know the shared secret.
func attackerConn(t *testing.T, srv *testutil.Server) *quic.Conn {
	t.Helper()
	pin, err := transport.ParseFingerprint(srv.State.Fingerprint())
	require.NoError(t, err)
	ctls, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := quic.DialAddr(ctx, srv.Addr, ctls, transport.QUICConfig(transport.DefaultQUICOptions()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.CloseWithError(0, "") })
	return c
}

// sourceDialer dials a server from one source address, as a peer that pins
// the server's certificate (as anyone can) but holds no secret.
type sourceDialer struct {
	tr     *quic.Transport
	tls    *tls.Config
	server *net.UDPAddr
}

// dialerFrom returns a sourceDialer for srv from ip (a loopback address
// other than the clients', 127.0.0.1), closed when the test ends.
func dialerFrom(t *testing.T, srv *testutil.Server, ip net.IP) *sourceDialer {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip})
	require.NoError(t, err)
	tr := &quic.Transport{Conn: pc}
	t.Cleanup(func() { _ = tr.Close(); _ = pc.Close() })
	pin, err := transport.ParseFingerprint(srv.State.Fingerprint())
	require.NoError(t, err)
	ctls, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}})
	require.NoError(t, err)
	sa, err := net.ResolveUDPAddr("udp", srv.Addr)
	require.NoError(t, err)
	return &sourceDialer{tr: tr, tls: ctls, server: sa}
}

// dial opens one connection within timeout.
func (d *sourceDialer) dial(timeout time.Duration) (*quic.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.tr.Dial(ctx, d.server, d.tls, transport.QUICConfig(transport.DefaultQUICOptions()))
}

// attackerConnsFrom dials n connections to srv as attackerConn does, all
// from one source address ip.
func attackerConnsFrom(t *testing.T, srv *testutil.Server, ip net.IP, n int) []*quic.Conn {
	t.Helper()
	from := dialerFrom(t, srv, ip)
	cs := make([]*quic.Conn, n)
	for i := range cs {
		c, err := from.dial(10 * time.Second)
		require.NoError(t, err, "connection %d", i)
		t.Cleanup(func() { _ = c.CloseWithError(0, "") })
		cs[i] = c
	}
	return cs
}

// openHeaderless opens n streams on c and writes one byte on each (so the
// server sees them), never a complete header. It stops early if c closes or
// no stream credit comes within wait.
func openHeaderless(c *quic.Conn, n int, wait time.Duration) int {
	opened := 0
	for range n {
		ctx, cancel := context.WithTimeout(c.Context(), wait)
		str, err := c.OpenStreamSync(ctx)
		cancel()
		if err != nil {
			return opened
		}
		if _, err := str.Write([]byte{1}); err != nil {
			return opened
		}
		opened++
	}
	return opened
}

// serverBytesReceived sums what the server's live connections received.
func serverBytesReceived(srv *testutil.Server) uint64 {
	var n uint64
	for _, cs := range srv.ConnStats() {
		n += cs.Stats.BytesReceived
	}
	return n
}

// TestUnauthenticatedStreamFlood reproduces issue 11's item 1: a peer without
// the secret tries to open 10,000 header-less streams on each of 2
// connections. Before it has shown a valid header a connection gets stream
// credit for the unverified budget only (16), so the server holds 16 streams
// and goroutines per connection, a client with the secret is still served,
// and both connections are closed once --auth-timeout has passed.
func TestUnauthenticatedStreamFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 20,000 streams")
	}
	const conns, perConn, budget = 2, 10000, 16
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.HeaderTimeout = time.Minute // the streams wait as long as the test needs
		c.AuthTimeout = 5 * time.Second
	}})
	base := runtime.NumGoroutine()
	baseMem := memInUse()

	cs := make([]*quic.Conn, conns)
	for i := range cs {
		cs[i] = attackerConn(t, srv)
	}
	attackerGoroutines := runtime.NumGoroutine() - base
	var wg sync.WaitGroup
	opened := make([]int, conns)
	for i, c := range cs {
		wg.Go(func() { opened[i] = openHeaderless(c, perConn, time.Second) })
	}
	wg.Wait()
	require.Equal(t, []int{budget, budget}, opened, "stream credit before authentication is the unverified budget")
	// Every STREAM frame (type, id, 1 byte) is at least 4 bytes: wait until
	// the server has received them all.
	require.Eventually(t, func() bool { return serverBytesReceived(srv) >= uint64(conns*budget*4) }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv.Metrics.UnverifiedStreams) == conns*budget },
		10*time.Second, 10*time.Millisecond, "each connection fills its budget")

	// The accept loop runs as the frames arrive; take the peak over a second.
	peak := 0
	for range 100 {
		peak = max(peak, runtime.NumGoroutine()-base-attackerGoroutines)
		time.Sleep(10 * time.Millisecond)
	}
	mem := memInUse()
	t.Logf("%d header-less streams tried over %d connections, %d opened: server goroutines +%d (peak), heap+stacks %+.1f MiB (both ends)",
		conns*perConn, conns, opened[0]+opened[1], peak, (float64(mem)-float64(baseMem))/(1<<20))
	require.LessOrEqual(t, peak, conns*budget+100, "a fixed budget of goroutines per unauthenticated connection")
	assert.Equal(t, float64(conns*budget), promtest.ToFloat64(srv.Metrics.UnverifiedStreams), "never more than the budget")

	// A client with the secret is served meanwhile.
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})
	require.NoError(t, echoOK(cl.Addr))

	// --auth-timeout closes the attacker's connections, with auth_failed.
	for _, c := range cs {
		requireClosedByServer(t, c, proto.CodeAuthFailed, 60*time.Second)
	}
	assert.Equal(t, float64(conns), promtest.ToFloat64(srv.Metrics.PreauthRejectionsTotal.WithLabelValues(metrics.PreauthAuthTimeout)))
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv.Metrics.UnverifiedStreams) == 0 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, echoOK(cl.Addr), "the client's connection is not affected")
	assert.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.ConnectionsTotal.WithLabelValues("auth_failed")) == conns
	}, 30*time.Second, 10*time.Millisecond, "counted as closed for auth_failed")
	for _, r := range []string{"closed", "idle_timeout", "auth_failed", "shutdown", "error"} {
		t.Logf("connections_total{result=%q} %v", r, promtest.ToFloat64(srv.Metrics.ConnectionsTotal.WithLabelValues(r)))
	}
}

// TestAuthTimeout: a connection that opens streams but never presents a
// verified header is closed with auth_failed once --auth-timeout has passed
// since its first stream; a connection without streams is timed from its
// handshake only (--idle-auth-timeout, TestIdleAuthTimeout).
func TestAuthTimeout(t *testing.T) {
	t.Parallel()
	srv := testutil.StartServer(t, testutil.ServerOptions{Mutate: func(c *server.Config) {
		c.HeaderTimeout = time.Minute
		c.AuthTimeout = 500 * time.Millisecond
		c.IdleAuthTimeout = time.Minute
		c.MaxUnverifiedStreamsPerConn = 4
	}})
	idle := attackerConn(t, srv)
	c := attackerConn(t, srv)
	require.Equal(t, 4, openHeaderless(c, 20, time.Second), "credit for the unverified budget only")
	requireClosedByServer(t, c, proto.CodeAuthFailed, 30*time.Second)
	assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.PreauthRejectionsTotal.WithLabelValues(metrics.PreauthAuthTimeout)))
	require.NoError(t, idle.Context().Err(), "a connection without streams is not timed by --auth-timeout")
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv.Metrics.UnverifiedStreams) == 0 }, 10*time.Second, 10*time.Millisecond)
}

// TestIdleAuthTimeout: a connection that presents no verified header, and
// opens no stream, is closed once --idle-auth-timeout has passed since its
// handshake, with timeout (a client from before the hello just reconnects),
// counted as auth_timeout. Before the hello such connections lived until the
// client left.
func TestIdleAuthTimeout(t *testing.T) {
	t.Parallel()
	const idle = 500 * time.Millisecond
	srv := testutil.StartServer(t, testutil.ServerOptions{Mutate: func(c *server.Config) {
		c.AuthTimeout = time.Minute
		c.IdleAuthTimeout = idle
	}})
	start := time.Now()
	c := attackerConn(t, srv)
	requireClosedByServer(t, c, proto.CodeTimeout, 30*time.Second)
	assert.GreaterOrEqual(t, time.Since(start), idle, "not before the timeout")
	assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.PreauthRejectionsTotal.WithLabelValues(metrics.PreauthAuthTimeout)))
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.ConnectionsTotal.WithLabelValues("auth_timeout")) == 1
	}, 10*time.Second, 10*time.Millisecond)
}

// TestHelloKeepsIdleClientConnected: a client with the secret proves it at
// once on each connection (its hello), so it stays connected while idle far
// beyond both deadlines. The hello is no tunnel: it is not in the registry
// or the stream metrics of either end.
func TestHelloKeepsIdleClientConnected(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.AuthTimeout = 200 * time.Millisecond
		c.IdleAuthTimeout = 200 * time.Millisecond
	}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})
	require.Never(t, func() bool {
		return promtest.ToFloat64(cl.Metrics.ReconnectsTotal) > 0 || !cl.Ready()
	}, 2*time.Second, 20*time.Millisecond, "connected and ready while idle for ten times the deadlines")
	assert.Zero(t, promtest.ToFloat64(srv.Metrics.PreauthRejectionsTotal.WithLabelValues(metrics.PreauthAuthTimeout)))
	assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.ActiveConnections))

	assert.Zero(t, srv.Server.Registry().Len(), "the hello is not a tunnel")
	assert.Zero(t, cl.Client.Registry().Len())
	for _, c := range proto.AllCodes() {
		assert.Zero(t, promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues(c.String())), "server streams_total{result=%q}", c)
		assert.Zero(t, promtest.ToFloat64(cl.Metrics.StreamsTotal.WithLabelValues(c.String())), "client streams_total{result=%q}", c)
	}
	assert.Zero(t, promtest.ToFloat64(srv.Metrics.UnverifiedStreams))
	require.NoError(t, echoOK(cl.Addr))
	// The server counts the tunnel as it ends, after the client's close
	// reaches it: a moment after echoOK returns (CI read 0 at once).
	ok := func() float64 { return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues(metrics.ResultOK)) }
	require.Eventually(t, func() bool { return ok() >= 1 }, 10*time.Second, time.Millisecond, "the tunnel is counted")
	assert.Equal(t, 1.0, ok(), "one tunnel, counted once")
	assert.Zero(t, promtest.ToFloat64(cl.Metrics.ReconnectsTotal))
}

// TestUnverifiedStreamsServerBudget: past --max-unverified-streams across the
// server, streams of unauthenticated connections are reset with overloaded at
// once (and counted); a client with the secret still gets through.
func TestUnverifiedStreamsServerBudget(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.HeaderTimeout = time.Minute
		c.AuthTimeout = time.Minute
		c.MaxUnverifiedStreams = 5
	}})
	c := attackerConn(t, srv)
	var held []*quic.Stream
	for range 5 {
		str, err := c.OpenStream()
		require.NoError(t, err)
		_, err = str.Write([]byte{1})
		require.NoError(t, err)
		held = append(held, str)
	}
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv.Metrics.UnverifiedStreams) == 5 }, 10*time.Second, 5*time.Millisecond)
	for i := range 3 {
		str, err := c.OpenStream()
		require.NoError(t, err)
		_, err = str.Write([]byte{1})
		require.NoError(t, err)
		_ = str.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = str.Read(make([]byte, 1))
		var se *quic.StreamError
		require.ErrorAs(t, err, &se, "stream %d", i)
		assert.Equal(t, proto.CodeOverloaded.StreamErrorCode(), se.ErrorCode)
	}
	require.Equal(t, 3.0, promtest.ToFloat64(srv.Metrics.PreauthRejectionsTotal.WithLabelValues(metrics.PreauthUnverifiedStreamsLimit)))
	assert.Equal(t, 5.0, promtest.ToFloat64(srv.Metrics.UnverifiedStreams))
	// A verified connection's streams do not need the server-wide budget.
	// Its first stream (the hello) does, as the connection is not verified
	// yet: refused with overloaded, the client is not ready and tries again.
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo})
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.PreauthRejectionsTotal.WithLabelValues(metrics.PreauthUnverifiedStreamsLimit)) >= 4
	}, 10*time.Second, 5*time.Millisecond, "the client's hello is refused")
	assert.False(t, cl.Ready(), "not ready before the server accepted a header")
	held[0].CancelWrite(0) // a place frees: the hello gets through
	require.Eventually(t, cl.Ready, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, echoOK(cl.Addr))
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Go(func() { errs[i] = echoOK(cl.Addr) })
	}
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "tunnel %d of a verified client", i)
	}
}

// TestUnverifiedStreamsShareOfOneSource: one source (127.0.0.2) opens
// header-less streams on many connections, enough to fill the server-wide
// --max-unverified-streams budget. It gets only its share
// (--max-unverified-streams-per-source); the rest are reset with overloaded
// and counted, and a client with the secret on another address still gets
// its first tunnel through, which needs a place in the server-wide budget.
func TestUnverifiedStreamsShareOfOneSource(t *testing.T) {
	t.Parallel()
	const perConn, share, global, conns = 4, 16, 32, 8 // conns*perConn fills global
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.HeaderTimeout = time.Minute
		c.AuthTimeout = time.Minute
		c.MaxUnverifiedStreamsPerConn = perConn
		c.MaxUnverifiedStreams = global
		c.MaxUnverifiedStreamsPerSource = share
	}})
	var strs []*quic.Stream
	for _, c := range attackerConnsFrom(t, srv, net.IPv4(127, 0, 0, 2), conns) {
		for range perConn {
			str, err := c.OpenStream()
			require.NoError(t, err)
			_, err = str.Write([]byte{1})
			require.NoError(t, err)
			strs = append(strs, str)
		}
	}
	// Every stream is either held (waiting for its header) or reset.
	reset := func() float64 {
		return promtest.ToFloat64(srv.Metrics.PreauthRejectionsTotal.WithLabelValues(metrics.PreauthSourceUnverifiedStreamsLimit)) +
			promtest.ToFloat64(srv.Metrics.PreauthRejectionsTotal.WithLabelValues(metrics.PreauthUnverifiedStreamsLimit))
	}
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.UnverifiedStreams)+reset() == conns*perConn
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, float64(share), promtest.ToFloat64(srv.Metrics.UnverifiedStreams), "the source holds its share")
	assert.Equal(t, float64(conns*perConn-share),
		promtest.ToFloat64(srv.Metrics.PreauthRejectionsTotal.WithLabelValues(metrics.PreauthSourceUnverifiedStreamsLimit)))
	resets := 0
	for _, str := range strs {
		_ = str.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := str.Read(make([]byte, 1))
		var se *quic.StreamError
		if errors.As(err, &se) {
			assert.Equal(t, proto.CodeOverloaded.StreamErrorCode(), se.ErrorCode)
			resets++
		}
	}
	assert.Equal(t, conns*perConn-share, resets, "the streams over the share are reset with overloaded")

	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})
	require.NoError(t, echoOK(cl.Addr), "a client on another address is served")
}

// TestBurstOfStreamsFromANewClient: a client with the secret that opens many
// tunnels at once on a fresh connection is served in full: streams past the
// unverified budget wait for a slot, they are not reset.
func TestBurstOfStreamsFromANewClient(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.MaxUnverifiedStreamsPerConn = 2
	}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo})
	var wg sync.WaitGroup
	errs := make([]error, 64)
	for i := range errs {
		wg.Go(func() { errs[i] = echoOK(cl.Addr) })
	}
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "tunnel %d", i)
	}
	assert.Zero(t, promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues(proto.CodeOverloaded.String())))
}

// TestMaxConnections: past --max-connections new connections are refused
// (counted by reason), and a place frees when a connection ends.
func TestMaxConnections(t *testing.T) {
	t.Parallel()
	srv := testutil.StartServer(t, testutil.ServerOptions{Mutate: func(c *server.Config) { c.MaxConnections = 2 }})
	a := attackerConn(t, srv)
	attackerConn(t, srv)
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv.Metrics.ActiveConnections) == 2 }, 10*time.Second, 5*time.Millisecond)

	pin, err := transport.ParseFingerprint(srv.State.Fingerprint())
	require.NoError(t, err)
	ctls, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := quic.DialAddr(ctx, srv.Addr, ctls, transport.QUICConfig(transport.DefaultQUICOptions()))
	if err == nil {
		// Admitted by the early check in a race with the second one: then
		// it is closed with overloaded once counted.
		<-c.Context().Done()
		err = context.Cause(c.Context())
	}
	var te *quic.TransportError
	var ae *quic.ApplicationError
	switch {
	case errors.As(err, &te):
		assert.Contains(t, []quic.TransportErrorCode{quic.ConnectionRefused, quic.ApplicationErrorErrorCode}, te.ErrorCode, "%v", err)
	case errors.As(err, &ae):
		assert.Equal(t, proto.CodeOverloaded.ApplicationErrorCode(), ae.ErrorCode)
	default:
		t.Fatalf("the third connection was not refused: %v", err)
	}
	assert.GreaterOrEqual(t, promtest.ToFloat64(srv.Metrics.RefusedConnectionsTotal.WithLabelValues(metrics.RefusedMaxConnections)), 1.0)

	require.NoError(t, a.CloseWithError(0, ""))
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv.Metrics.ActiveConnections) == 1 }, 10*time.Second, 5*time.Millisecond)
	attackerConn(t, srv) // a place is free again
}

// TestStreamCreditRaisedAfterAuthentication: a connection starts with credit
// for --max-unverified-streams-per-conn streams; its first verified header
// raises it to --max-streams-per-conn at once. Without a shared secret
// (mutual TLS, or none) the full credit is given from the start.
func TestStreamCreditRaisedAfterAuthentication(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.MaxUnverifiedStreamsPerConn = 3
	}})
	c := attackerConn(t, srv) // it has the secret here
	var strs []*quic.Stream
	for range 3 {
		str, err := c.OpenStream()
		require.NoError(t, err)
		strs = append(strs, str)
	}
	_, err := c.OpenStream()
	var limit *quic.StreamLimitReachedError
	require.ErrorAs(t, err, &limit, "credit for 3 streams before authentication")

	_, err = strs[0].Write(signedHeader(t, "tcp:"+echo, time.Now()))
	require.NoError(t, err)
	_ = strs[0].SetReadDeadline(time.Now().Add(10 * time.Second))
	require.NoError(t, proto.ReadReply(strs[0]))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 200 {
		_, err := c.OpenStreamSync(ctx)
		require.NoError(t, err, "stream %d after authentication", i)
	}

	noAuth := testutil.StartServer(t, testutil.ServerOptions{NoAuth: true, Mutate: func(c *server.Config) {
		c.MaxUnverifiedStreamsPerConn = 3
	}})
	nc := attackerConn(t, noAuth)
	for i := range 200 {
		_, err := nc.OpenStream()
		require.NoError(t, err, "stream %d without a shared secret", i)
	}
}

// TestTicketRemembersRaisedStreamCredit: with a shared secret the server
// sends a connection's session ticket only once the peer has presented a
// verified header (a peer without the secret gets none), and the ticket
// remembers the raised credit (quic-go patch 0013): a connection resuming it
// opens more than --max-unverified-streams-per-conn streams in its first
// flight, as re-attachments after an upgrade or an outage do, and the
// server serves them all.
func TestTicketRemembersRaisedStreamCredit(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.MaxUnverifiedStreamsPerConn = 3
	}})
	pin, err := transport.ParseFingerprint(srv.State.Fingerprint())
	require.NoError(t, err)
	tickets := &countingCache{ClientSessionCache: transport.NewStickySessionCache(4)}
	ctls, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}, SessionCache: tickets})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	qconf := transport.QUICConfig(transport.DefaultQUICOptions())
	tokens := &countingTokens{TokenStore: quic.NewLRUTokenStore(4, 4)}
	qconf.TokenStore = tokens

	c, err := quic.DialAddr(ctx, srv.Addr, ctls, qconf)
	require.NoError(t, err)
	// Unverified, the connection has no ticket. The server queues a ticket
	// it sends at the handshake's end before its address-validation token,
	// so once the token is in, a ticket would be too.
	require.Eventually(t, func() bool { return tokens.puts.Load() > 0 }, 10*time.Second, 5*time.Millisecond,
		"the server's address-validation token at the handshake's end")
	assert.Zero(t, tickets.puts.Load(), "a session ticket before a verified header")
	str, err := c.OpenStream()
	require.NoError(t, err)
	_, err = str.Write(signedHeader(t, "tcp:"+echo, time.Now()))
	require.NoError(t, err)
	_ = str.SetReadDeadline(time.Now().Add(10 * time.Second))
	require.NoError(t, proto.ReadReply(str))
	require.Eventually(t, func() bool { return tickets.puts.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the session ticket once the header was verified")
	require.NoError(t, c.CloseWithError(0, ""))

	const streams = 40
	ec, err := quic.DialAddrEarly(ctx, srv.Addr, ctls, qconf)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ec.CloseWithError(0, "") })
	strs := make([]*quic.Stream, streams)
	for i := range strs {
		strs[i], err = ec.OpenStream() // credit now, before the handshake completes
		require.NoError(t, err, "stream %d in the first flight (credit for 3 before the ticket remembered more)", i)
		_, err = strs[i].Write(signedHeader(t, "tcp:"+echo, time.Now()))
		require.NoError(t, err)
	}
	for i, str := range strs {
		_ = str.SetReadDeadline(time.Now().Add(10 * time.Second))
		require.NoError(t, proto.ReadReply(str), "stream %d served", i)
	}
	assert.True(t, ec.ConnectionState().Used0RTT, "the streams went as 0-RTT data")
}

// countingTokens is a QUIC token store that counts the tokens stored.
type countingTokens struct {
	quic.TokenStore
	puts atomic.Int32
}

func (c *countingTokens) Put(key string, t *quic.ClientToken) {
	c.puts.Add(1)
	c.TokenStore.Put(key, t)
}

// requireClosedByServer waits up to limit for the server to close c with
// code.
func requireClosedByServer(t *testing.T, c *quic.Conn, code proto.Code, limit time.Duration) {
	t.Helper()
	select {
	case <-c.Context().Done():
	case <-time.After(limit):
		t.Fatalf("the connection was not closed within %v", limit)
	}
	var ae *quic.ApplicationError
	require.ErrorAs(t, context.Cause(c.Context()), &ae)
	assert.Equal(t, code.ApplicationErrorCode(), ae.ErrorCode)
	assert.True(t, ae.Remote)
}
