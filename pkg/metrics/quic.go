package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/quictun/quictun/pkg/congestion"
	"github.com/quictun/quictun/pkg/fec"
	"github.com/quictun/quictun/pkg/liveness"
)

// ConnStats is one live connection's statistics, with the label it is exported
// under when per-connection series are enabled (the client's connection index).
type ConnStats struct {
	Label string
	// RemoteAddress and LocalAddress are the connection's UDP addresses.
	RemoteAddress, LocalAddress string
	// ClientIdentity is who the client proved to be (server side: "CN=NAME",
	// "key=NAME"); empty otherwise.
	ClientIdentity string
	// ClientSubject is the subject of the client's certificate (server side,
	// mutual TLS); empty otherwise.
	ClientSubject string
	Stats         quic.ConnectionStats
	// Congestion is the state of quictun's congestion controller; nil when
	// quic-go's built-in one (reno) is in use.
	Congestion *congestion.Stats
}

// ConnStatsOf reads c's statistics and its congestion controller's state.
func ConnStatsOf(label string, c *quic.Conn) ConnStats {
	s := ConnStats{Label: label, Stats: c.ConnectionStats(), RemoteAddress: c.RemoteAddr().String(), LocalAddress: c.LocalAddr().String()}
	if cs, ok := congestion.StatsOf(c.CongestionController()); ok {
		s.Congestion = &cs
	}
	return s
}

// QUICCollector exports QUIC transport health, read at scrape time.
// Counters are the sum over live connections plus every closed one, so they
// only go up. Safe for concurrent use.
type QUICCollector struct {
	live    func() []ConnStats
	perConn bool

	mu     sync.Mutex
	closed quic.ConnectionStats
	// last holds the counters last exported: a connection leaves the live set
	// just before it is added to closed, and a scrape in between must not see
	// the counters go down.
	last quic.ConnectionStats

	srtt, minRTT, latestRTT, rttVar, cwnd *prometheus.Desc
	pacingRate, bwEstimate, inflightCap   *prometheus.Desc
	ccState                               *prometheus.Desc
	ccStates                              *prometheus.Desc
	rttHist                               *prometheus.Desc
	conns                                 *prometheus.Desc
	pktSent, pktRecv, pktLost             *prometheus.Desc
	bytesSent, bytesRecv, bytesLost       *prometheus.Desc
}

// NewQUICCollector returns a collector for side ("client" or "server") over the
// connections returned by live. perConn adds per-connection RTT and congestion
// window gauges labelled "conn"; use it only where labels are few (the client).
func NewQUICCollector(side string, perConn bool, live func() []ConnStats) *QUICCollector {
	cl := prometheus.Labels{"side": side}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "quic", name), help, labels, cl)
	}
	return &QUICCollector{
		live:        live,
		perConn:     perConn,
		srtt:        d("smoothed_rtt_seconds", "Smoothed RTT of the QUIC connection.", "conn"),
		minRTT:      d("min_rtt_seconds", "Minimum RTT seen on the QUIC connection.", "conn"),
		latestRTT:   d("latest_rtt_seconds", "Latest RTT sample of the QUIC connection.", "conn"),
		rttVar:      d("rtt_variance_seconds", "RTT mean deviation of the QUIC connection.", "conn"),
		cwnd:        d("congestion_window_bytes", "Congestion window of the QUIC connection.", "conn"),
		pacingRate:  d("pacing_rate_bytes_per_second", "Pacing rate of the connection's congestion controller (bbr, cubic).", "conn"),
		bwEstimate:  d("bandwidth_estimate_bytes_per_second", "Bottleneck bandwidth estimated by bbr.", "conn"),
		inflightCap: d("inflight_cap_bytes", "bbr's loss-driven cap on bytes in flight; 0 when there is none.", "conn"),
		ccState:     d("congestion_state", "1 for the congestion controller's current state (bbr: startup, drain, probe_bw, probe_rtt; cubic: slow_start, congestion_avoidance, recovery).", "conn", "algorithm", "state"),
		ccStates:    d("connections_by_congestion_state", "Live QUIC connections by congestion controller and state (reno: quic-go's built-in, state unknown).", "algorithm", "state"),
		rttHist:     d("connection_smoothed_rtt_seconds", "Distribution of the smoothed RTT over live QUIC connections."),
		conns:       d("connections", "Live QUIC connections."),
		pktSent:     d("packets_sent_total", "QUIC packets sent."),
		pktRecv:     d("packets_received_total", "QUIC packets received."),
		pktLost:     d("packets_lost_total", "QUIC packets declared lost (quic-go does not count tail losses repaired by a probe timeout)."),
		bytesSent:   d("sent_bytes_total", "QUIC bytes sent, including headers and retransmissions."),
		bytesRecv:   d("received_bytes_total", "QUIC bytes received."),
		bytesLost:   d("lost_bytes_total", "QUIC bytes declared lost."),
	}
}

