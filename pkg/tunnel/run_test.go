package tunnel_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/splice"
	"github.com/quictun/quictun/pkg/tunnel"
)

// runner is a Runner whose Run waits for end, then moves bytes and returns
// err, or the code Abort was called with.
type runner struct {
	t        *tunnel.Tunnel
	up, down int64
	err      error
	end      chan struct{}
	aborted  chan proto.Code
}

func (r *runner) Abort(c proto.Code) { r.aborted <- c }

func (r *runner) Run() error {
	select {
	case <-r.end:
	case c := <-r.aborted:
		return &splice.AbortedError{Code: c, Cause: splice.ErrAborted}
	}
	r.t.Upstream.Add(r.up)
	r.t.Downstream.Add(r.down)
	return r.err
}

func newMetrics() tunnel.StreamMetrics {
	return tunnel.StreamMetrics{
		Active:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "active"}),
		Bytes:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bytes_total"}, []string{"direction"}),
		Results: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "results_total"}, []string{"result"}),
	}
}

// TestRegistryRun: the tunnel is registered (and counted active) exactly
// while its relay runs, its bytes are added by direction at the end, and its
// result is ok, the code of an abort (here through the registry, as DELETE
// /tunnels does), or the code the relay ended with.
func TestRegistryRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		err    error
		abort  bool
		result string
	}{
		{"clean end", nil, false, "ok"},
		{"aborted through the registry", nil, true, proto.CodeShutdown.String()},
		{"peer refused", &splice.AbortedError{Code: proto.CodeRefused}, false, proto.CodeRefused.String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg, m := tunnel.NewRegistry(), newMetrics()
			tn := newTunnel("tcp:127.0.0.1:22")
			r := &runner{t: tn, up: 100, down: 2000, err: tc.err, end: make(chan struct{}), aborted: make(chan proto.Code, 1)}
			type out struct {
				result string
				err    error
			}
			done := make(chan out, 1)
			go func() { res, err := reg.Run(tn, r, m); done <- out{res, err} }()
			require.Eventually(t, func() bool { return reg.Len() == 1 }, 5*time.Second, time.Millisecond, "registered while it runs")
			assert.Equal(t, 1.0, promtest.ToFloat64(m.Active))
			if tc.abort {
				reg.AbortAll(proto.CodeShutdown)
			} else {
				close(r.end)
			}
			o := <-done
			assert.Equal(t, tc.result, o.result)
			if tc.err != nil {
				assert.Equal(t, tc.err, o.err)
			}
			assert.Zero(t, reg.Len(), "removed when it ends")
			assert.Zero(t, promtest.ToFloat64(m.Active))
			up, down := 100.0, 2000.0
			if tc.abort {
				up, down = 0, 0
			}
			assert.Equal(t, up, promtest.ToFloat64(m.Bytes.WithLabelValues("upstream")))
			assert.Equal(t, down, promtest.ToFloat64(m.Bytes.WithLabelValues("downstream")))
			assert.Equal(t, 1.0, promtest.ToFloat64(m.Results.WithLabelValues(tc.result)))
		})
	}
}

// TestRegistryRunWithoutBytes: UDP flows count their bytes per packet, so
// Run adds none when StreamMetrics.Bytes is nil.
func TestRegistryRunWithoutBytes(t *testing.T) {
	t.Parallel()
	reg, m := tunnel.NewRegistry(), newMetrics()
	m.Bytes = nil
	tn := newTunnel("udp:127.0.0.1:53")
	r := &runner{t: tn, up: 1, down: 2, end: make(chan struct{}), aborted: make(chan proto.Code, 1)}
	close(r.end)
	res, err := reg.Run(tn, r, m)
	require.NoError(t, err)
	assert.Equal(t, "ok", res)
	assert.Equal(t, int64(1), tn.Upstream.Load())
}
