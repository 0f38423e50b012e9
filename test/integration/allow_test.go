package integration

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/server"
)

// What a peer can reach through the allow-list (issue 11, items 2 and 7):
// each case starts a server and a client in-process, opens a tunnel to a
// destination the server must refuse, and checks that the application is
// reset without data, that the client saw `refused`, and the server's
// refusal metric by reason.

// adminListener stands for the server's admin API: a listener that must never
// be reached through the tunnel. It counts the connections it receives.
func adminListener(t *testing.T, address string) (net.Addr, func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", address)
	require.NoError(t, err)
	hits := make(chan struct{}, 100)
	testutil.ServeListener(t, ln, func(c net.Conn) {
		hits <- struct{}{}
		_, _ = c.Write([]byte("admin API"))
		_ = c.Close()
	})
	return ln.Addr(), func() int { return len(hits) }
}

func expectRefused(t *testing.T, srv *testutil.Server, token, reason string) {
	t.Helper()
	before := promtest.ToFloat64(srv.Metrics.RefusedTotal.WithLabelValues("tcp", reason))
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: token, WaitReady: true})
	refusedRead(t, cl.Addr)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(cl.Metrics.StreamsTotal.WithLabelValues("refused")) == 1 &&
			promtest.ToFloat64(srv.Metrics.RefusedTotal.WithLabelValues("tcp", reason)) == before+1
	}, 5*time.Second, 10*time.Millisecond, "%s: want refused (%s)", token, reason)
	assert.Zero(t, promtest.ToFloat64(cl.Metrics.StreamsTotal.WithLabelValues("dial_failed")), token)
}

func TestOwnListenersRefused(t *testing.T) {
	admin, adminHits := adminListener(t, "127.0.0.1:0")
	wildcard, wildcardHits := adminListener(t, "[::]:0")
	_, wport, err := net.SplitHostPort(wildcard.String())
	require.NoError(t, err)
	// The default allow-list (all of loopback) covers every one of them.
	srv := testutil.StartServer(t, testutil.ServerOptions{Mutate: func(c *server.Config) {
		c.SelfAddrs = []net.Addr{admin, wildcard}
	}})
	expectRefused(t, srv, "tcp:"+admin.String(), "self")
	expectRefused(t, srv, "tcp:"+srv.Addr, "self") // the QUIC listener's address and port
	expectRefused(t, srv, "tcp:127.0.0.1:"+wport, "self")
	expectRefused(t, srv, "tcp:127.0.0.9:"+wport, "self")
	expectRefused(t, srv, "tcp:[::1]:"+wport, "self")
	assert.Zero(t, adminHits()+wildcardHits(), "the admin listeners were reached")
	assert.Equal(t, 5.0, promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("refused")))
}

// A name allowed by an exact host-name rule is dialed by name; the address
// the dialer actually connects to is checked too.
func TestOwnListenerRefusedThroughHostNameRule(t *testing.T) {
	wildcard, hits := adminListener(t, "[::]:0")
	_, port, err := net.SplitHostPort(wildcard.String())
	require.NoError(t, err)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:localhost:" + port}, Mutate: func(c *server.Config) {
		c.SelfAddrs = []net.Addr{wildcard}
	}})
	expectRefused(t, srv, "tcp:localhost:"+port, "self")
	assert.Zero(t, hits())
}

// errResolver fails every lookup.
type errResolver struct{}

func (errResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, errors.New("no such host")
}

func TestBroadRuleSharpEdges(t *testing.T) {
	echo := testutil.EchoServer(t)
	_, port, err := net.SplitHostPort(echo)
	require.NoError(t, err)
	srv := testutil.StartServer(t, testutil.ServerOptions{
		Allow:  []string{"tcp:0.0.0.0/0:*", "tcp:[::]/0:*"},
		Mutate: func(c *server.Config) { c.Resolver = errResolver{} },
	})
	expectRefused(t, srv, "tcp:0.0.0.0:"+port, "reserved") // would reach the echo server on loopback
	expectRefused(t, srv, "tcp:[::]:"+port, "reserved")
	expectRefused(t, srv, "tcp:169.254.169.254:80", "reserved")
	expectRefused(t, srv, "tcp:[64:ff9b::a9fe:a9fe]:80", "reserved")
	expectRefused(t, srv, "tcp:internal-db.corp.example:5432", "unresolved")
}

func TestDenyRuleWins(t *testing.T) {
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{
		Allow: []string{"tcp:127.0.0.0/8:*"},
		Deny:  []string{"tcp:" + echo},
	})
	expectRefused(t, srv, "tcp:"+echo, "denied")
}
