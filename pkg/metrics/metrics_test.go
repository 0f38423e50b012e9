package metrics_test

import (
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/metrics"
)

// labels are the label values server.MetricLabels and client.MetricLabels
// pass in (the daemons' own test, test/deploy, checks the composition against
// the dashboard and rules); this package imports no domain package.
var labels = metrics.Labels{
	Codes: []string{"ok", "refused", "dial_failed", "auth_failed", "bad_header", "shutdown", "timeout", "reset",
		"internal", "overloaded", "replay", "bad_token", "unsupported"},
	Networks:       []string{"tcp", "udp", "unix"},
	RefusalReasons: []string{"not_allowed", "denied", "reserved", "self", "unresolved"},
	UDPDropReasons: []string{"unknown_flow", "malformed", "queue_full", "flow_limit", "identity_flow_limit",
		"write_error", "no_session", "foreign_source", "receive_queue"},
	UDPDropReceiveQueue:     "receive_queue",
	UDPPathDatagram:         "datagram",
	UDPPathStream:           "stream",
	AuthFailureReasons:      []string{"no_mac", "unknown_key", "bad_mac"},
	ReplayUnrecordedReasons: []string{"cache_full", "conn_quota"},
	Proxies:                 []string{"socks5", "http_connect"},
	ProxyAuthReasons:        []string{"missing", "wrong"},
	NoSession:               "no_session",
	TicketIssuers:           []string{"this_replica", "other_replica", "unknown"},
}

func TestMetricsLint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		reg  func(*prometheus.Registry)
	}{
		{"server", func(r *prometheus.Registry) { metrics.NewServer(r, labels) }},
		{"client", func(r *prometheus.Registry) { metrics.NewClient(r, labels) }},
		{"reload and admin", func(r *prometheus.Registry) {
			metrics.NewReload(r, "server")
			metrics.NewAdminRefused(r, "server", []string{"host", "origin"})
		}},
		{"auth hook", func(r *prometheus.Registry) {
			metrics.NewAuthHookCalls(r)
			metrics.NewAuthHookState(r, func() (int, int) { return 0, 0 })
		}},
		{"quic and liveness", func(r *prometheus.Registry) {
			r.MustRegister(metrics.NewQUICCollector("client", true, func() []metrics.Conn {
				return []metrics.Conn{
					{Label: "0", Stats: quic.ConnectionStats{SmoothedRTT: time.Millisecond}},
					{Label: "1", Congestion: &metrics.Congestion{Algorithm: "bbr", State: "probe_bw", PacingRateBytesPerSecond: 1e6}},
				}
			}), metrics.NewLivenessCollector("client", func() metrics.LivenessCounts { return metrics.LivenessCounts{} }),
				metrics.NewFECCollector("client", func() metrics.FECCounts { return metrics.FECCounts{} }))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewPedanticRegistry()
			tc.reg(reg)
			problems, err := testutil.GatherAndLint(reg)
			require.NoError(t, err)
			assert.Empty(t, problems)
			mfs, err := reg.Gather()
			require.NoError(t, err)
			require.NotEmpty(t, mfs)
			for _, mf := range mfs {
				assert.True(t, strings.HasPrefix(mf.GetName(), metrics.Namespace+"_"), mf.GetName())
				for _, m := range mf.GetMetric() {
					for _, l := range m.GetLabel() {
						assert.NotContains(t, []string{"ip", "address", "destination", "stream_id", "token"}, l.GetName(),
							"%s: high-cardinality label", mf.GetName())
					}
				}
			}
		})
	}
}

func TestServerPrecreatedSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	metrics.NewServer(reg, labels)
	expected := `
# HELP quictun_server_stream_bytes_total Application bytes carried, by direction (upstream = toward the destination).
# TYPE quictun_server_stream_bytes_total counter
quictun_server_stream_bytes_total{direction="downstream"} 0
quictun_server_stream_bytes_total{direction="upstream"} 0
# HELP quictun_server_connections_total Connections accepted (QUIC, and TCP: active_tcp_connections), by how they ended (closed, idle_timeout, auth_failed, auth_timeout: no authenticated stream header within --idle-auth-timeout of the handshake, shutdown, error).
# TYPE quictun_server_connections_total counter
quictun_server_connections_total{result="auth_failed"} 0
quictun_server_connections_total{result="auth_timeout"} 0
quictun_server_connections_total{result="closed"} 0
quictun_server_connections_total{result="error"} 0
quictun_server_connections_total{result="flood"} 0
quictun_server_connections_total{result="idle_timeout"} 0
quictun_server_connections_total{result="protocol_error"} 0
quictun_server_connections_total{result="shutdown"} 0
# HELP quictun_server_refused_destinations_total Streams refused because the destination is not allowed, by network (tcp, udp, unix) and reason (not_allowed: no --allow rule; denied: a --deny rule; reserved: unspecified or cloud metadata address; self: the server's own QUIC or admin listener; unresolved: the name does not resolve).
# TYPE quictun_server_refused_destinations_total counter
quictun_server_refused_destinations_total{network="tcp",reason="denied"} 0
quictun_server_refused_destinations_total{network="tcp",reason="not_allowed"} 0
quictun_server_refused_destinations_total{network="tcp",reason="reserved"} 0
quictun_server_refused_destinations_total{network="tcp",reason="self"} 0
quictun_server_refused_destinations_total{network="tcp",reason="unresolved"} 0
quictun_server_refused_destinations_total{network="udp",reason="denied"} 0
quictun_server_refused_destinations_total{network="udp",reason="not_allowed"} 0
quictun_server_refused_destinations_total{network="udp",reason="reserved"} 0
quictun_server_refused_destinations_total{network="udp",reason="self"} 0
quictun_server_refused_destinations_total{network="udp",reason="unresolved"} 0
quictun_server_refused_destinations_total{network="unix",reason="denied"} 0
quictun_server_refused_destinations_total{network="unix",reason="not_allowed"} 0
quictun_server_refused_destinations_total{network="unix",reason="reserved"} 0
quictun_server_refused_destinations_total{network="unix",reason="self"} 0
quictun_server_refused_destinations_total{network="unix",reason="unresolved"} 0
# HELP quictun_server_active_streams Tunnel streams currently open.
# TYPE quictun_server_active_streams gauge
quictun_server_active_streams 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected),
		"quictun_server_stream_bytes_total", "quictun_server_connections_total",
		"quictun_server_refused_destinations_total", "quictun_server_active_streams"))

	assert.Equal(t, []string{"handshake_rate", "max_connections", "per_source_limit", metrics.RefusedTCPHandshakes, metrics.RefusedTCPHandshakesPerSource,
		metrics.RefusedTCPWaiting, metrics.RefusedTCPWaitingPerSource}, labelValues(t, reg, "quictun_server_refused_connections_total", "reason"))
	assert.Equal(t, []string{metrics.PreauthAuthTimeout, metrics.PreauthUnverifiedStreamsLimit, metrics.PreauthSourceUnverifiedStreamsLimit},
		labelValues(t, reg, "quictun_server_preauth_rejections_total", "reason"))
	assert.Equal(t, []string{"cache_full", "conn_quota"},
		labelValues(t, reg, "quictun_server_replay_unrecorded_total", "reason"))
	assert.Equal(t, []string{"other_replica", "this_replica", "unknown"},
		labelValues(t, reg, "quictun_server_session_tickets_total", "issuer"))

	results := labelValues(t, reg, "quictun_server_streams_total", "result")
	for _, c := range labels.Codes {
		assert.Contains(t, results, c)
	}
	assert.Contains(t, results, "ok")
	assert.Len(t, results, len(labels.Codes))
}

func TestClientPrecreatedSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := metrics.NewClient(reg, labels)
	expected := `
