// Package metrics defines quictun's Prometheus metrics. Every set is built by a
// constructor that takes the prometheus.Registerer to register on: there are no
// package-level metrics. QUIC transport health is read at scrape time from
// quic.Conn.ConnectionStats by QUICCollector, not by a per-packet tracer.
package metrics