// Closed adds the final statistics of a connection that ended.
func (c *QUICCollector) Closed(s quic.ConnectionStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	addStats(&c.closed, s)
}

func addStats(dst *quic.ConnectionStats, s quic.ConnectionStats) {
	dst.PacketsSent += s.PacketsSent
	dst.PacketsReceived += s.PacketsReceived
	dst.PacketsLost += s.PacketsLost
	dst.BytesSent += s.BytesSent
	dst.BytesReceived += s.BytesReceived
	dst.BytesLost += s.BytesLost
}

// Describe implements prometheus.Collector.
func (c *QUICCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.srtt, c.minRTT, c.latestRTT, c.rttVar, c.cwnd, c.rttHist, c.conns,
		c.pacingRate, c.bwEstimate, c.inflightCap, c.ccState, c.ccStates,
		c.pktSent, c.pktRecv, c.pktLost, c.bytesSent, c.bytesRecv, c.bytesLost} {
		ch <- d
	}
}

var rttBuckets = DurationBuckets

// Collect implements prometheus.Collector.
func (c *QUICCollector) Collect(ch chan<- prometheus.Metric) {
	// live is read under c.mu so that a connection cannot be both in it and
	// in closed (Closed waits for the scrape); live must not call Closed.
	c.mu.Lock()
	live := c.live()
	total := c.closed
	for _, l := range live {
		addStats(&total, l.Stats)
	}
	total.PacketsSent = max(total.PacketsSent, c.last.PacketsSent)
	total.PacketsReceived = max(total.PacketsReceived, c.last.PacketsReceived)
	total.PacketsLost = max(total.PacketsLost, c.last.PacketsLost)
	total.BytesSent = max(total.BytesSent, c.last.BytesSent)
	total.BytesReceived = max(total.BytesReceived, c.last.BytesReceived)
	total.BytesLost = max(total.BytesLost, c.last.BytesLost)
	c.last = total
	c.mu.Unlock()
	buckets := make(map[float64]uint64, len(rttBuckets))
	var sum float64
	type ccKey struct{ alg, state string }
	states := map[ccKey]int{}
	for _, l := range live {
		k := ccKey{"reno", "unknown"}
		if cs := l.Congestion; cs != nil {
			k = ccKey{string(cs.Algorithm), cs.State}
			if c.perConn {
				ch <- prometheus.MustNewConstMetric(c.pacingRate, prometheus.GaugeValue, cs.PacingRateBytesPerSecond, l.Label)
				ch <- prometheus.MustNewConstMetric(c.bwEstimate, prometheus.GaugeValue, cs.BandwidthBytesPerSecond, l.Label)
				ch <- prometheus.MustNewConstMetric(c.inflightCap, prometheus.GaugeValue, float64(cs.InflightCap), l.Label)
				ch <- prometheus.MustNewConstMetric(c.ccState, prometheus.GaugeValue, 1, l.Label, k.alg, k.state)
			}
		}
		states[k]++
		s := l.Stats
		srtt := s.SmoothedRTT.Seconds()
		sum += srtt
		for _, b := range rttBuckets {
			if srtt <= b {
				buckets[b]++
			}
		}
		if c.perConn {
			g := func(d *prometheus.Desc, v float64) {
				ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l.Label)
			}
			g(c.srtt, srtt)
			g(c.minRTT, s.MinRTT.Seconds())
			g(c.latestRTT, s.LatestRTT.Seconds())
			g(c.rttVar, s.MeanDeviation.Seconds())
			g(c.cwnd, float64(s.CongestionWindow))
		}
	}
	for k, n := range states {
		ch <- prometheus.MustNewConstMetric(c.ccStates, prometheus.GaugeValue, float64(n), k.alg, k.state)
	}
	ch <- prometheus.MustNewConstHistogram(c.rttHist, uint64(len(live)), sum, buckets)
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(len(live)))
	cnt := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	cnt(c.pktSent, total.PacketsSent)
	cnt(c.pktRecv, total.PacketsReceived)
	cnt(c.pktLost, total.PacketsLost)
	cnt(c.bytesSent, total.BytesSent)
	cnt(c.bytesRecv, total.BytesReceived)
	cnt(c.bytesLost, total.BytesLost)
}

