package integration

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/server"
)

// hostServer is a reverse forward server standing for a host of its own:
// it listens for reverse forwards at ip (a loopback address of its own)
// whatever address the client names, as the same --remote-forward
// tcp:0.0.0.0:PORT=... listens on each server's own host.
type hostServer struct {
	*testutil.Server
	ip string
}

// listenAt is the address its reverse forward listener for port has.
func (h hostServer) listenAt(port int) string { return net.JoinHostPort(h.ip, strconv.Itoa(port)) }

// startHostServer starts (or, with prev, restarts at prev's UDP address
// and state) a server at ip allowing clients to listen at tcp:0.0.0.0:port.
func startHostServer(t *testing.T, ip string, port int, prev *testutil.Server) hostServer {
	t.Helper()
	logs := failureLog(t, 2, "server at "+ip)
	o := testutil.ServerOptions{Logger: logs.logger(), Mutate: func(c *server.Config) {
		c.AllowRemoteListen = endpoint.MustParseAllowList("tcp:0.0.0.0:" + strconv.Itoa(port))
		c.Reverse.Events = server.NewReverseMetrics(prometheus.NewRegistry())
		c.ListenRemote = func(ctx context.Context, ep endpoint.Endpoint) (net.Listener, *net.UDPConn, error) {
			_, p, err := net.SplitHostPort(ep.Address)
			if err != nil {
				return nil, nil, err
			}
			ep.Address = net.JoinHostPort(ip, p)
			return server.ListenRemote(ctx, ep)
		}
	}}
	if prev != nil {
		o.Addr, o.StateDir = prev.Addr, prev.StateDir
	}
	return hostServer{Server: testutil.StartServer(t, o), ip: ip}
}

// freeHostPort returns a TCP port free on every one of ips, and on the
// wildcard address (a listener there would take connections to ips).
func freeHostPort(t *testing.T, ips ...string) int {
	t.Helper()
	for range 20 {
		port := testutil.FreePort(t, "tcp")
		free := true
		for _, ip := range append([]string{"0.0.0.0"}, ips...) {
			ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				free = false
				break
			}
			_ = ln.Close()
		}
		if free {
			return port
		}
	}
	t.Fatal("no port free on every address")
	return 0
}

// TestReverseForwardSeveralServers (issue 23): a client of two servers,
// each pinned to its own certificate, both allowing the listen address of
// its --remote-forward, which goes to a local echo service. The forward is
// bound on each server: a connection to its listen address on either
// reaches the client's service, 1 MiB each way intact (SHA-256). One server
// stops: its listener is gone and the other still serves new connections.
// It starts again (same UDP address and state, same listen port): the
// binding comes back there. With --connections 2 the forward is bound once
// per server (on its first connection), and the second connection gets no
// addr_in_use refusal (client log, server streams_total).
func TestReverseForwardSeveralServers(t *testing.T) {
	t.Parallel()
	ips := []string{"127.0.0.21", "127.0.0.22"}
	if ln, err := net.Listen("tcp", ips[1]+":0"); err != nil {
		t.Skipf("no loopback address %s to stand for a second host: %v", ips[1], err)
	} else {
		_ = ln.Close()
	}
	for _, conns := range []int{1, 2} {
		t.Run("connections="+strconv.Itoa(conns), func(t *testing.T) {
			t.Parallel()
			echo := testutil.EchoServer(t)
			port := freeHostPort(t, ips...)
			a, b := startHostServer(t, ips[0], port, nil), startHostServer(t, ips[1], port, nil)
			cl, logs := reverseClientOf(t, conns, []*testutil.Server{a.Server, b.Server}, "tcp:0.0.0.0:"+strconv.Itoa(port)+"=tcp:"+echo)

			for _, s := range []hostServer{a, b} {
				echoCheck(t, dialWhenListening(t, s.listenAt(port)), 1<<20)
			}

			b.Stop(t)
			require.Eventually(t, func() bool {
				c, err := net.DialTimeout("tcp", b.listenAt(port), time.Second)
				if err == nil {
					_ = c.Close()
				}
				return err != nil
			}, 10*time.Second, 20*time.Millisecond, "the stopped server's listener is gone")
			echoCheck(t, dialWhenListening(t, a.listenAt(port)), 1<<20)

			b = startHostServer(t, ips[1], port, b.Server)
			echoCheck(t, dialWhenListening(t, b.listenAt(port)), 1<<20)
			echoCheck(t, dialWhenListening(t, a.listenAt(port)), 64<<10)

			assert.Zero(t, logs.count("Server refused a reverse forward"), "no refusal on any connection: %s", logs)
			assert.Equal(t, 1, logs.count("Server listens for a reverse forward", `"server"="`+a.Addr+`"`), "bound once on A (its first connection): %s", logs)
			assert.Equal(t, 2, logs.count("Server listens for a reverse forward", `"server"="`+b.Addr+`"`), "bound once on B, and again after its restart: %s", logs)
			for _, s := range []hostServer{a, b} {
				assert.Zero(t, promtest.ToFloat64(s.Metrics.StreamsTotal.WithLabelValues("addr_in_use")), "no addr_in_use on the server")
				assert.Equal(t, 1, logs.count(`"level"=0`, "Server listens for a reverse forward", `"server"="`+s.Addr+`"`),
					"each server's binding shows at -v 0, once (not again at a reconnect): %s", logs)
			}
			assert.Equal(t, 2, healthy(cl))
		})
	}
}

// reverseClientOf starts a client of servers (each pinned to its own
// certificate) with conns connections to each and the remote forwards
// LISTEN=DESTINATION, logging at -v 2 into the returned lines.
func reverseClientOf(t *testing.T, conns int, servers []*testutil.Server, forwards ...string) (*testutil.Client, *logLines) {
	t.Helper()
	var pins []string
	for _, s := range servers {
		pins = append(pins, s.Addr+"="+s.State.Fingerprint())
	}
	logs := failureLog(t, 2, "client")
	cl := startPinnedClient(t, "tcp:127.0.0.1:1", servers, pins, logs, func(c *client.Config) {
		c.ConnectionsPerServer = conns
		withRemoteForwards(t, c, forwards...)
	})
	return cl, logs
}
