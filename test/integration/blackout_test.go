package integration

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	quicproxy "github.com/quic-go/quic-go/integrationtests/tools/proxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
)

// lossyProxy puts a UDP proxy with oneWay delay in front of srv; packets are
// dropped while dark is true or when drop returns true.
func lossyProxy(t testing.TB, srv *testutil.Server, oneWay time.Duration, dark *atomic.Bool, drop func() bool) string {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	sa, err := net.ResolveUDPAddr("udp", srv.Addr)
	require.NoError(t, err)
	p := &quicproxy.Proxy{
		Conn: pc, ServerAddr: sa,
		DropPacket: func(quicproxy.Direction, net.Addr, net.Addr, []byte) bool {
			return dark.Load() || (drop != nil && drop())
		},
		DelayPacket: func(quicproxy.Direction, net.Addr, net.Addr, []byte) time.Duration { return oneWay },
	}
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Close(); _ = pc.Close() })
	return pc.LocalAddr().String()
}

// recordingProxy puts a UDP proxy in front of srv that shows every
// client-to-server packet to record.
func recordingProxy(t *testing.T, srv *testutil.Server, record func([]byte)) string {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	sa, err := net.ResolveUDPAddr("udp", srv.Addr)
	require.NoError(t, err)
	p := &quicproxy.Proxy{
		Conn: pc, ServerAddr: sa,
		DropPacket: func(d quicproxy.Direction, _, _ net.Addr, pkt []byte) bool {
			if d == quicproxy.DirectionIncoming {
				record(pkt)
			}
			return false
		},
	}
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Close(); _ = pc.Close() })
	return pc.LocalAddr().String()
}

// TestBlackoutRecovery is the "Mars test": the link goes dark while a request
// is in flight. The request must complete once the link is back, and the
// tunnel's QUIC connection (with the application's TCP connection) survives.
// The recovery time is logged, not asserted.
func TestBlackoutRecovery(t *testing.T) {
	blackouts := []time.Duration{2 * time.Second, 6 * time.Second}
	if testing.Short() {
		blackouts = blackouts[:1]
	}
	for _, heartbeat := range []time.Duration{200 * time.Millisecond, 0} {
		for _, blackout := range blackouts {
			t.Run(fmt.Sprintf("heartbeat=%s/blackout=%s", heartbeat, blackout), func(t *testing.T) {
				echo := testutil.EchoServer(t)
				srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
				var dark atomic.Bool
				proxy := lossyProxy(t, srv, 5*time.Millisecond, &dark, nil)
				cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: proxy, WaitReady: true,
					Mutate: func(c *client.Config) { c.HeartbeatInterval = heartbeat }})
				c := dial(t, cl.Addr)
				msg := []byte("ping ping ping")
				got := make([]byte, len(msg))
				for range 20 {
					_, err := c.Write(msg)
					require.NoError(t, err)
					_, err = io.ReadFull(c, got)
					require.NoError(t, err)
				}
				dark.Store(true)
				_, err := c.Write(msg) // in flight when the link dies
				require.NoError(t, err)
				time.Sleep(blackout)
				dark.Store(false)
				back := time.Now()
				_, err = io.ReadFull(c, got)
				require.NoError(t, err, "the in-flight request must complete after the blackout")
				inflight := time.Since(back)
				fresh := time.Now()
				echoCheck(t, dial(t, cl.Addr), 1000)
				t.Logf("blackout %s heartbeat %s: in-flight request completed %v after the link returned; a new connection then took %v; rescues switched=%v",
					blackout, heartbeat, inflight.Round(time.Millisecond), time.Since(fresh).Round(time.Millisecond),
					promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("switched")))
				assert.Zero(t, promtest.ToFloat64(cl.Metrics.ReconnectsTotal), "the QUIC connection must survive the blackout")
			})
		}
	}
}

// TestConnStatsDuringPathRescue: the connection statistics that a metrics
// scrape reads (Client.ConnStats: the QUIC connection's addresses among
// them) are read over and over while a path rescue switches the connection
// to a new socket (the old one stays dark), and name the new path's local
// address after it. quic-go replaces the connection's send path on its run
// loop when it switches; before quic-go patch 0012 the addresses were read
// without synchronisation (the race test/e2e TestBlackoutIsNotBlockedUDP's
// client reported in CI, where the test scrapes the client's metrics every
// 50 ms as the link returns).
func TestConnStatsDuringPathRescue(t *testing.T) {
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	var darkPort atomic.Int64 // the client's port whose packets are dropped (0: none)
	proxy := portDarkProxy(t, srv, &darkPort)
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: proxy, WaitReady: true,
		Mutate: func(c *client.Config) { c.Transport = client.TransportQUIC }})
	echoCheck(t, dial(t, cl.Addr), 1000) // work: heartbeats on
	local := func() string {
		for _, s := range cl.ConnStats() {
			return s.LocalAddress
		}
		return ""
	}
	before := local()
	ua, err := net.ResolveUDPAddr("udp", before)
	require.NoError(t, err)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	wg.Go(func() { // scrapes, back to back
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = cl.ConnStats()
			runtime.Gosched()
		}
	})
	darkPort.Store(int64(ua.Port)) // the path dies; a rescue's new socket gets through
	switched := cl.Metrics.PathRescuesTotal.WithLabelValues("switched")
	require.Eventually(t, func() bool { return promtest.ToFloat64(switched) >= 1 }, 10*time.Second, 10*time.Millisecond,
		"a rescue switches to a new path after RescueAfter")
	// The connection moves at its run loop's next turn (a heartbeat at the latest).
	require.Eventually(t, func() bool { return local() != before }, 5*time.Second, 10*time.Millisecond,
		"the statistics name the new path's socket")
	time.Sleep(100 * time.Millisecond) // scrapes after the switch
	assert.Zero(t, promtest.ToFloat64(cl.Metrics.ReconnectsTotal), "the same connection")
}

// portDarkProxy puts a UDP proxy in front of srv that drops the packets from
// and to the client port *dark (none while 0).
func portDarkProxy(t *testing.T, srv *testutil.Server, dark *atomic.Int64) string {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	sa, err := net.ResolveUDPAddr("udp", srv.Addr)
	require.NoError(t, err)
	p := &quicproxy.Proxy{
		Conn: pc, ServerAddr: sa,
		DropPacket: func(d quicproxy.Direction, from, to net.Addr, _ []byte) bool {
			client := to
			if d == quicproxy.DirectionIncoming {
				client = from
			}
			ua, ok := client.(*net.UDPAddr)
			return ok && int64(ua.Port) == dark.Load()
		},
	}
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Close(); _ = pc.Close() })
	return pc.LocalAddr().String()
}
