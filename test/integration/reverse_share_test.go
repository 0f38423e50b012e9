package integration

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/server"
)

// refusedListens is the server's count of reverse forward requests refused
// for reason.
func refusedListens(m *metrics.RemoteListens, reason string) float64 {
	return promtest.ToFloat64(m.RefusedTotal.WithLabelValues(reason))
}

// answered is how many reverse forward requests the server answered: the
// listeners open and every refusal.
func answered(m *metrics.RemoteListens) float64 {
	n := promtest.ToFloat64(m.Active)
	for _, r := range server.RemoteListenRefusalReasons() {
		n += refusedListens(m, r)
	}
	return n
}

// TestReverseForwardShareByIdentity (issue 30, R5): one identity cannot
// take every reverse forward listener of the server. Sixteen clients of key
// "a", each asking for 16 listeners (unix sockets: 256 requests, the
// server's whole default limit, which they all held before), together hold
// only a's share, the default eighth (32); the rest are refused with
// overloaded and counted as identity_limit, never server_limit; a client of
// key "b" still gets its listener and carries a connection through it.
func TestReverseForwardShareByIdentity(t *testing.T) {
	t.Parallel()
	const clients, forwards = 16, 16
	echo := testutil.EchoServer(t)
	dir := t.TempDir()
	secretA, secretB := []byte("the secret of group a, 32 bytes!"), []byte("the secret of group b, 32 bytes!")
	kr, err := proto.NewKeyring(proto.Key{Name: "a", Secret: secretA}, proto.Key{Name: "b", Secret: secretB})
	require.NoError(t, err)
	m := server.NewRemoteListenMetrics(prometheus.NewRegistry())
	srv := testutil.StartServer(t, testutil.ServerOptions{Mutate: func(c *server.Config) {
		c.Keys = kr
		c.AllowRemoteListen = endpoint.MustParseAllowList("unix:" + dir + "/*")
		c.Reverse.Events = server.NewReverseMetrics(prometheus.NewRegistry())
		c.RemoteListenMetrics = m
	}})
	share := server.DefaultRemoteListensPerIdentity(server.DefaultMaxRemoteListens, server.DefaultMaxRemoteListensPerConn)
	require.Equal(t, 32, share)

	unixClient := func(secret []byte, names ...string) {
		testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:1", Secret: secret, WaitReady: true, Mutate: func(c *client.Config) {
			var fs []string
			for _, n := range names {
				fs = append(fs, "unix:"+dir+"/"+n+"=tcp:"+echo)
			}
			withRemoteForwards(t, c, fs...)
		}})
	}
	for i := range clients {
		var names []string
		for j := range forwards {
			names = append(names, fmt.Sprintf("a%d-%d.sock", i, j))
		}
		unixClient(secretA, names...)
	}
	require.Eventually(t, func() bool { return answered(m) >= clients*forwards }, 60*time.Second, 20*time.Millisecond,
		"every bind of key a is answered (open %v, answered %v)", promtest.ToFloat64(m.Active), answered(m))
	assert.Eventually(t, func() bool { return promtest.ToFloat64(m.Active) == float64(share) }, 10*time.Second, 20*time.Millisecond,
		"key a holds its share, no more (open %v)", promtest.ToFloat64(m.Active))
	assert.GreaterOrEqual(t, refusedListens(m, server.RemoteListenIdentityLimit), float64(clients*forwards-share), "the rest are over a's share")

	unixClient(secretB, "b.sock")
	var c net.Conn
	require.Eventually(t, func() bool {
		c, err = net.DialTimeout("unix", dir+"/b.sock", time.Second)
		return err == nil
	}, 15*time.Second, 20*time.Millisecond, "key b gets its listener (refused for the server's limit: %v)",
		refusedListens(m, server.RemoteListenServerLimit))
	t.Cleanup(func() { _ = c.Close() })
	echoCheck(t, c, 64<<10)
	assert.Equal(t, float64(share+1), promtest.ToFloat64(m.Active))
	assert.Zero(t, refusedListens(m, server.RemoteListenServerLimit), "the server's limit was never reached")
}

