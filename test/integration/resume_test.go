package integration

import (
	"crypto/rand"
	"crypto/sha256"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/server"
)

// resumeSide is one daemon's resumable tunnels and their metrics.
type resumeSide struct {
	table   *resume.Table
	budget  *resume.Budget
	metrics *metrics.Resume
}

func newResumeSide(newMetrics func(prometheus.Registerer, func() int64) *metrics.Resume) *resumeSide {
	b := resume.NewBudget(64 << 20)
	return &resumeSide{table: resume.NewTable(), budget: b, metrics: newMetrics(prometheus.NewRegistry(), b.Used)}
}

func (r *resumeSide) egress(window time.Duration) *egress.Resume {
	return &egress.Resume{Table: r.table, Window: func() time.Duration { return window }, Budget: r.budget, Events: r.metrics}
}

func (r *resumeSide) ingress(window time.Duration) *ingress.Resume {
	return &ingress.Resume{Table: r.table, Window: func() time.Duration { return window }, Budget: r.budget, Events: r.metrics}
}

// shortIdle makes QUIC connections die after a second without packets.
func shortIdle(q *transport.QUICOptions) {
	q.IdleTimeout = time.Second
	q.KeepAlivePeriod = 300 * time.Millisecond
}

// gatedPeer writes part random bytes on c, waits for gate, writes part
// more and half-closes, while it reads everything c sends: got counts the
// bytes read; sent and recv are the SHA-256 of each direction once done.
type gatedPeer struct {
	got        atomic.Int64
	sent, recv chan [32]byte
	wg         sync.WaitGroup
}

func runGatedPeer(c net.Conn, part int, gate <-chan struct{}) *gatedPeer {
	p := &gatedPeer{sent: make(chan [32]byte, 1), recv: make(chan [32]byte, 1)}
	p.wg.Go(func() {
		h := sha256.New()
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			h.Write(buf[:n])
			p.got.Add(int64(n))
			if err != nil {
				break
			}
		}
		p.recv <- [32]byte(h.Sum(nil))
	})
	p.wg.Go(func() {
		h := sha256.New()
		chunk := make([]byte, 16<<10)
		write := func() {
			for left := part; left > 0; left -= len(chunk) {
				_, _ = rand.Read(chunk)
				h.Write(chunk)
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		}
		write()
		<-gate
		write()
		_ = c.(interface{ CloseWrite() error }).CloseWrite()
		p.sent <- [32]byte(h.Sum(nil))
	})
	return p
}

func hashOf(t *testing.T, ch chan [32]byte) [32]byte {
	t.Helper()
	select {
	case h := <-ch:
		return h
	case <-time.After(60 * time.Second):
		t.Fatal("transfer did not finish")
		return [32]byte{}
	}
}

// TestResumeAcrossLostConnection (issue 34 part 1): a tunnel moving data
// both ways survives a blackout longer than the idle timeout, which kills
// the QUIC connection on both ends: both park it, the client reconnects
// and re-attaches it, and every byte arrives once and in order (SHA-256
// both ways), including those the applications wrote during the outage.
func TestResumeAcrossLostConnection(t *testing.T) {
	t.Parallel()
	const part = 1 << 20
	gate := make(chan struct{})
	dests := make(chan *gatedPeer, 1)
	dest := testutil.ServeTCP(t, func(c net.Conn) {
		p := runGatedPeer(c, part, gate)
		dests <- p
		p.wg.Wait()
	})
	srvSide := newResumeSide(server.NewResumeMetrics)
	cliSide := newResumeSide(client.NewResumeMetrics)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + dest}, QUIC: shortIdle,
		Mutate: func(c *server.Config) { c.Resume = srvSide.egress(time.Minute) }})
	var dark atomic.Bool
	proxy := lossyProxy(t, srv, 2*time.Millisecond, &dark, nil)
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + dest, ServerAddr: proxy, WaitReady: true, QUIC: shortIdle,
		Mutate: func(c *client.Config) { c.Resume = cliSide.ingress(time.Minute) }})
	app := runGatedPeer(dial(t, cl.Addr), part, gate)
	var far *gatedPeer
	select {
	case far = <-dests:
	case <-time.After(30 * time.Second):
		t.Fatal("no tunnel reached the destination")
	}
	require.Eventually(t, func() bool { return app.got.Load() >= part && far.got.Load() >= part }, 60*time.Second, 10*time.Millisecond)

	dark.Store(true)
	close(gate) // the applications write on while the link is dark
	for _, m := range []*metrics.Resume{srvSide.metrics, cliSide.metrics} {
		require.Eventually(t, func() bool { return promtest.ToFloat64(m.Parked) == 1 }, 30*time.Second, 10*time.Millisecond,
			"both ends park the tunnel once their connection timed out")
	}
	dark.Store(false)

	appSent, appRecv := hashOf(t, app.sent), hashOf(t, app.recv)
	farSent, farRecv := hashOf(t, far.sent), hashOf(t, far.recv)
	assert.Equal(t, appSent, farRecv, "application to destination")
	assert.Equal(t, farSent, appRecv, "destination to application")
	assert.Equal(t, int64(2*part), app.got.Load())
	assert.Equal(t, int64(2*part), far.got.Load())
	for _, m := range []*metrics.Resume{srvSide.metrics, cliSide.metrics} {
		assert.Equal(t, 1.0, promtest.ToFloat64(m.Resumed))
		for _, r := range resume.GaveUpReasons() {
			assert.Zero(t, promtest.ToFloat64(m.GaveUp.WithLabelValues(r)), r)
		}
	}
	t.Logf("resent after the outage: client %.0f bytes, server %.0f bytes",
		promtest.ToFloat64(cliSide.metrics.Resent), promtest.ToFloat64(srvSide.metrics.Resent))
	require.Eventually(t, func() bool { return srvSide.table.Len() == 0 && cliSide.table.Len() == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return srvSide.budget.Used() == 0 && cliSide.budget.Used() == 0 }, 10*time.Second, 10*time.Millisecond,
		"ended tunnels give back their buffers")
}
