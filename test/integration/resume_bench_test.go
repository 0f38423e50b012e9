package integration

import (
	"io"
	"net"
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

// BenchmarkResumeCost compares plain and resumable tunnels on the same
// daemons (the window switched between sub-benchmarks): one-way bulk into a
// discarding destination, and 64-byte ping-pong through an echo. Run with
// -count 3 and compare with benchstat: resumption should cost at most 1 %
// of the bulk throughput and nothing measurable on the round trip.
func BenchmarkResumeCost(b *testing.B) {
	sink := testutil.ServeTCP(b, func(c net.Conn) {
		_, _ = io.Copy(io.Discard, c)
		_ = c.(*net.TCPConn).CloseWrite()
	})
	echo := testutil.EchoServer(b)
	var window atomic.Int64
	win := func() time.Duration { return time.Duration(window.Load()) }
	srvSide := newResumeSide(server.NewResumeMetrics)
	cliSide := newResumeSide(client.NewResumeMetrics)
	srv := testutil.StartServer(b, testutil.ServerOptions{Allow: []string{"tcp:" + sink, "tcp:" + echo}, Mutate: func(c *server.Config) {
		c.Resume = &egress.Resume{Settings: resume.Settings{Table: srvSide.table, Window: win, Budget: srvSide.budget, Events: srvSide.metrics}}
	}})
	mk := func(dest string) *testutil.Client {
		return testutil.StartClient(b, srv, testutil.ClientOptions{Token: "tcp:" + dest, WaitReady: true, Mutate: func(c *client.Config) {
			c.Resume = &ingress.Resume{Table: cliSide.table, Window: win, Budget: cliSide.budget, Events: cliSide.metrics}
		}})
	}
	bulk, pp := mk(sink), mk(echo)
	bulkRun := func(b *testing.B) {
		buf := make([]byte, 64<<10)
		b.SetBytes(int64(len(buf)) * 256)
		for b.Loop() {
			c, err := net.Dial("tcp", bulk.Addr)
			require.NoError(b, err)
			for range 256 {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			_ = c.(*net.TCPConn).CloseWrite()
			_, _ = io.Copy(io.Discard, c)
			_ = c.Close()
		}
	}
	for _, mode := range []struct {
		name   string
		window time.Duration
	}{{"plain", 0}, {"resumable", time.Minute}} {
		window.Store(int64(mode.window))
		b.Run("bulk/"+mode.name, bulkRun)
		b.Run("pingpong64/"+mode.name, func(b *testing.B) { pingPong(b, pp.Addr, 64) })
	}
}