// TestReverseForwardRetriedWhenFull (issue 30, R5): a bind refused because
// the server holds its limit of listeners (overloaded) is asked again on the
// same connection, with backoff, and gets its listener once a slot frees;
// a bind no rule admits is not asked again in a loop, and the client says
// why at -v 0 once.
func TestReverseForwardRetriedWhenFull(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	a, b, forbidden := testutil.FreeAddr(t, "tcp"), testutil.FreeAddr(t, "tcp"), testutil.FreeAddr(t, "tcp")
	m := server.NewRemoteListenMetrics(prometheus.NewRegistry())
	srv := testutil.StartServer(t, testutil.ServerOptions{Mutate: func(c *server.Config) {
		c.AllowRemoteListen = endpoint.MustParseAllowList("tcp:"+a, "tcp:"+b)
		c.Reverse.Events = server.NewReverseMetrics(prometheus.NewRegistry())
		c.RemoteListenMetrics = m
		c.MaxRemoteListens = 1
		c.DrainTimeout = 0
	}})
	first := reverseClient(t, srv, "tcp:"+a+"=tcp:"+echo)
	echoCheck(t, dialWhenListening(t, a), 64<<10)

	logs := &logLines{}
	testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:1", WaitReady: true, Logger: logs.logger(),
		Mutate: func(c *client.Config) { withRemoteForwards(t, c, "tcp:"+b+"=tcp:"+echo, "tcp:"+forbidden+"=tcp:"+echo) }})
	require.Eventually(t, func() bool {
		return refusedListens(m, server.RemoteListenServerLimit) >= 1 && refusedListens(m, server.RemoteListenNotAllowed) >= 1
	}, 10*time.Second, 10*time.Millisecond, "the second client is refused: the server is full, and a forward no rule admits")
	assert.False(t, listening(b))

	first.Stop(t) // its listener closes: a slot frees
	echoCheck(t, dialWhenListening(t, b), 64<<10)
	assert.GreaterOrEqual(t, refusedListens(m, server.RemoteListenServerLimit), 1.0)
	assert.LessOrEqual(t, refusedListens(m, server.RemoteListenNotAllowed), 2.0, "the forward no rule admits is not asked for in a loop")
	assert.Equal(t, 1, logs.count("Server refused a reverse forward: no --allow-remote-listen rule", forbidden), "said once at -v 0: %s", logs)
	assert.False(t, listening(forbidden))
}

// TestReverseForwardReservedPorts (issue 30, L3): the ports the server
// itself listens on (QUIC on UDP, the TCP fallback, the admin listener) are
// reserved at every address and family: a client whose rule admits every
// port of [::1] and of 0.0.0.0 is refused them (refused, counted as
// reserved_port) and nothing listens there; another port of the same rule
// is bound.
func TestReverseForwardReservedPorts(t *testing.T) {
	t.Parallel()
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		_ = ln.Close()
	}
	echo := testutil.EchoServer(t)
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	m := server.NewRemoteListenMetrics(prometheus.NewRegistry())
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Mutate: func(c *server.Config) {
		c.AllowRemoteListen = endpoint.MustParseAllowList("tcp:[::1]:1024-65535", "udp:[::1]:1024-65535", "tcp:0.0.0.0:1024-65535")
		c.Reverse.Events = server.NewReverseMetrics(prometheus.NewRegistry())
		c.RemoteListenMetrics = m
		c.SelfAddrs = []net.Addr{admin.Addr()}
	}})
	port := func(addr string) string {
		_, p, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		return p
	}
	quicPort, tcpPort, adminPort := port(srv.Addr), port(srv.TCPAddr), port(admin.Addr().String())
	free := port(freeAddrOn(t, "[::1]:0"))
	reserved := []string{
		"tcp:[::1]:" + adminPort, "tcp:0.0.0.0:" + adminPort,
		"udp:[::1]:" + quicPort, "tcp:[::1]:" + quicPort,
		"tcp:[::1]:" + tcpPort,
	}
	var fs []string
	for _, l := range reserved {
		fs = append(fs, l+"=tcp:"+echo)
	}
	reverseClient(t, srv, append(fs, "tcp:[::1]:"+free+"=tcp:"+echo)...)
	echoCheck(t, dialWhenListening(t, "[::1]:"+free), 64<<10)
	require.Eventually(t, func() bool { return answered(m) >= float64(len(reserved)+1) }, 10*time.Second, 10*time.Millisecond,
		"every request is answered")
	assert.Equal(t, float64(len(reserved)), refusedListens(m, server.RemoteListenReservedPort), "each of the server's own ports is refused")
	assert.Equal(t, 1.0, promtest.ToFloat64(m.Active), "only the free port is bound")
	assert.False(t, listening("[::1]:"+adminPort), "the admin port is not taken on [::1]")
	assert.False(t, listening("[::1]:"+tcpPort), "the TCP fallback's port is not taken on [::1]")
	pc, err := net.ListenPacket("udp", "[::1]:"+quicPort)
	require.NoError(t, err, "nothing holds the QUIC port on [::1]")
	_ = pc.Close()
}

// freeAddrOn returns an address with a TCP port free at addr's host.
func freeAddrOn(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}