# HELP quictun_client_dials_total QUIC connection attempts, by result (ok, ok_0rtt: resumed with 0-RTT, 0rtt_rejected: resumed but the server refused 0-RTT, error, auth_failed, cert_rejected: the server's certificate did not verify, a pin or the CA refused it).
# TYPE quictun_client_dials_total counter
quictun_client_dials_total{result="0rtt_rejected"} 0
quictun_client_dials_total{result="auth_failed"} 0
quictun_client_dials_total{result="cert_rejected"} 0
quictun_client_dials_total{result="error"} 0
quictun_client_dials_total{result="ok"} 0
quictun_client_dials_total{result="ok_0rtt"} 0
# HELP quictun_client_path_rescues_total Blackout rescues: switched (a new path validated), recovered (the old path came back first), error.
# TYPE quictun_client_path_rescues_total counter
quictun_client_path_rescues_total{result="error"} 0
quictun_client_path_rescues_total{result="recovered"} 0
quictun_client_path_rescues_total{result="switched"} 0
# HELP quictun_client_session_up 1 while a connection to the server is up (QUIC, or TCP: quictun_client_transport).
# TYPE quictun_client_session_up gauge
quictun_client_session_up 0
# HELP quictun_client_reconnects_total QUIC connections lost after having been up (each starts a reconnect).
# TYPE quictun_client_reconnects_total counter
quictun_client_reconnects_total 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected),
		"quictun_client_dials_total", "quictun_client_path_rescues_total",
		"quictun_client_session_up", "quictun_client_reconnects_total"))

	results := labelValues(t, reg, "quictun_client_streams_total", "result")
	assert.Contains(t, results, "no_session")
	assert.Contains(t, results, "ok")
	assert.Contains(t, results, "refused")
	assert.Equal(t, []string{"downstream", "upstream"}, labelValues(t, reg, "quictun_client_stream_bytes_total", "direction"))

	// The returned handles feed the registered series.
	m.StreamsTotal.WithLabelValues("refused").Inc()
	m.SessionUp.Set(1)
	assert.InDelta(t, 1, testutil.ToFloat64(m.StreamsTotal.WithLabelValues("refused")), 0)
	assert.InDelta(t, 1, testutil.ToFloat64(m.SessionUp), 0)
}

func TestDurationBuckets(t *testing.T) {
	t.Parallel()
	b := metrics.DurationBuckets
	require.NotEmpty(t, b)
	assert.InDelta(t, 0.0001, b[0], 1e-9)
	assert.InDelta(t, 10, b[len(b)-1], 1e-6)
	assert.True(t, sort.Float64sAreSorted(b))
}

// labelValues returns the sorted values of label on the series of metric name.
func labelValues(t *testing.T, g prometheus.Gatherer, name, label string) []string {
	t.Helper()
	mf := family(t, g, name)
	var out []string
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out = append(out, l.GetValue())
			}
		}
	}
	sort.Strings(out)
	return out
}

func family(t *testing.T, g prometheus.Gatherer, name string) *dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	t.Fatalf("metric %s not gathered", name)
	return nil
}

// values returns name{conn=...} -> value for a family (counter, gauge, or histogram sample count).
func values(t *testing.T, g prometheus.Gatherer, name string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, m := range family(t, g, name).GetMetric() {
		key := ""
		for _, l := range m.GetLabel() {
			if l.GetName() != "side" {
				key += l.GetName() + "=" + l.GetValue()
			}
		}
		switch {
		case m.Counter != nil:
			out[key] = m.GetCounter().GetValue()
		case m.Gauge != nil:
			out[key] = m.GetGauge().GetValue()
		case m.Histogram != nil:
			out[key] = float64(m.GetHistogram().GetSampleCount())
		}
	}
	return out
}

// fakeConns is a mutable set of live connection stats.
type fakeConns struct {
	mu    sync.Mutex
	conns []metrics.Conn
}

func (f *fakeConns) live() []metrics.Conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]metrics.Conn(nil), f.conns...)
}

func (f *fakeConns) set(cs ...metrics.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conns = cs
}

func stats(n uint64, srtt time.Duration) quic.ConnectionStats {
	return quic.ConnectionStats{
		PacketsSent: n, PacketsReceived: 2 * n, PacketsLost: n / 10,
		BytesSent: 1000 * n, BytesReceived: 2000 * n, BytesLost: 100 * n,
		SmoothedRTT: srtt, MinRTT: srtt / 2, LatestRTT: srtt + time.Millisecond, MeanDeviation: srtt / 4,
		CongestionWindow: 12000 + n, TailCopiesSent: n / 50,
	}
}

