package integration

import (
	"io"
	"net"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/server"
)

// echoMsg writes msg on c and reads the echo.
func echoMsg(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	_, err := c.Write([]byte(msg))
	require.NoError(t, err)
	got := make([]byte, len(msg))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, msg, string(got))
}

// TestSetAllowListKeepsOpenTunnels: new rules apply to streams that arrive
// after the change; tunnels already open keep running.
func TestSetAllowListKeepsOpenTunnels(t *testing.T) {
	a, b := testutil.EchoServer(t), testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + a}})
	toA := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + a, WaitReady: true})
	live := dial(t, toA.Addr)
	echoMsg(t, live, "before")
	expectRefused(t, srv, "tcp:"+b, endpoint.ReasonNotAllowed)

	srv.SetAllowList(endpoint.MustParseAllowList("tcp:" + b))
	toB := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + b, WaitReady: true})
	echoCheck(t, dial(t, toB.Addr), 1000)
	expectRefused(t, srv, "tcp:"+a, endpoint.ReasonNotAllowed)
	echoMsg(t, live, "after: the open tunnel to a is not dropped")
	require.NoError(t, live.CloseWrite())
	rest, err := io.ReadAll(live)
	require.NoError(t, err)
	assert.Empty(t, rest)
}

// TestSetAllowListKeepsSelfRefused: the server's own listeners stay refused
// under rules that would allow them.
func TestSetAllowListKeepsSelfRefused(t *testing.T) {
	admin, hits := adminListener(t, "127.0.0.1:0")
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:127.0.0.2:1"}, Mutate: func(c *server.Config) {
		c.SelfAddrs = []net.Addr{admin}
	}})
	srv.SetAllowList(endpoint.MustParseAllowList("tcp:127.0.0.0/8:*"))
	expectRefused(t, srv, "tcp:"+admin.String(), endpoint.ReasonSelf)
	assert.Zero(t, hits())
}

// TestSetSecret: after a secret change, new streams need the new secret and
// open tunnels keep running, until a client still on the old secret opens a
// stream: that fails authentication, which closes its connection (and so its
// tunnels). Switching authentication modes is refused.
func TestSetSecret(t *testing.T) {
	echo := testutil.EchoServer(t)
	oldSecret, newSecret := testutil.Secret, []byte("a new secret of 32 bytes, really")
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	old := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: oldSecret, WaitReady: true})
	live := dial(t, old.Addr)
	echoMsg(t, live, "before")

	require.NoError(t, srv.SetSecret(newSecret))
	echoMsg(t, live, "after the change")
	refusedRead(t, old.Addr)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("auth_failed")) >= 1
	}, 5*time.Second, 10*time.Millisecond)
	cur := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: newSecret, WaitReady: true})
	echoCheck(t, dial(t, cur.Addr), 1000)

	// The client takes the new secret too (its reload), and tunnels again.
	// (Its /readyz stays false from the refusal until a tunnel succeeds.)
	old.SetSecret(newSecret)
	echoCheck(t, dial(t, old.Addr), 1000)
	require.Eventually(t, old.Ready, 5*time.Second, 10*time.Millisecond)

	require.ErrorIs(t, srv.SetSecret(nil), server.ErrAuthModeChange)
	echoCheck(t, dial(t, cur.Addr), 1000) // still the new secret
}
