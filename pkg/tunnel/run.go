package tunnel

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/splice"
)

// StreamMetrics are the per-tunnel metrics both ends keep (the fields of the
// same names in metrics.Server and metrics.Client).
type StreamMetrics struct {
	Active  prometheus.Gauge       // open tunnels
	Bytes   *prometheus.CounterVec // by direction; nil: counted elsewhere (UDP flows count per packet)
	Results *prometheus.CounterVec // by result
}

// Runner is a tunnel's relay: *splice.Pipe for a TCP stream, *udpflow.Relay
// for a UDP flow. Run returns nil for a clean end or an
// *splice.AbortedError.
type Runner interface {
	Aborter
	Run() error
}

// Run registers t (its Upstream and Downstream are pipe's counters), runs
// pipe until both directions end, and accounts for the tunnel in m: open
// while it runs, its bytes by direction, and its result, ok or the code it
// was aborted with. It returns that result label and the relay's error.
func (r *Registry) Run(t *Tunnel, pipe Runner, m StreamMetrics) (string, error) {
	remove := r.Add(t, pipe)
	m.Active.Inc()
	err := pipe.Run()
	remove()
	m.Active.Dec()
	if m.Bytes != nil {
		m.Bytes.WithLabelValues(metrics.DirectionUpstream).Add(float64(t.Upstream.Load()))
		m.Bytes.WithLabelValues(metrics.DirectionDownstream).Add(float64(t.Downstream.Load()))
	}
	result := metrics.ResultOK
	var ab *splice.AbortedError
	if errors.As(err, &ab) {
		result = metrics.ResultLabel(ab.Code)
	}
	m.Results.WithLabelValues(result).Inc()
	return result, err
}
