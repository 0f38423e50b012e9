package metrics

import "github.com/prometheus/client_golang/prometheus"

// ServerStats is the state of one server a client connects to, labelled by
// its endpoint (bounded: the configured endpoints, or the addresses a name
// resolved to at start).
type ServerStats struct {
	Label string
	// Healthy: a QUIC connection to it has completed its handshake, has
	// not ended, answers heartbeats, and the server does not refuse our
	// credentials. A TCP fallback connection does not count.
	Healthy bool
	// Active: failover mode puts new tunnels on it.
	Active bool
	// Connections are its established QUIC connections (handshake done,
	// not ended; stalled ones included); Streams the tunnels and UDP flows
	// on them. TCP fallback connections, and what they carry, do not count.
	Connections int
	Streams     int64
}

// ServerCollector exports each server's state, read at scrape time.
type ServerCollector struct {
	live                                   func() []ServerStats
	switches                               func() uint64
	healthy, active, conns, streams, moved *prometheus.Desc
}

// NewServerCollector returns a collector of live's servers and of the moves
// of failover's active server (switches).
func NewServerCollector(live func() []ServerStats, switches func() uint64) *ServerCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("quictun", "client", name), help, labels, nil)
	}
	return &ServerCollector{
		live: live, switches: switches,
		healthy: d("server_healthy", "1 while a QUIC connection to the server is up (handshake done), answers heartbeats, and the server does not refuse our credentials; TCP fallback connections do not count.", "server"),
		active:  d("server_active", "1 for the server failover mode puts new tunnels on.", "server"),
		conns:   d("server_connections", "QUIC connections to the server whose handshake completed and that have not ended (stalled ones included); TCP fallback connections do not count.", "server"),
		streams: d("server_active_streams", "Tunnels and UDP flows on the server's QUIC connections (not those over a TCP fallback connection).", "server"),
		moved:   d("server_switches_total", "Moves of failover mode's active server (failovers and failbacks)."),
	}
}

// Describe implements prometheus.Collector.
func (c *ServerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.healthy, c.active, c.conns, c.streams, c.moved} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *ServerCollector) Collect(ch chan<- prometheus.Metric) {
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for _, s := range c.live() {
		ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, b(s.Healthy), s.Label)
		ch <- prometheus.MustNewConstMetric(c.active, prometheus.GaugeValue, b(s.Active), s.Label)
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.Connections), s.Label)
		ch <- prometheus.MustNewConstMetric(c.streams, prometheus.GaugeValue, float64(s.Streams), s.Label)
	}
	ch <- prometheus.MustNewConstMetric(c.moved, prometheus.CounterValue, float64(c.switches()))
}