func TestQUICCollectorCounters(t *testing.T) {
	t.Parallel()
	fc := &fakeConns{}
	col := metrics.NewQUICCollector("server", false, fc.live)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)

	counters := []string{
		"quictun_quic_packets_sent_total", "quictun_quic_packets_received_total", "quictun_quic_packets_lost_total",
		"quictun_quic_sent_bytes_total", "quictun_quic_received_bytes_total", "quictun_quic_lost_bytes_total",
		"quictun_quic_tail_copies_sent_total",
	}
	snapshot := func() map[string]float64 {
		out := map[string]float64{}
		for _, n := range counters {
			out[n] = values(t, reg, n)[""]
		}
		return out
	}
	for _, v := range snapshot() {
		assert.Zero(t, v, "nothing yet")
	}
	assert.Equal(t, map[string]float64{"": 0}, values(t, reg, "quictun_quic_connections"))

	a := metrics.Conn{Label: "a", Stats: stats(100, 10*time.Millisecond)}
	b := metrics.Conn{Label: "b", Stats: stats(50, 3*time.Second)}
	fc.set(a, b)
	s1 := snapshot()
	assert.InDelta(t, 150, s1["quictun_quic_packets_sent_total"], 0)
	assert.InDelta(t, 300, s1["quictun_quic_packets_received_total"], 0)
	assert.InDelta(t, 15, s1["quictun_quic_packets_lost_total"], 0)
	assert.InDelta(t, 150000, s1["quictun_quic_sent_bytes_total"], 0)
	assert.InDelta(t, 300000, s1["quictun_quic_received_bytes_total"], 0)
	assert.InDelta(t, 15000, s1["quictun_quic_lost_bytes_total"], 0)
	assert.InDelta(t, 3, s1["quictun_quic_tail_copies_sent_total"], 0)
	assert.Equal(t, map[string]float64{"": 2}, values(t, reg, "quictun_quic_connections"))
	assert.Equal(t, map[string]float64{"": 2}, values(t, reg, "quictun_quic_connection_smoothed_rtt_seconds"))

	// b closes with its final stats: totals do not drop.
	bFinal := stats(60, time.Second)
	fc.set(a)
	col.Closed(bFinal)
	s2 := snapshot()
	assert.InDelta(t, 160, s2["quictun_quic_packets_sent_total"], 0, "live a + closed b")
	for _, n := range counters {
		assert.GreaterOrEqual(t, s2[n], s1[n], "%s went down after a close", n)
	}
	assert.Equal(t, map[string]float64{"": 1}, values(t, reg, "quictun_quic_connections"))

	// a closes too; nothing live, totals are the closed sums.
	fc.set()
	col.Closed(a.Stats)
	s3 := snapshot()
	assert.InDelta(t, 160, s3["quictun_quic_packets_sent_total"], 0)
	assert.InDelta(t, 320, s3["quictun_quic_packets_received_total"], 0)
	assert.InDelta(t, 160000, s3["quictun_quic_sent_bytes_total"], 0)
	assert.Equal(t, map[string]float64{"": 0}, values(t, reg, "quictun_quic_connections"))

	// Without perConn there are no per-connection series.
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		assert.NotEqual(t, "quictun_quic_smoothed_rtt_seconds", mf.GetName())
	}
}

func TestQUICCollectorPerConnAndHistogram(t *testing.T) {
	t.Parallel()
	fc := &fakeConns{}
	fc.set(
		metrics.Conn{Label: "0", Stats: stats(1, 10*time.Millisecond)},
		metrics.Conn{Label: "1", Stats: stats(2, 2*time.Second)},
	)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewQUICCollector("client", true, fc.live))

	assert.Equal(t, map[string]float64{"conn=0": 0.010, "conn=1": 2}, values(t, reg, "quictun_quic_smoothed_rtt_seconds"))
	assert.Equal(t, map[string]float64{"conn=0": 0.005, "conn=1": 1}, values(t, reg, "quictun_quic_min_rtt_seconds"))
	assert.Equal(t, map[string]float64{"conn=0": 0.011, "conn=1": 2.001}, values(t, reg, "quictun_quic_latest_rtt_seconds"))
	assert.Equal(t, map[string]float64{"conn=0": 0.0025, "conn=1": 0.5}, values(t, reg, "quictun_quic_rtt_variance_seconds"))
	assert.Equal(t, map[string]float64{"conn=0": 12001, "conn=1": 12002}, values(t, reg, "quictun_quic_congestion_window_bytes"))

	h := family(t, reg, "quictun_quic_connection_smoothed_rtt_seconds").GetMetric()[0].GetHistogram()
	assert.Equal(t, uint64(2), h.GetSampleCount())
	assert.InDelta(t, 2.010, h.GetSampleSum(), 1e-9)
	for _, b := range h.GetBucket() {
		want := uint64(0)
		if b.GetUpperBound() >= 0.010 {
			want++
		}
		if b.GetUpperBound() >= 2 {
			want++
		}
		assert.Equal(t, want, b.GetCumulativeCount(), "bucket le=%g", b.GetUpperBound())
	}
	for _, m := range family(t, reg, "quictun_quic_smoothed_rtt_seconds").GetMetric() {
		var side string
		for _, l := range m.GetLabel() {
			if l.GetName() == "side" {
				side = l.GetValue()
			}
		}
		assert.Equal(t, "client", side)
	}
}

