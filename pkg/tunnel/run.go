package tunnel

import (
	"errors"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/splice"
)

// Metrics counts tunnels as they open and end: a daemon's metrics
// (metrics.Tunnels implements it with Prometheus). NopMetrics counts nothing.
type Metrics interface {
	// TunnelOpened reports a tunnel that started relaying.
	TunnelOpened()
	// TunnelClosed reports its end: its result label (ok, or the name of the
	// code it was aborted with) and the bytes it carried upstream (toward
	// the destination) and downstream.
	TunnelClosed(result string, upstream, downstream int64)
}

// NopMetrics is a Metrics that counts nothing.
type NopMetrics struct{}

// TunnelOpened implements Metrics.
func (NopMetrics) TunnelOpened() {}

// TunnelClosed implements Metrics.
func (NopMetrics) TunnelClosed(string, int64, int64) {}

// Runner is a tunnel's relay: *splice.Pipe for a TCP stream, *udpflow.Relay
// for a UDP flow. Run returns nil for a clean end or an
// *splice.AbortedError.
type Runner interface {
	Aborter
	Run() error
}

// Run registers t (its Upstream and Downstream are pipe's counters), runs
// pipe until both directions end, and reports the tunnel to m: opened, then
// closed with its bytes by direction and its result, ok or the code it was
// aborted with. It returns that result label and the relay's error.
func (r *Registry) Run(t *Tunnel, pipe Runner, m Metrics) (string, error) {
	if m == nil {
		m = NopMetrics{}
	}
	remove := r.Add(t, pipe)
	m.TunnelOpened()
	err := pipe.Run()
	remove()
	result := proto.CodeOK.String()
	var ab *splice.AbortedError
	if errors.As(err, &ab) {
		result = ab.Code.String()
	}
	m.TunnelClosed(result, t.Upstream.Load(), t.Downstream.Load())
	return result, err
}
