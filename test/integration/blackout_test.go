package integration

import (
	"fmt"
	"io"
	"net"
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
func lossyProxy(t *testing.T, srv *testutil.Server, oneWay time.Duration, dark *atomic.Bool, drop func() bool) string {
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
