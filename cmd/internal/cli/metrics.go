package cli

import (
	"github.com/quictun/quictun/pkg/fec"
	"github.com/quictun/quictun/pkg/liveness"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/transport"
)

// The adapters below read the domain packages' counters into the plain
// structs pkg/metrics exports at scrape time: pkg/metrics imports no quictun
// package, the composition joins them.

// QUICConns returns the metrics.QUICCollector source over live.
func QUICConns(live func() []transport.ConnStats) func() []metrics.Conn {
	return func() []metrics.Conn {
		in := live()
		out := make([]metrics.Conn, 0, len(in))
		for _, c := range in {
			if c.Transport == transport.TransportTCP {
				continue // no QUIC statistics
			}
			out = append(out, metrics.Conn{Label: c.Label, Stats: c.Stats})
			i := len(out) - 1
			if cs := c.Congestion; cs != nil {
				out[i].Congestion = &metrics.Congestion{
					Algorithm: string(cs.Algorithm), State: cs.State,
					PacingRateBytesPerSecond: cs.PacingRateBytesPerSecond,
					BandwidthBytesPerSecond:  cs.BandwidthBytesPerSecond,
					InflightCap:              cs.InflightCap,
				}
			}
		}
		return out
	}
}

// livenessCounts returns the metrics.LivenessCollector source over st.
func livenessCounts(st *liveness.Stats) func() metrics.LivenessCounts {
	return func() metrics.LivenessCounts {
		return metrics.LivenessCounts{
			HeartbeatsSent: st.HeartbeatsSent.Load(), EchoesReceived: st.EchoesReceived.Load(),
			EchoesSent: st.EchoesSent.Load(), TailProbesSent: st.TailProbesSent.Load(),
			KeepAlivesSent: st.KeepAlivesSent.Load(), Invalid: st.Invalid.Load(),
		}
	}
}

// fecCounts returns the metrics.FECCollector source over st.
func fecCounts(st *fec.Stats) func() metrics.FECCounts {
	return func() metrics.FECCounts {
		return metrics.FECCounts{
			DataSent: st.DataSent.Load(), ParitySent: st.ParitySent.Load(),
			DataReceived: st.DataReceived.Load(), ParityReceived: st.ParityRecv.Load(),
			Recovered: st.Recovered.Load(), Unrecoverable: st.Unrecoverable.Load(), Malformed: st.Malformed.Load(),
		}
	}
}
