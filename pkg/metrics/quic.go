package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
)

// Conn is what QUICCollector reads of one live connection.
type Conn struct {
	// Label is the connection's "conn" label when per-connection series are
	// enabled (the client's connection index).
	Label string
	Stats quic.ConnectionStats
	// Congestion is the state of quictun's congestion controller; nil when
	// quic-go's built-in one (reno) is in use.
	Congestion *Congestion
}

// Congestion is the part of a congestion controller's state the collector
// exports (see congestion.Stats).
type Congestion struct {
	// Algorithm (bbr, cubic) and State (bbr: startup, drain, probe_bw,
	// probe_rtt; cubic: slow_start, congestion_avoidance, recovery) are
	// label values.
	Algorithm, State         string
	PacingRateBytesPerSecond float64
	BandwidthBytesPerSecond  float64
	InflightCap              int
}

// QUICCollector exports QUIC transport health, read at scrape time.
// Counters are the sum over live connections plus every closed one, so they
// only go up. Safe for concurrent use.
type QUICCollector struct {
	live    func() []Conn
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
	tailCopies                            *prometheus.Desc
}

// NewQUICCollector returns a collector for side ("client" or "server") over the
// connections returned by live. perConn adds per-connection RTT and congestion
// window gauges labelled "conn"; use it only where labels are few (the client).
func NewQUICCollector(side string, perConn bool, live func() []Conn) *QUICCollector {
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
		tailCopies:  d("tail_copies_sent_total", "Copies of a tail packet (the last before the sender ran out of data) sent because bbr measured loss on the path: see docs/how-it-works.md."),
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
	dst.TailCopiesSent += s.TailCopiesSent
}

// Describe implements prometheus.Collector.
func (c *QUICCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.srtt, c.minRTT, c.latestRTT, c.rttVar, c.cwnd, c.rttHist, c.conns,
		c.pacingRate, c.bwEstimate, c.inflightCap, c.ccState, c.ccStates,
		c.pktSent, c.pktRecv, c.pktLost, c.bytesSent, c.bytesRecv, c.bytesLost, c.tailCopies} {
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
	total.TailCopiesSent = max(total.TailCopiesSent, c.last.TailCopiesSent)
	c.last = total
	c.mu.Unlock()
	buckets := make(map[float64]uint64, len(rttBuckets))
	var sum float64
	type ccKey struct{ alg, state string }
	states := map[ccKey]int{}
	for _, l := range live {
		k := ccKey{"reno", "unknown"}
		if cs := l.Congestion; cs != nil {
			k = ccKey{cs.Algorithm, cs.State}
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
	cnt(c.tailCopies, total.TailCopiesSent)
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

// LivenessCounts are the liveness datagram counters (liveness.Stats).
type LivenessCounts struct {
	HeartbeatsSent, EchoesReceived, EchoesSent, TailProbesSent, KeepAlivesSent, Invalid uint64
}

// LivenessCollector exports the heartbeat and tail-probe datagram counters.
type LivenessCollector struct{ typeCounters }

// NewLivenessCollector returns a collector for side ("client" or "server")
// of the counters read returns at scrape time.
func NewLivenessCollector(side string, read func() LivenessCounts) *LivenessCollector {
	return &LivenessCollector{newTypeCounters(side, "quic",
		"Liveness datagrams by type: heartbeat_sent, echo_received, echo_sent, tail_probe_sent, keepalive_sent (an idle client's, every --keepalive-period), invalid (received and dropped).",
		func() []typeCount {
			c := read()
			return []typeCount{
				{"heartbeat_sent", c.HeartbeatsSent},
				{"echo_received", c.EchoesReceived},
				{"echo_sent", c.EchoesSent},
				{"tail_probe_sent", c.TailProbesSent},
				{"keepalive_sent", c.KeepAlivesSent},
				{"invalid", c.Invalid},
			}
		})}
}

// FECCounts are the forward error correction counters (fec.Stats).
type FECCounts struct {
	DataSent, ParitySent, DataReceived, ParityReceived, Recovered, Unrecoverable, Malformed uint64
}

// FECCollector exports forward error correction counters.
type FECCollector struct{ typeCounters }

// NewFECCollector returns a collector for side ("client" or "server") of the
// counters read returns at scrape time.
func NewFECCollector(side string, read func() FECCounts) *FECCollector {
	return &FECCollector{newTypeCounters(side, "fec",
		"Forward error correction datagrams by type: data_sent, parity_sent, data_received, parity_received, recovered (rebuilt from parity), unrecoverable, malformed.",
		func() []typeCount {
			c := read()
			return []typeCount{
				{"data_sent", c.DataSent}, {"parity_sent", c.ParitySent},
				{"data_received", c.DataReceived}, {"parity_received", c.ParityReceived},
				{"recovered", c.Recovered}, {"unrecoverable", c.Unrecoverable}, {"malformed", c.Malformed},
			}
		})}
}
