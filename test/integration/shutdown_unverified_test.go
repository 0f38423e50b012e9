package integration

import (
	"context"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/tcpmux"
	"github.com/quictun/quictun/server"
)

// TestShutdownSpreadCountsVerifiedConnections (issue 30 L1): the spread a
// server shutting down asks for counts only connections that presented a
// verified header (mutual TLS or no authentication: all of them). Here
// one client has proven the secret, at 0.25 handshakes a second: 4 s; 20
// idle connections without credentials beside it leave it at 4 s. Before,
// they counted: 21 connections, 84 s, capped at a minute. Without
// authentication every connection is verified, and counts.
func TestShutdownSpreadCountsVerifiedConnections(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		noAuth bool
		want   time.Duration
	}{
		{"shared secret", false, 4 * time.Second},
		{"no authentication", true, proto.MaxReconnectSpread},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			echo := testutil.EchoServer(t)
			srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, TCP: true, NoAuth: tc.noAuth,
				Mutate: func(c *server.Config) { c.DrainTimeout, c.ShutdownHandshakeRate = 0, 0.25 }})
			cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true, NoAuth: tc.noAuth})
			echoCheck(t, dial(t, cl.Addr), 100) // its connection is verified
			const unverified = 20
			conns := make([]*tcpmux.Conn, unverified)
			for i := range conns {
				conns[i] = tcpConn(t, srv) // no hello
			}
			require.Eventually(t, func() bool { return promtest.ToFloat64(srv.Metrics.ActiveConnections) == unverified+1 },
				10*time.Second, 10*time.Millisecond, "every connection is registered")

			srv.Stop(t)
			for _, c := range conns {
				select {
				case <-c.Context().Done():
				case <-time.After(10 * time.Second):
					require.Fail(t, "the server did not close a connection")
				}
				assert.Equal(t, tc.want, proto.ReconnectSpread(context.Cause(c.Context())), "%v", context.Cause(c.Context()))
			}
		})
	}
}