func TestQUICCollectorConcurrent(t *testing.T) {
	t.Parallel()
	fc := &fakeConns{}
	col := metrics.NewQUICCollector("server", false, fc.live)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				col.Closed(quic.ConnectionStats{PacketsSent: 1})
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			_, err := reg.Gather()
			assert.NoError(t, err)
		}
	})
	wg.Wait()
	assert.InDelta(t, 400, values(t, reg, "quictun_quic_packets_sent_total")[""], 0)
}

// TestTypeCollectorsReadAtScrape: the liveness and FEC collectors read
// their counters when scraped (the label mapping from liveness.Stats and
// fec.Stats is tested where they are joined, cmd/internal/cli).
func TestTypeCollectorsReadAtScrape(t *testing.T) {
	t.Parallel()
	var live, fecN atomic.Uint64
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(
		metrics.NewLivenessCollector("server", func() metrics.LivenessCounts { return metrics.LivenessCounts{Invalid: live.Load()} }),
		metrics.NewFECCollector("server", func() metrics.FECCounts { return metrics.FECCounts{Recovered: fecN.Load()} }))
	live.Store(1)
	fecN.Store(2)
	assert.InDelta(t, 1, values(t, reg, "quictun_quic_datagrams_total")["type=invalid"], 0)
	assert.InDelta(t, 2, values(t, reg, "quictun_fec_datagrams_total")["type=recovered"], 0)
	live.Add(10)
	assert.InDelta(t, 11, values(t, reg, "quictun_quic_datagrams_total")["type=invalid"], 0)
}

