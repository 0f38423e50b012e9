package integration

import (
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/server"
)

// TestIdleResumableTunnelMemory measures (and logs) what resumption adds
// to an idle tunnel, client and server together: n idle tunnels without
// it, then n with it, on the same daemons. What it asserts is exact: once
// the acks went round, the idle tunnels' buffers hold no chunk (budget 0).
// Run without -race for the figure.
func TestIdleResumableTunnelMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("QUICTUN_IDLE_CONNS")); err == nil && v > 0 {
		n = v
	}
	echo := testutil.EchoServer(t)
	var window atomic.Int64
	win := func() time.Duration { return time.Duration(window.Load()) }
	srvSide := newResumeSide(server.NewResumeMetrics)
	cliSide := newResumeSide(client.NewResumeMetrics)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.Resume = &egress.Resume{Settings: resume.Settings{Table: srvSide.table, Window: win, Budget: srvSide.budget, Events: srvSide.metrics}}
	}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true, Mutate: func(c *client.Config) {
		c.Resume = &ingress.Resume{Table: cliSide.table, Window: win, Budget: cliSide.budget, Events: cliSide.metrics}
	}})
	measure := func() float64 {
		base := memInUse()
		conns := openIdle(t, cl.Addr, n)
		require.Eventually(t, func() bool { return srv.Server.Registry().Len() == n }, 30*time.Second, 10*time.Millisecond)
		require.Eventually(t, func() bool { return srvSide.budget.Used() == 0 && cliSide.budget.Used() == 0 }, 30*time.Second, 10*time.Millisecond,
			"idle tunnels whose bytes were confirmed hold no buffer chunk")
		per := float64(memInUse()-base) / float64(n)
		for _, c := range conns {
			_ = c.Close()
		}
		require.Eventually(t, func() bool { return srv.Server.Registry().Len() == 0 }, 30*time.Second, 10*time.Millisecond)
		return per
	}
	plain := measure()
	window.Store(int64(time.Minute))
	resumable := measure()
	t.Logf("idle tunnels (client and server together): plain %.1f KiB each, resumable %.1f KiB each: resumption adds %.1f KiB",
		plain/1024, resumable/1024, (resumable-plain)/1024)
}
