package integration

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/handover"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/server"
)

// TestClientHandOver (issue 34 part 3, in process): client A hands its
// local listener and its resumable tunnels over (Client.HandOver, through
// a pkg/handover socket pair as between two processes) to client B, built
// on that listener with its own connection to the server, which imports
// them (Client.Import): A closes its connection, the server parks the
// tunnels, B re-attaches each; the applications' connections to the
// listener stay open, and no byte is lost, doubled or reordered (SHA-256
// both ways, 5 tunnels moving data through an echo the whole time). A new
// connection to the same listener is served by B, and nothing is left
// held at the end. "each" as the daemons do: A sends each tunnel as soon
// as it is exported (Client.HandOverEach) and B imports each as it
// arrives (Client.ImportTunnel) while A still hands the rest over.
func TestClientHandOver(t *testing.T) { // not parallel: it sets the environment (handoverPair)
	for _, each := range []bool{false, true} {
		name := "all at once"
		if each {
			name = "each"
		}
		t.Run(name, func(t *testing.T) { testClientHandOver(t, each) })
	}
}

func testClientHandOver(t *testing.T, each bool) {
	const tunnels = 5
	echo := testutil.EchoServer(t)
	srvSide := newResumeSide(server.NewResumeMetrics)
	sideA, sideB := newResumeSide(client.NewResumeMetrics), newResumeSide(client.NewResumeMetrics)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo},
		Mutate: func(c *server.Config) { c.Resume = srvSide.egress(time.Minute) }})
	lnA, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true, Listeners: []net.Listener{lnA},
		Mutate: func(c *client.Config) { c.Resume = sideA.ingress(time.Minute) }})

	load := startEchoLoad(t, a.Addr, tunnels)
	require.Eventually(t, func() bool { return sideA.table.Len() == tunnels }, 10*time.Second, time.Millisecond)

	// The two ends of the handover socket, in one process: what A sends
	// arrives as B would receive it in its own process.
	parent, child := handoverPair(t)
	lnFile, err := lnA.(*net.TCPListener).File()
	require.NoError(t, err)
	require.NoError(t, parent.SendListeners([]handover.Listener{{Name: "listen-on:tcp:" + a.Addr, File: lnFile}}))
	require.NoError(t, lnFile.Close())
	ls, err := child.RecvListeners()
	require.NoError(t, err)
	require.Len(t, ls, 1)
	lnB, err := net.FileListener(ls[0].File)
	require.NoError(t, err)
	require.NoError(t, ls[0].File.Close())
	b := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true, Listeners: []net.Listener{lnB},
		Mutate: func(c *client.Config) { c.Resume = sideB.ingress(time.Minute) }})

	if each {
		handOverEach(t, a, b, parent, child, tunnels)
	} else {
		handOverAll(t, a, b, parent, child, tunnels)
	}
	// Each tunnel's goroutine lets go of it once its export ended it (it
	// may still be in its wait for a session to re-attach on).
	assert.Eventually(t, func() bool { return sideA.table.Len() == 0 }, 5*time.Second, time.Millisecond, "A let go of every tunnel")
	a.Stop(t) // as the old process exits: its Run has returned

	load.waitMoving(t, "the tunnels move on through B")
	checkEchoOnce(t, b.Addr) // a new connection to the listener A handed over
	load.check(t)
	assert.Equal(t, float64(tunnels), promtest.ToFloat64(sideB.metrics.Resumed), "B re-attached each tunnel")
	assert.Equal(t, float64(tunnels), promtest.ToFloat64(srvSide.metrics.Resumed), "the server continued each tunnel")
	for _, r := range resume.GaveUpReasons() {
		assert.Zero(t, promtest.ToFloat64(sideB.metrics.GaveUp.WithLabelValues(r)), r)
		assert.Zero(t, promtest.ToFloat64(srvSide.metrics.GaveUp.WithLabelValues(r)), r)
	}
	require.Eventually(t, func() bool { return sideB.table.Len() == 0 && srvSide.table.Len() == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return sideA.budget.Used() == 0 && sideB.budget.Used() == 0 }, 10*time.Second, 10*time.Millisecond,
		"every buffer given back")
}

// handOverAll: A exports every tunnel, then sends them (Client.HandOver);
// B imports them once it has all (Client.Import).
func handOverAll(t *testing.T, a, b *testutil.Client, parent, child *handover.Conn, tunnels int) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		done <- a.HandOver(context.Background(), func(ts []handover.Tunnel) error { return parent.SendTunnels(ts) })
	}()
	ts, err := child.RecvTunnels(b.HandoverLimits())
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Equal(t, tunnels, len(ts), "tunnels handed over")
	n, err := b.Import(context.Background(), ts)
	require.NoError(t, err)
	assert.Equal(t, tunnels, n)
}

// handOverEach: A sends each tunnel as soon as it is exported
// (Client.HandOverEach) and B imports each as it arrives
// (Client.ImportTunnel), as the daemons do.
func handOverEach(t *testing.T, a, b *testutil.Client, parent, child *handover.Conn, tunnels int) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		done <- a.HandOverEach(context.Background(), handover.Sender{Tunnel: parent.SendTunnel, End: parent.SendEnd})
	}()
	var errs []error
	n, err := child.RecvTunnelsEach(b.HandoverLimits(), func(tu handover.Tunnel) {
		if err := b.ImportTunnel(context.Background(), tu); err != nil {
			errs = append(errs, err)
		}
	})
	require.NoError(t, err)
	require.NoError(t, <-done)
	assert.Empty(t, errs)
	assert.Equal(t, tunnels, n, "tunnels handed over")
}

// checkEchoOnce opens a connection to addr (a client's listener in front
// of an echo) and checks one round.
func checkEchoOnce(t *testing.T, addr string) {
	t.Helper()
	c := dial(t, addr)
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	_, err := c.Write([]byte("hello"))
	require.NoError(t, err)
	got := make([]byte, 5)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got))
}
