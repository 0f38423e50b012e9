package cli

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/congestion"
	"github.com/quictun/quictun/pkg/fec"
	"github.com/quictun/quictun/pkg/liveness"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/transport"
)

func TestLivenessCollector(t *testing.T) {
	t.Parallel()
	st := &liveness.Stats{}
	st.HeartbeatsSent.Add(5)
	st.EchoesReceived.Add(4)
	st.EchoesSent.Add(3)
	st.TailProbesSent.Add(2)
	st.KeepAlivesSent.Add(6)
	st.Invalid.Add(1)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewLivenessCollector("server", livenessCounts(st)))
	expected := `
# HELP quictun_quic_datagrams_total Liveness datagrams by type: heartbeat_sent, echo_received, echo_sent, tail_probe_sent, keepalive_sent (an idle client's, every --keepalive-period), invalid (received and dropped).
# TYPE quictun_quic_datagrams_total counter
quictun_quic_datagrams_total{side="server",type="echo_received"} 4
quictun_quic_datagrams_total{side="server",type="echo_sent"} 3
quictun_quic_datagrams_total{side="server",type="heartbeat_sent"} 5
quictun_quic_datagrams_total{side="server",type="invalid"} 1
quictun_quic_datagrams_total{side="server",type="keepalive_sent"} 6
quictun_quic_datagrams_total{side="server",type="tail_probe_sent"} 2
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected)))

	st.Invalid.Add(10) // read at scrape time
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(
		strings.Replace(expected, `type="invalid"} 1`, `type="invalid"} 11`, 1))))
}

func TestFECCollector(t *testing.T) {
	t.Parallel()
	st := &fec.Stats{}
	for i, c := range []*atomic.Uint64{&st.DataSent, &st.ParitySent, &st.DataReceived, &st.ParityRecv, &st.Recovered, &st.Unrecoverable, &st.Malformed} {
		c.Add(uint64(i + 1))
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewFECCollector("client", fecCounts(st)))
	expected := `
# HELP quictun_fec_datagrams_total Forward error correction datagrams by type: data_sent, parity_sent, data_received, parity_received, recovered (rebuilt from parity), unrecoverable, malformed.
# TYPE quictun_fec_datagrams_total counter
quictun_fec_datagrams_total{side="client",type="data_received"} 3
quictun_fec_datagrams_total{side="client",type="data_sent"} 1
quictun_fec_datagrams_total{side="client",type="malformed"} 7
quictun_fec_datagrams_total{side="client",type="parity_received"} 4
quictun_fec_datagrams_total{side="client",type="parity_sent"} 2
quictun_fec_datagrams_total{side="client",type="recovered"} 5
quictun_fec_datagrams_total{side="client",type="unrecoverable"} 6
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected)))
}

// TestQUICConns: a connection's congestion controller state reaches the
// per-connection series; reno's (nil) is counted as unknown.
func TestQUICConns(t *testing.T) {
	t.Parallel()
	live := func() []transport.ConnStats {
		return []transport.ConnStats{
			{Label: "0", Stats: quic.ConnectionStats{SmoothedRTT: 20 * time.Millisecond, CongestionWindow: 12000},
				Congestion: &congestion.Stats{Algorithm: congestion.Algorithm("bbr"), State: "probe_bw",
					PacingRateBytesPerSecond: 1.5e6, BandwidthBytesPerSecond: 1.2e6, InflightCap: 90000, MinRTT: time.Millisecond}},
			{Label: "1", RemoteAddress: "192.0.2.1:7500", Stats: quic.ConnectionStats{SmoothedRTT: 30 * time.Millisecond}},
			// The TCP fallback's connection has no QUIC series.
			{Label: "tcp", Transport: transport.TransportTCP, RemoteAddress: "192.0.2.1:7500"},
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewQUICCollector("client", true, QUICConns(live)))
	expected := `
# HELP quictun_quic_bandwidth_estimate_bytes_per_second Bottleneck bandwidth estimated by bbr.
# TYPE quictun_quic_bandwidth_estimate_bytes_per_second gauge
quictun_quic_bandwidth_estimate_bytes_per_second{conn="0",side="client"} 1.2e+06
# HELP quictun_quic_congestion_state 1 for the congestion controller's current state (bbr: startup, drain, probe_bw, probe_rtt; cubic: slow_start, congestion_avoidance, recovery).
# TYPE quictun_quic_congestion_state gauge
quictun_quic_congestion_state{algorithm="bbr",conn="0",side="client",state="probe_bw"} 1
# HELP quictun_quic_connections_by_congestion_state Live QUIC connections by congestion controller and state (reno: quic-go's built-in, state unknown).
# TYPE quictun_quic_connections_by_congestion_state gauge
quictun_quic_connections_by_congestion_state{algorithm="bbr",side="client",state="probe_bw"} 1
quictun_quic_connections_by_congestion_state{algorithm="reno",side="client",state="unknown"} 1
# HELP quictun_quic_inflight_cap_bytes bbr's loss-driven cap on bytes in flight; 0 when there is none.
# TYPE quictun_quic_inflight_cap_bytes gauge
quictun_quic_inflight_cap_bytes{conn="0",side="client"} 90000
# HELP quictun_quic_pacing_rate_bytes_per_second Pacing rate of the connection's congestion controller (bbr, cubic).
# TYPE quictun_quic_pacing_rate_bytes_per_second gauge
quictun_quic_pacing_rate_bytes_per_second{conn="0",side="client"} 1.5e+06
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected),
		"quictun_quic_bandwidth_estimate_bytes_per_second", "quictun_quic_congestion_state",
		"quictun_quic_connections_by_congestion_state", "quictun_quic_inflight_cap_bytes",
		"quictun_quic_pacing_rate_bytes_per_second"))
	assert.Len(t, QUICConns(live)(), 2, "the TCP connection left out")
	assert.Len(t, QUICConns(func() []transport.ConnStats { return nil })(), 0)
}
