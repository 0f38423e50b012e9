package integration

import (
	"regexp"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/server"
)

// TestShutdownSpreadsReconnects: a server shutting down asks its clients
// to spread their reconnects over its connections at its handshake rate
// (here 1 connection at 0.25 a second: 4 s); the client waits a random
// part of that before it connects again, then is back on the restarted
// server. Over QUIC it dials no TCP meanwhile (the server restarts, UDP
// is not blocked), though the wait may pass the fallback delay (1 s); on
// the TCP fallback (--transport tcp, as every client whose UDP is
// blocked), whose connection's GOAWAY carries the reason, it waits the
// same way before its one new TCP connection.
func TestShutdownSpreadsReconnects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		tcp  bool
		// lost matches the client's line that reports the lost connection.
		lost string
	}{
		{"quic", false, `Lost connection to server`},
		{"tcp", true, `Lost TCP connection to server`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			echo := testutil.EchoServer(t)
			state := t.TempDir()
			const spread = 4 * time.Second
			slow := func(c *server.Config) { c.DrainTimeout, c.ShutdownHandshakeRate = 0, 0.25 }
			srv := testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Allow: []string{"tcp:" + echo}, TCP: tc.tcp, Mutate: slow})
			logs := &logLines{}
			opts := testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true, Logger: logs.logger()}
			if tc.tcp {
				opts.Mutate = func(c *client.Config) { c.Transport, c.TCPServerAddr = client.TransportTCP, srv.TCPAddr }
			}
			cl := testutil.StartClient(t, srv, opts)
			echoCheck(t, dial(t, cl.Addr), 100)

			srv.Stop(t)
			stopped := time.Now()
			srv2 := testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Addr: srv.Addr, TCP: tc.tcp, TCPAddr: srv.TCPAddr,
				Allow: []string{"tcp:" + echo}})
			require.Eventually(t, func() bool { return promtest.ToFloat64(srv2.Metrics.ActiveConnections) == 1 },
				spread+10*time.Second, 10*time.Millisecond, "the client is back within the spread")
			back := time.Since(stopped)
			echoCheck(t, dial(t, cl.Addr), 100)

			m := regexp.MustCompile(tc.lost + `.*"err"="[^"]*reconnect-spread=4s[^"]*".*"reconnectIn"="([^"]+)"`).FindStringSubmatch(logs.String())
			require.NotNil(t, m, "the client read the spread from the server's close:\n%s", logs)
			wait, err := time.ParseDuration(m[1])
			require.NoError(t, err)
			assert.Less(t, wait, spread)
			assert.GreaterOrEqual(t, back, wait, "it waited before it connected")
			if tc.tcp {
				assert.Equal(t, 2.0, promtest.ToFloat64(cl.Metrics.TCPDialsTotal.WithLabelValues("ok")), "one TCP connection before, one after")
			} else {
				for _, result := range []string{"ok", "error", "cert_rejected"} {
					assert.Zero(t, promtest.ToFloat64(cl.Metrics.TCPDialsTotal.WithLabelValues(result)), "no TCP dial (%s) while it waits", result)
				}
			}
			t.Logf("asked to spread over %v: waited %v, back on the new server %v after the old one stopped", spread, wait, back.Round(time.Millisecond))
		})
	}
}
