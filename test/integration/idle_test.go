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
)

// heartbeatsStopped reports whether no heartbeat went out over several
// heartbeat intervals.
func heartbeatsStopped(cl *testutil.Client, interval time.Duration) bool {
	before := cl.LivenessStats().HeartbeatsSent.Load()
	time.Sleep(5 * interval)
	return cl.LivenessStats().HeartbeatsSent.Load() == before
}

// echoOnce is echoMsg (reload_test.go) bounded in time: a tunnel that never
// gets through fails the test instead of hanging it.
func echoOnce(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	echoMsg(t, c, msg)
}

// TestHeartbeatsOnlyWithWork (issue 22 item 1): a connected client sends
// heartbeats only while its connection has work; idle, with an open but
// quiet tunnel too, it sends none (QUIC's keep-alive is all), and a new
// tunnel or bytes on the quiet one start them again.
func TestHeartbeatsOnlyWithWork(t *testing.T) {
	t.Parallel()
	const interval, idle = 50 * time.Millisecond, 500 * time.Millisecond
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true,
		Mutate: func(c *client.Config) { c.HeartbeatInterval, c.IdleAfter = interval, idle }})

	quiet, err := net.Dial("tcp", cl.Addr)
	require.NoError(t, err)
	defer quiet.Close()
	echoOnce(t, quiet, "hello")
	require.Eventually(t, func() bool { return heartbeatsStopped(cl, interval) }, 20*time.Second, time.Millisecond,
		"heartbeats stop once the connection is idle, its tunnel open but quiet")

	// Bytes on the quiet tunnel start them again (the splice wakes the monitor).
	sent := cl.LivenessStats().HeartbeatsSent.Load()
	echoOnce(t, quiet, "again")
	require.Eventually(t, func() bool { return cl.LivenessStats().HeartbeatsSent.Load() > sent }, 20*time.Second, time.Millisecond,
		"bytes on an open tunnel restart the heartbeats")
	require.Eventually(t, func() bool { return heartbeatsStopped(cl, interval) }, 20*time.Second, time.Millisecond)

	// A new tunnel starts them again (at once: opening a stream wakes the
	// monitor).
	sent = cl.LivenessStats().HeartbeatsSent.Load()
	c, err := net.Dial("tcp", cl.Addr)
	require.NoError(t, err)
	defer c.Close()
	echoOnce(t, c, "new")
	require.Eventually(t, func() bool { return cl.LivenessStats().HeartbeatsSent.Load() > sent }, 20*time.Second, time.Millisecond,
		"a new tunnel restarts the heartbeats")
}

// TestRescueAfterIdle (issue 22 item 1): the client's socket goes dark while
// the connection is idle (no heartbeats, so nothing notices); the first new
// tunnel after it wakes the heartbeats, whose missing echoes start the path
// rescue RescueAfter later, and the tunnel gets through on the new path.
// Without heartbeats the connection would wait for QUIC's idle timeout (90 s).
func TestRescueAfterIdle(t *testing.T) {
	t.Parallel()
	const interval, idle, rescueAfter = 50 * time.Millisecond, 500 * time.Millisecond, time.Second
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	relay := startNATRelay(t, srv, time.Millisecond)
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: relay.Addr(), WaitReady: true,
		Mutate: func(c *client.Config) { c.HeartbeatInterval, c.IdleAfter, c.RescueAfter = interval, idle, rescueAfter }})
	c, err := net.Dial("tcp", cl.Addr)
	require.NoError(t, err)
	echoOnce(t, c, "before")
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return heartbeatsStopped(cl, interval) }, 20*time.Second, time.Millisecond)

	old := relay.Clients()
	require.Len(t, old, 1)
	relay.Block(old[0])
	start := time.Now()
	c, err = net.Dial("tcp", cl.Addr)
	require.NoError(t, err)
	defer c.Close()
	echoOnce(t, c, "after the idle spell")
	took := time.Since(start)
	t.Logf("first tunnel after the path died while idle: echoed after %v (RescueAfter %v); rescues switched %v",
		took, rescueAfter, promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("switched")))
	assert.Equal(t, 1.0, promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("switched")), "the rescue moved the connection")
	assert.Len(t, relay.Clients(), 2, "to a new socket")
	checkSameConnection(t, srv, cl)
}
