package integration

import (
	"io"
	"net"
	"testing"
	"time"

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

// echoOnce writes msg on c and reads it back.
func echoOnce(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	_, err := c.Write([]byte(msg))
	require.NoError(t, err)
	buf := make([]byte, len(msg))
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	require.Equal(t, msg, string(buf))
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

	// Bytes on the quiet tunnel start them again (the idle poll sees them).
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
