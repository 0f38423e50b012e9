package integration

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
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

// BenchmarkResumeAnswer: how long after a lost connection's link returns
// the answer comes to a request the application wrote while its tunnel was
// parked (an echo, 25 ms each way): ms/answer, which includes the client's
// reconnect (its retries while the link was dark), and ms-after-reply/answer,
// from the server's reply to the re-attachment reaching the client (counted
// resumed) to the answer. Compare builds side by side: a re-attachment
// that does not wait for the reply saves one round trip there.
func BenchmarkResumeAnswer(b *testing.B) {
	const oneWay = 25 * time.Millisecond
	r := startResumable(b, testutil.EchoServer(b), oneWay)
	srvSide, cliSide, dark := r.srv, r.cli, &r.dark
	c := dial(b, r.addr)
	buf := make([]byte, 4)
	ping := func() {
		_, err := c.Write([]byte("ping"))
		require.NoError(b, err)
		_, err = io.ReadFull(c, buf)
		require.NoError(b, err)
	}
	ping()
	var total, afterReply time.Duration
	b.ResetTimer()
	for i := range b.N {
		require.Eventually(b, func() bool { return cliSide.budget.Used() == 0 && srvSide.budget.Used() == 0 }, 30*time.Second, time.Millisecond,
			"every byte confirmed")
		dark.Store(true)
		for _, s := range []*resumeSide{srvSide, cliSide} {
			require.Eventually(b, func() bool { return promtest.ToFloat64(s.metrics.Parked) == float64(i+1) }, 30*time.Second, time.Millisecond)
		}
		_, err := c.Write([]byte("ping"))
		require.NoError(b, err)
		resumed := make(chan time.Time, 1)
		go func() { // the client counts the tunnel resumed when the server's reply came
			for promtest.ToFloat64(cliSide.metrics.Resumed) < float64(i+1) {
				time.Sleep(200 * time.Microsecond)
			}
			resumed <- time.Now()
		}()
		start := time.Now()
		dark.Store(false)
		_, err = io.ReadFull(c, buf)
		require.NoError(b, err)
		answered := time.Now()
		total += answered.Sub(start)
		afterReply += answered.Sub(<-resumed)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/answer")
	b.ReportMetric(float64(afterReply.Microseconds())/1000/float64(b.N), "ms-after-reply/answer")
}
