package integration

import (
	"context"
	"crypto/tls"
	"net"
	"net/netip"
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

// signedHeader encodes a header for token made at at, with the shared secret:
// what a captured header (from a log, a core dump) looks like.
func signedHeader(t *testing.T, token string, at time.Time) []byte {
	t.Helper()
	h, err := proto.NewHeader(token, at)
	require.NoError(t, err)
	b, err := h.Append(nil, testutil.Secret)
	require.NoError(t, err)
	return b
}

// streamResult opens a stream on c, writes b and returns proto.CodeOK when
// the server replied OK, or the code the server reset the stream with.
func streamResult(t *testing.T, c *quic.Conn, b []byte) proto.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	str, err := c.OpenStreamSync(ctx)
	require.NoError(t, err)
	defer func() { str.CancelRead(0); str.CancelWrite(0) }()
	_, err = str.Write(b)
	require.NoError(t, err)
	_ = str.SetReadDeadline(time.Now().Add(10 * time.Second))
	err = proto.ReadReply(str)
	if err == nil {
		return proto.CodeOK
	}
	code, ok := proto.FromError(err)
	require.True(t, ok, "want a reply or a reset with a code, got %v", err)
	return code
}

// TestHeaderFreshnessOnEveryStream (issue 11 item 3): a header with a valid
// MAC but outside the replay window, or one already used, opens no tunnel on a
// 1-RTT stream either, on any connection.
func TestHeaderFreshnessOnEveryStream(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	a, b := attackerConn(t, srv), attackerConn(t, srv)
	require.True(t, transport.HandshakeComplete(a), "1-RTT streams")

	assert.Equal(t, proto.CodeOK, streamResult(t, a, signedHeader(t, "tcp:"+echo, time.Now())), "a fresh header")
	assert.Equal(t, proto.CodeReplay, streamResult(t, a, signedHeader(t, "tcp:"+echo, time.Now().Add(-10*time.Minute))), "too old")
	assert.Equal(t, proto.CodeReplay, streamResult(t, b, signedHeader(t, "tcp:"+echo, time.Now().Add(-24*time.Hour))), "far too old")
	assert.Equal(t, proto.CodeReplay, streamResult(t, b, signedHeader(t, "tcp:"+echo, time.Now().Add(10*time.Minute))), "from the future")

	captured := signedHeader(t, "tcp:"+echo, time.Now())
	assert.Equal(t, proto.CodeOK, streamResult(t, a, captured))
	assert.Equal(t, proto.CodeReplay, streamResult(t, b, captured), "the same header on another connection")
	assert.Equal(t, proto.CodeReplay, streamResult(t, a, captured), "and on the same one")
	assert.Equal(t, 5.0, promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("replay")))
	require.NoError(t, a.Context().Err(), "a stale header is not an authentication failure: the connection stays")
}

// zeroRTTResult resumes a session of tlsConf with 0-RTT and returns the result
// of one stream carrying b as early data.
func zeroRTTResult(t *testing.T, srv *testutil.Server, tlsConf *tls.Config, b []byte) proto.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := quic.DialAddrEarly(ctx, srv.Addr, tlsConf, transport.QUICConfig(transport.DefaultQUICOptions()))
	require.NoError(t, err)
	defer func() { _ = c.CloseWithError(0, "") }()
	code := streamResult(t, c, b)
	require.True(t, c.ConnectionState().Used0RTT, "the stream went out as 0-RTT data")
	return code
}

// resumableTLS returns a client TLS config with a session ticket from srv.
func resumableTLS(t *testing.T, srv *testutil.Server, echo string) *tls.Config {
	t.Helper()
	pin, err := transport.ParseFingerprint(srv.State.Fingerprint())
	require.NoError(t, err)
	conf, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}, SessionCache: tls.NewLRUClientSessionCache(4)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := quic.DialAddr(ctx, srv.Addr, conf, transport.QUICConfig(transport.DefaultQUICOptions()))
	require.NoError(t, err)
	// After a round trip the server's session ticket has arrived.
	require.Equal(t, proto.CodeOK, streamResult(t, c, signedHeader(t, "tcp:"+echo, time.Now())))
	_ = c.CloseWithError(0, "")
	return conf
}