// typeCounters is a collector of one counter vector by "type", read at
// scrape time from the atomic counters of a stats struct.
type typeCounters struct {
	desc *prometheus.Desc
	read func() []typeCount
}

type typeCount struct {
	typ string
	n   uint64
}

func newTypeCounters(side, subsystem, help string, read func() []typeCount) typeCounters {
	return typeCounters{read: read, desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, subsystem, "datagrams_total"),
		help, []string{"type"}, prometheus.Labels{"side": side})}
}

// Describe implements prometheus.Collector.
func (c typeCounters) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c typeCounters) Collect(ch chan<- prometheus.Metric) {
	for _, v := range c.read() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(v.n), v.typ)
	}
}

// LivenessCollector exports the heartbeat and tail-probe datagram counters.
type LivenessCollector struct{ typeCounters }

// NewLivenessCollector returns a collector of stats for side ("client" or "server").
func NewLivenessCollector(side string, stats *liveness.Stats) *LivenessCollector {
	return &LivenessCollector{newTypeCounters(side, "quic",
		"Liveness datagrams by type: heartbeat_sent, echo_received, echo_sent, tail_probe_sent, keepalive_sent (an idle client's, every --keepalive-period), invalid (received and dropped).",
		func() []typeCount {
			return []typeCount{
				{"heartbeat_sent", stats.HeartbeatsSent.Load()},
				{"echo_received", stats.EchoesReceived.Load()},
				{"echo_sent", stats.EchoesSent.Load()},
				{"tail_probe_sent", stats.TailProbesSent.Load()},
				{"keepalive_sent", stats.KeepAlivesSent.Load()},
				{"invalid", stats.Invalid.Load()},
			}
		})}
}

// FECCollector exports forward error correction counters.
type FECCollector struct{ typeCounters }

// NewFECCollector returns a collector of stats for side ("client" or "server").
func NewFECCollector(side string, s *fec.Stats) *FECCollector {
	return &FECCollector{newTypeCounters(side, "fec",
		"Forward error correction datagrams by type: data_sent, parity_sent, data_received, parity_received, recovered (rebuilt from parity), unrecoverable, malformed.",
		func() []typeCount {
			return []typeCount{
				{"data_sent", s.DataSent.Load()}, {"parity_sent", s.ParitySent.Load()},
				{"data_received", s.DataReceived.Load()}, {"parity_received", s.ParityRecv.Load()},
				{"recovered", s.Recovered.Load()}, {"unrecoverable", s.Unrecoverable.Load()}, {"malformed", s.Malformed.Load()},
			}
		})}
}
