package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quictun/quictun/pkg/metrics"
)

// BenchmarkUDPOnPacket is the per-packet cost of the UDP packet hook (every
// UDP packet a flow carries, each direction).
func BenchmarkUDPOnPacket(b *testing.B) {
	for _, path := range []string{"datagram", "stream"} {
		b.Run(path, func(b *testing.B) {
			m := metrics.NewClient(prometheus.NewPedanticRegistry(), labels)
			up := m.UDP.OnPacket(metrics.DirectionUpstream)
			for b.Loop() {
				up(path, 1200)
			}
		})
	}
}