// TestRefusedHeadersDoNotFillReplayCache (issue 11 item 4): headers the
// allow-list refuses, or whose token does not parse, take no place in the
// shared replay cache, so they cannot make other clients' 0-RTT streams fail.
func TestRefusedHeadersDoNotFillReplayCache(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.MaxReplayEntries = 8
	}})
	resumable := resumableTLS(t, srv, echo) // records one nonce
	filler := attackerConn(t, srv)
	for range 10 {
		require.Equal(t, proto.CodeRefused, streamResult(t, filler, signedHeader(t, "tcp:127.0.0.1:1", time.Now())))
		require.Equal(t, proto.CodeBadToken, streamResult(t, filler, signedHeader(t, "nonsense", time.Now())))
	}
	assert.Equal(t, proto.CodeOK, zeroRTTResult(t, srv, resumable, signedHeader(t, "tcp:"+echo, time.Now())),
		"another client's 0-RTT stream is served")
	assert.Equal(t, 2.0, promtest.ToFloat64(srv.Metrics.ReplayCacheEntries), "only the two served headers were recorded")
}

// TestReplayCacheQuotaPerConnection (issue 11 item 4): one connection records
// at most --max-replay-entries-per-conn nonces per window; its further 1-RTT
// streams are served unrecorded, and 0-RTT streams of others still find room.
func TestReplayCacheQuotaPerConnection(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.MaxReplayEntries = 8
		c.MaxReplayEntriesPerConn = 3
	}})
	resumable := resumableTLS(t, srv, echo)
	greedy := attackerConn(t, srv) // has the secret here: a client that opens many tunnels
	for i := range 12 {
		require.Equal(t, proto.CodeOK, streamResult(t, greedy, signedHeader(t, "tcp:"+echo, time.Now())), "tunnel %d", i)
	}
	assert.Equal(t, 4.0, promtest.ToFloat64(srv.Metrics.ReplayCacheEntries), "1 + the greedy connection's quota of 3")
	assert.Equal(t, 9.0, promtest.ToFloat64(srv.Metrics.ReplayUnrecordedTotal.WithLabelValues("conn_quota")))
	assert.Equal(t, proto.CodeOK, zeroRTTResult(t, srv, resumable, signedHeader(t, "tcp:"+echo, time.Now())))
	assert.Zero(t, promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("overloaded")))
}

// TestUnknownKindRefused (issue 12): a stream of a kind this server does not
// serve (a reverse bind, or one unknown) is refused with unsupported, after
// authentication, not carried as TCP; a UDP flow to a tcp: destination is a
// bad token; a TCP stream on the same connection still works.
func TestUnknownKindRefused(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo, "tcp:127.0.0.1:53"}})
	c := attackerConn(t, srv)
	for _, k := range []proto.Kind{proto.KindReverse, 200} {
		h, err := proto.NewHeader("tcp:127.0.0.1:53", time.Now())
		require.NoError(t, err)
		h.Kind = k
		b, err := h.Append(nil, testutil.Secret)
		require.NoError(t, err)
		assert.Equal(t, proto.CodeUnsupported, streamResult(t, c, b), "kind %s", k)
	}
	h, err := proto.NewHeader("tcp:127.0.0.1:53", time.Now())
	require.NoError(t, err)
	h.Kind = proto.KindUDP
	b, err := h.Append(nil, testutil.Secret)
	require.NoError(t, err)
	assert.Equal(t, proto.CodeBadToken, streamResult(t, c, b), "a UDP flow names a udp: destination")
	assert.Equal(t, proto.CodeOK, streamResult(t, c, signedHeader(t, "tcp:"+echo, time.Now())))
	assert.Equal(t, 2.0, promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("unsupported")))
}

// signedHello encodes a hello made at at, with the shared secret.
func signedHello(t *testing.T, at time.Time) []byte {
	t.Helper()
	h, err := proto.NewHello(at)
	require.NoError(t, err)
	b, err := h.Append(nil, testutil.Secret)
	require.NoError(t, err)
	return b
}

