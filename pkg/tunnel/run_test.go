package tunnel_test

import (
	"sync"
	"testing"
	"time"

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

// fakeMetrics records the events Run reports.
type fakeMetrics struct {
	mu       sync.Mutex
	active   int
	results  []string
	up, down int64
}

func (m *fakeMetrics) TunnelOpened() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.active++
}

func (m *fakeMetrics) TunnelClosed(result string, up, down int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.active--
	m.results = append(m.results, result)
	m.up += up
	m.down += down
}

func (m *fakeMetrics) get() (active int, results []string, up, down int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.active, append([]string(nil), m.results...), m.up, m.down
}

func newMetrics() *fakeMetrics { return &fakeMetrics{} }

// TestRegistryRun: the tunnel is registered (and reported open) exactly
// while its relay runs, its bytes are reported by direction at the end, and its
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
			active, _, _, _ := m.get()
			assert.Equal(t, 1, active)
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
			active, results, gotUp, gotDown := m.get()
			assert.Zero(t, active)
			up, down := int64(100), int64(2000)
			if tc.abort {
				up, down = 0, 0
			}
			assert.Equal(t, up, gotUp)
			assert.Equal(t, down, gotDown)
			assert.Equal(t, []string{tc.result}, results)
		})
	}
}

// TestRegistryRunNilMetrics: a nil Metrics counts nothing (NopMetrics).
func TestRegistryRunNilMetrics(t *testing.T) {
	t.Parallel()
	reg := tunnel.NewRegistry()
	tn := newTunnel("udp:127.0.0.1:53")
	r := &runner{t: tn, up: 1, down: 2, end: make(chan struct{}), aborted: make(chan proto.Code, 1)}
	close(r.end)
	res, err := reg.Run(tn, r, nil)
	require.NoError(t, err)
	assert.Equal(t, "ok", res)
	assert.Equal(t, int64(1), tn.Upstream.Load())
}