// TestAuthHookStateReadAtScrape: the hook's cache and in-flight gauges
// read its state when scraped.
func TestAuthHookStateReadAtScrape(t *testing.T) {
	t.Parallel()
	var cached, running atomic.Int64
	reg := prometheus.NewPedanticRegistry()
	metrics.NewAuthHookState(reg, func() (int, int) { return int(cached.Load()), int(running.Load()) })
	cached.Store(760)
	running.Store(4)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP quictun_server_auth_hook_cache_entries Answers of --auth-hook cached: keys and admitted certificates (--auth-hook-ttl), unknown key IDs and refused certificates (--auth-hook-negative-ttl) and failed calls (1s); bounded at 100,000, a full cache is cut to nine tenths.
# TYPE quictun_server_auth_hook_cache_entries gauge
quictun_server_auth_hook_cache_entries 760
# HELP quictun_server_auth_hook_lookups_in_flight Calls to --auth-hook running (at most --auth-hook-max-in-flight; a lookup past it is refused at once).
# TYPE quictun_server_auth_hook_lookups_in_flight gauge
quictun_server_auth_hook_lookups_in_flight 4
`), "quictun_server_auth_hook_cache_entries", "quictun_server_auth_hook_lookups_in_flight"))
	cached.Store(0)
	assert.InDelta(t, 0, values(t, reg, "quictun_server_auth_hook_cache_entries")[""], 0)
}

// TestTunnels: a daemon's Tunnels count open tunnels, results and (for
// streams, not UDP flows, whose bytes are counted per packet) bytes by
// direction into the registered series.
func TestTunnels(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := metrics.NewServer(reg, labels)
	m.Streams.TunnelOpened()
	m.Streams.TunnelOpened()
	assert.InDelta(t, 2, testutil.ToFloat64(m.ActiveStreams), 0)
	m.Streams.TunnelClosed("ok", 100, 2000)
	m.Streams.TunnelClosed("refused", 0, 0)
	assert.InDelta(t, 0, testutil.ToFloat64(m.ActiveStreams), 0)
	assert.Equal(t, map[string]float64{"direction=upstream": 100, "direction=downstream": 2000},
		values(t, reg, "quictun_server_stream_bytes_total"))
	assert.InDelta(t, 1, testutil.ToFloat64(m.StreamsTotal.WithLabelValues("ok")), 0)
	assert.InDelta(t, 1, testutil.ToFloat64(m.StreamsTotal.WithLabelValues("refused")), 0)

	m.UDP.Flows.TunnelOpened()
	assert.InDelta(t, 1, testutil.ToFloat64(m.UDP.FlowsActive), 0)
	m.UDP.Flows.TunnelClosed("timeout", 5, 6)
	assert.InDelta(t, 0, testutil.ToFloat64(m.UDP.FlowsActive), 0)
	assert.InDelta(t, 1, testutil.ToFloat64(m.UDP.FlowsTotal.WithLabelValues("timeout")), 0)
	assert.InDelta(t, 0, testutil.ToFloat64(m.UDP.BytesTotal.WithLabelValues("upstream")), 0, "flows count bytes per packet")
	assert.Equal(t, map[string]float64{"direction=upstream": 100, "direction=downstream": 2000},
		values(t, reg, "quictun_server_stream_bytes_total"), "not the streams' either")

	// The UDP packet hook sorts by the path label it was given.
	up := m.UDP.OnPacket(metrics.DirectionUpstream)
	up("datagram", 10)
	up("stream", 20)
	m.UDP.ReceiveQueueDrops(3)
	assert.InDelta(t, 1, testutil.ToFloat64(m.UDP.PacketsTotal.WithLabelValues("upstream", "datagram")), 0)
	assert.InDelta(t, 1, testutil.ToFloat64(m.UDP.PacketsTotal.WithLabelValues("upstream", "stream")), 0)
	assert.InDelta(t, 30, testutil.ToFloat64(m.UDP.BytesTotal.WithLabelValues("upstream")), 0)
	assert.InDelta(t, 3, testutil.ToFloat64(m.UDP.DropsTotal.WithLabelValues("receive_queue")), 0)
}

func TestQUICCollectorMonotonicAcrossClose(t *testing.T) {
	t.Parallel()
	fc := &fakeConns{}
	col := metrics.NewQUICCollector("server", false, fc.live)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	a := metrics.Conn{Label: "a", Stats: stats(100, time.Millisecond)}
	fc.set(a)
	before := values(t, reg, "quictun_quic_packets_sent_total")[""]
	fc.set() // the connection left the live set ...
	during := values(t, reg, "quictun_quic_packets_sent_total")[""]
	col.Closed(a.Stats) // ... and only now is it added to the closed sums
	after := values(t, reg, "quictun_quic_packets_sent_total")[""]
	assert.GreaterOrEqual(t, during, before, "counter went down during a close")
	assert.GreaterOrEqual(t, after, during)
	assert.InDelta(t, 100, after, 0, "exact again once the close is recorded")

	// The clamp does not freeze the counters: new traffic still shows.
	fc.set(metrics.Conn{Label: "b", Stats: stats(10, time.Millisecond)})
	assert.InDelta(t, 110, values(t, reg, "quictun_quic_packets_sent_total")[""], 0)
}

func TestQUICCollectorNoDoubleCountDuringClose(t *testing.T) {
	t.Parallel()
	x := metrics.Conn{Label: "x", Stats: stats(100, time.Millisecond)}
	var col *metrics.QUICCollector
	inLive := make(chan struct{})
	closedDone := make(chan struct{})
	var once sync.Once
	live := func() []metrics.Conn {
		first := false
		once.Do(func() { first = true })
		if !first {
			return nil // x is gone after its close
		}
		close(inLive)
		select { // give a concurrent Closed the chance to run now
		case <-closedDone:
		case <-time.After(100 * time.Millisecond):
		}
		return []metrics.Conn{x}
	}
	col = metrics.NewQUICCollector("server", false, live)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)

	go func() {
		<-inLive
		col.Closed(x.Stats) // the connection ends during the scrape
		close(closedDone)
	}()
	during := values(t, reg, "quictun_quic_packets_sent_total")[""]
	<-closedDone
	after := values(t, reg, "quictun_quic_packets_sent_total")[""]
	assert.InDelta(t, 100, during, 0, "counted once during the close")
	assert.InDelta(t, 100, after, 0, "exact after the close")
}
