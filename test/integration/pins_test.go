package integration

import (
	"net"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/transport"
)

// pinsClient starts a client of servers with the --server-fingerprint
// entries pins, in spread mode, and a logger at -v 0.
func pinsClient(t *testing.T, echo string, servers []*testutil.Server, pins ...string) (*testutil.Client, *logLines) {
	t.Helper()
	var logs logLines
	cl := startPinnedClient(t, "tcp:"+echo, servers, pins, &logs, func(c *client.Config) { c.Mode = client.ModeSpread })
	return cl, &logs
}

// startPinnedClient starts a client (of the Fixed token) of servers
// verifying them with the --server-fingerprint entries pins (built as
// quictun-client builds them), logging into logs, with mutate applied to
// its Config.
func startPinnedClient(t *testing.T, token string, servers []*testutil.Server, pins []string, logs *logLines, mutate func(*client.Config)) *testutil.Client {
	t.Helper()
	p, err := transport.ParsePins(pins)
	require.NoError(t, err)
	var addrs []string
	for _, s := range servers {
		addrs = append(addrs, s.Addr)
	}
	require.NoError(t, p.Check(addrs))
	all, byServer, err := transport.ClientTLSConfigs(transport.ClientTLSOptions{SessionCache: transport.NewStickySessionCache(8)}, p)
	require.NoError(t, err)
	return testutil.StartClient(t, servers[0], testutil.ClientOptions{Token: token, Logger: logs.logger(),
		Mutate: func(c *client.Config) {
			c.Servers, c.TLS, c.ServerTLS = addrs, all, byServer
			c.Backoff.Max = 300 * time.Millisecond
			mutate(c)
		}})
}

// TestPinsPerServer (issue 23, "pins per server"): two servers with
// certificates of their own. A client pinning each server's certificate
// for its endpoint connects to both, and tunnels go through each. A server
// that presents the certificate of the other (its key stolen: the same
// state) at an endpoint pinned to its own certificate is refused: that
// connection fails with the pin error naming the certificate presented
// (dials_total{result="cert_rejected"}, and the -v 0 line says which
// endpoint, which fingerprint and the fix), while the other server, with
// its own pin, keeps working. With one pin set shared by both servers (a
// sha256:HEX entry for each), the same impostor is accepted: what pins per
// server prevent.
func TestPinsPerServer(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	a := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	b := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	fpA, fpB := a.State.Fingerprint(), b.State.Fingerprint()
	require.NotEqual(t, fpA, fpB, "certificates of their own")

	t.Run("each with its own pin", func(t *testing.T) {
		t.Parallel()
		cl, _ := pinsClient(t, echo, []*testutil.Server{a, b}, a.Addr+"="+fpA, b.Addr+"="+fpB)
		require.Eventually(t, func() bool { return healthy(cl) == 2 }, 20*time.Second, 10*time.Millisecond, "both servers connected")
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for range 4 { // spread: held open, they alternate between the servers
			c, err := net.Dial("tcp", cl.Addr)
			require.NoError(t, err)
			conns = append(conns, c)
			echoOnce(t, c, "pinned")
		}
		require.Eventually(t, func() bool { return active(a)+active(b) == 4 }, 10*time.Second, 10*time.Millisecond)
		assert.Equal(t, 2, active(a), "tunnels through A")
		assert.Equal(t, 2, active(b), "tunnels through B")
		assert.Zero(t, promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("cert_rejected")))
	})

	// B's endpoint answered by a server holding A's key.
	impostor := testutil.StartServer(t, testutil.ServerOptions{StateDir: a.StateDir, Allow: []string{"tcp:" + echo}})
	require.Equal(t, fpA, impostor.State.Fingerprint())

	t.Run("A's key does not pass for B", func(t *testing.T) {
		t.Parallel()
		cl, logs := pinsClient(t, echo, []*testutil.Server{a, impostor}, a.Addr+"="+fpA, impostor.Addr+"="+fpB)
		require.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("cert_rejected")) >= 2 },
			20*time.Second, 10*time.Millisecond, "the impostor's certificate refused, at each attempt")
		require.Eventually(t, func() bool { return healthy(cl) == 1 }, 20*time.Second, 10*time.Millisecond, "A connected")
		stats := cl.ServerStats()
		assert.True(t, stats[0].Healthy, "A, with its own pin")
		assert.False(t, stats[1].Healthy, "not the impostor at B's endpoint")
		assert.Zero(t, stats[1].Connections)
		line := "Could not connect to server"
		require.Eventually(t, func() bool {
			return logs.count(line, impostor.Addr, `"presentedFingerprint"="`+fpA+`"`, "presented a certificate that no pin for it accepts",
				"--server-fingerprint "+impostor.Addr+"="+fpA, "another host answered at that address: do not pin it") == 1
		}, 10*time.Second, 10*time.Millisecond, "the -v 0 line names the endpoint, the certificate presented and the fix: %s", logs)
		assert.Equal(t, 1, logs.count(line), "once however often it retries: %s", logs)
		echoVia(t, cl.Addr, "still served by A")
	})

	t.Run("one shared pin set accepts the impostor", func(t *testing.T) {
		t.Parallel()
		cl, _ := pinsClient(t, echo, []*testutil.Server{a, impostor}, fpA, fpB)
		require.Eventually(t, func() bool { return healthy(cl) == 2 }, 20*time.Second, 10*time.Millisecond,
			"a pin shared by every server lets A's key answer for B")
	})
}

// healthy counts cl's healthy servers.
func healthy(cl *testutil.Client) int {
	n := 0
	for _, s := range cl.ServerStats() {
		if s.Healthy {
			n++
		}
	}
	return n
}

// echoVia echoes msg through a new tunnel from addr.
func echoVia(t *testing.T, addr, msg string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	echoOnce(t, c, msg)
}

// TestWrongPinOverTCP: with --transport tcp a certificate no pin accepts is
// counted (tcp_dials_total{result="cert_rejected"}) and logged at -v 0 once,
// with the endpoint, the fingerprint presented and the fix, as over QUIC
// (it was a -v 2 line only).
func TestWrongPinOverTCP(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Allow: []string{"tcp:" + echo}})
	other := testutil.StartServer(t, testutil.ServerOptions{})
	var logs logLines
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Fingerprint: other.State.Fingerprint(), Logger: logs.logger(),
		Mutate: func(c *client.Config) { c.Transport, c.TCPServerAddr = client.TransportTCP, srv.TCPAddr }})
	require.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.TCPDialsTotal.WithLabelValues("cert_rejected")) >= 2 },
		20*time.Second, 10*time.Millisecond)
	assert.Zero(t, promtest.ToFloat64(cl.Metrics.TCPDialsTotal.WithLabelValues("ok")))
	assert.Equal(t, 1, logs.count("Could not connect to server over TCP; retrying", `"presentedFingerprint"="`+srv.State.Fingerprint()+`"`,
		"presented a certificate that no pin for it accepts"), "once at -v 0: %s", &logs)
}