// TestStaleOrReplayedHeaderProvesNothing (issue 21 item 3): a header with a
// valid MAC that fails freshness (an hour old) or replay (the bytes of a
// header already used) is refused with replay and does not count as proof of
// the secret, on any number of connections: each keeps the stream credit of
// the unverified budget and is closed by --auth-timeout, with timeout (the
// MAC was good: a client whose clock is off must not report its secret as
// refused). Nor does a header the rules refuse, a tunnel's or a destination
// check's: its replay check, which comes after the rules, never ran.
func TestStaleOrReplayedHeaderProvesNothing(t *testing.T) {
	t.Parallel()
	const budget = 4
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.HeaderTimeout = time.Minute // header-less streams wait for the deadline
		c.AuthTimeout = 3 * time.Second
		c.IdleAuthTimeout = time.Minute
		c.MaxUnverifiedStreamsPerConn = budget
	}})
	// The client whose header leaks (in a log, a core dump) has used it.
	used := attackerConn(t, srv)
	captured := signedHeader(t, "tcp:"+echo, time.Now())
	require.Equal(t, proto.CodeOK, streamResult(t, used, captured))

	closed := 0
	for _, tc := range []struct {
		name   string
		header []byte
		want   proto.Code
	}{
		{"an hour old", signedHeader(t, "tcp:"+echo, time.Now().Add(-time.Hour)), proto.CodeReplay},
		{"a hello an hour old", signedHello(t, time.Now().Add(-time.Hour)), proto.CodeReplay},
		{"replayed", captured, proto.CodeReplay},
		{"refused destination", signedHeader(t, "tcp:127.0.0.1:1", time.Now()), proto.CodeRefused},
		{"refused destination check", signedCheck(t, "tcp:127.0.0.1:1", time.Now(), testutil.Secret), proto.CodeRefused}, // issue 30 I2
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 2 { // the same bytes on another connection
				c := attackerConn(t, srv)
				require.Equal(t, tc.want, streamResult(t, c, tc.header), "connection %d", i)
				// A verified connection gets --max-streams-per-conn (100)
				// at once; an unverified one only what its refused stream
				// gave back.
				assert.LessOrEqual(t, openHeaderless(c, 3*budget, time.Second), budget,
					"connection %d: stream credit stays at the unverified budget", i)
				requireClosedByServer(t, c, proto.CodeTimeout, 30*time.Second)
				closed++
			}
		})
	}
	assert.Equal(t, float64(closed), promtest.ToFloat64(srv.Metrics.PreauthRejectionsTotal.WithLabelValues(metrics.PreauthAuthTimeout)),
		"every connection was closed by --auth-timeout")
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.ConnectionsTotal.WithLabelValues("auth_timeout")) == float64(closed)
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, used.Context().Err(), "the connection that used the header first is verified")
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv.Metrics.UnverifiedStreams) == 0 }, 10*time.Second, 10*time.Millisecond)
}

// blockingResolver answers every lookup with 127.0.0.1, once release is
// closed; it counts the lookups waiting.
type blockingResolver struct {
	release chan struct{}
	waiting atomic.Int32
}

func (r *blockingResolver) LookupNetIP(ctx context.Context, _, _ string) ([]netip.Addr, error) {
	r.waiting.Add(1)
	defer r.waiting.Add(-1)
	select {
	case <-r.release:
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestSlowLookupOnVerifiedConnection: on a connection that has proven the
// secret, a stream frees its place in the unverified budget once its MAC is
// verified, as before issue 21 item 3, not after the rules: streams whose
// destination name takes long to resolve do not hold the connection's
// other streams back.
func TestSlowLookupOnVerifiedConnection(t *testing.T) {
	t.Parallel()
	const budget = 2
	echo := testutil.EchoServer(t)
	_, port, err := net.SplitHostPort(echo)
	require.NoError(t, err)
	r := &blockingResolver{release: make(chan struct{})}
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:127.0.0.0/8:" + port}, Mutate: func(c *server.Config) {
		c.Resolver = r
		c.MaxUnverifiedStreamsPerConn = budget
	}})
	t.Cleanup(func() { close(r.release) })
	c := attackerConn(t, srv) // has the secret here
	require.Equal(t, proto.CodeOK, streamResult(t, c, signedHeader(t, "tcp:"+echo, time.Now())), "verifies the connection")

	for range budget {
		str, err := c.OpenStream()
		require.NoError(t, err)
		t.Cleanup(func() { str.CancelRead(0); str.CancelWrite(0) })
		_, err = str.Write(signedHeader(t, "tcp:slow.example:"+port, time.Now()))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return r.waiting.Load() == budget }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, proto.CodeOK, streamResult(t, c, signedHeader(t, "tcp:"+echo, time.Now())),
		"served while %d lookups wait", budget)
}
