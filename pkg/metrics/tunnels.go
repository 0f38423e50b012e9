package metrics

import "github.com/prometheus/client_golang/prometheus"

// Tunnels counts one kind of tunnel of a daemon (its TCP and unix streams, or
// its UDP flows): open ones, each end by result, and the bytes carried. It
// implements tunnel.Metrics; its counters are resolved once, when the
// daemon's metrics are built.
type Tunnels struct {
	active  prometheus.Gauge
	results *prometheus.CounterVec
	// up and down are nil where bytes are counted per packet (UDP flows).
	up, down prometheus.Counter
}

// newTunnels returns the Tunnels over active, results (by result) and bytes
// (by direction; nil: not counted at the tunnel's end).
func newTunnels(active prometheus.Gauge, results, bytes *prometheus.CounterVec) *Tunnels {
	t := &Tunnels{active: active, results: results}
	if bytes != nil {
		t.up = bytes.WithLabelValues(DirectionUpstream)
		t.down = bytes.WithLabelValues(DirectionDownstream)
	}
	return t
}

// TunnelOpened counts an open tunnel.
func (t *Tunnels) TunnelOpened() { t.active.Inc() }

// TunnelClosed counts a tunnel's end with its result label (ok or a
// protocol code's name) and the bytes it carried upstream and downstream.
func (t *Tunnels) TunnelClosed(result string, upstream, downstream int64) {
	t.active.Dec()
	if t.up != nil {
		t.up.Add(float64(upstream))
		t.down.Add(float64(downstream))
	}
	t.results.WithLabelValues(result).Inc()
}
