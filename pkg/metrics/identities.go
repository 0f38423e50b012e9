package metrics

import "github.com/prometheus/client_golang/prometheus"

// IdentityUsage is one identity label's figures (server: pkg/usage's
// Ledger.Series, the operator's chosen identities and "other").
type IdentityUsage struct {
	Identity                         string
	BytesUpstream, BytesDownstream   int64
	Tunnels, Connections, Refused    int64
	ActiveTunnels, ActiveConnections int64
}

// IdentityCollector exports the usage of each client identity at scrape
// time: quictun_server_identity_*. Its identity label takes the values the
// operator configured and "other", so the series stay bounded; the
// counters continue from the totals kept across restarts.
type IdentityCollector struct {
	read                                             func() []IdentityUsage
	bytes, tunnels, conns, refused, activeT, activeC *prometheus.Desc
}

// NewIdentityCollector returns a collector of the figures read returns.
func NewIdentityCollector(read func() []IdentityUsage) *IdentityCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "server", name), help, append([]string{"identity"}, labels...), nil)
	}
	return &IdentityCollector{
		read:    read,
		bytes:   d("identity_bytes_total", "Bytes carried for each client identity by direction: upstream (toward the destination) and downstream (toward the client); kept across restarts (--state-dir). identity is one named by --metrics-identity, or other.", "direction"),
		tunnels: d("identity_tunnels_total", "Tunnels (TCP and UDP flows) opened by each client identity; kept across restarts."),
		conns:   d("identity_connections_total", "Connections on which each client identity proved itself; kept across restarts."),
		refused: d("identity_refused_destinations_total", "Destinations the rules refused to each client identity; kept across restarts."),
		activeT: d("identity_active_tunnels", "Open tunnels of each client identity."),
		activeC: d("identity_active_connections", "Open connections of each client identity."),
	}
}

// Describe implements prometheus.Collector.
func (c *IdentityCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.bytes, c.tunnels, c.conns, c.refused, c.activeT, c.activeC} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *IdentityCollector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range c.read() {
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(u.BytesUpstream), u.Identity, "upstream")
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(u.BytesDownstream), u.Identity, "downstream")
		ch <- prometheus.MustNewConstMetric(c.tunnels, prometheus.CounterValue, float64(u.Tunnels), u.Identity)
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.CounterValue, float64(u.Connections), u.Identity)
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(u.Refused), u.Identity)
		ch <- prometheus.MustNewConstMetric(c.activeT, prometheus.GaugeValue, float64(u.ActiveTunnels), u.Identity)
		ch <- prometheus.MustNewConstMetric(c.activeC, prometheus.GaugeValue, float64(u.ActiveConnections), u.Identity)
	}
}

// UsageReports counts the batches posted to --usage-report-url (pkg/report
// Events): quictun_server_usage_reports_total{result} and
// quictun_server_usage_report_queued_batches.
type UsageReports struct {
	Total  *prometheus.CounterVec
	Queue  prometheus.Gauge
	labels []string
}

// NewUsageReports registers the usage report metrics on reg, their series
// starting at 0 for each of results.
func NewUsageReports(reg prometheus.Registerer, results []string) *UsageReports {
	m := &UsageReports{
		Total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "server", Name: "usage_reports_total",
			Help: "Usage report batches (--usage-report-url) by result: sent, retried (an attempt failed; tried again), rejected (the endpoint answered 4xx: dropped), dropped (the queue was full: the oldest batch was dropped).",
		}, []string{"result"}),
		Queue: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "server", Name: "usage_report_queued_batches",
			Help: "Usage report batches waiting to be posted.",
		}),
		labels: results,
	}
	for _, r := range results {
		m.Total.WithLabelValues(r)
	}
	reg.MustRegister(m.Total, m.Queue)
	return m
}

// Batch counts a batch by result.
func (m *UsageReports) Batch(result string) { m.Total.WithLabelValues(result).Inc() }

// Queued sets the batches waiting.
func (m *UsageReports) Queued(n int) { m.Queue.Set(float64(n)) }

// NewAuthHookCalls registers quictun_server_auth_hook_calls_total{result}
// (ok, unknown, refused, error) on reg and returns the func pkg/authhook
// reports to.
func NewAuthHookCalls(reg prometheus.Registerer) func(result string) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "server", Name: "auth_hook_calls_total",
		Help: "Calls to --auth-hook by result: ok (it answered a key, or admitted a client certificate), unknown (404 for a key ID: no such key), refused (403 or 404 for a client certificate), error (down, slow, a bad answer: the stream was refused).",
	}, []string{"result"})
	for _, r := range []string{"ok", "unknown", "refused", "error"} {
		c.WithLabelValues(r)
	}
	reg.MustRegister(c)
	return func(result string) { c.WithLabelValues(result).Inc() }
}

// NewAuthHookState registers two gauges read at scrape time from state
// (pkg/authhook's Hook.Len): quictun_server_auth_hook_cache_entries, the
// answers cached (keys, 404s and failures, at most the cache's bound), and
// quictun_server_auth_hook_lookups_in_flight, the calls to the hook running
// (at most --auth-hook-max-in-flight).
func NewAuthHookState(reg prometheus.Registerer, state func() (cached, running int)) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "server", Name: "auth_hook_cache_entries",
			Help: "Answers of --auth-hook cached: keys and admitted certificates (--auth-hook-ttl), unknown key IDs and refused certificates (--auth-hook-negative-ttl) and failed calls (1s); bounded at 100,000, a full cache is cut to nine tenths.",
		}, func() float64 { c, _ := state(); return float64(c) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "server", Name: "auth_hook_lookups_in_flight",
			Help: "Calls to --auth-hook running (at most --auth-hook-max-in-flight; a lookup past it is refused at once).",
		}, func() float64 { _, r := state(); return float64(r) }))
}
