// Package metrics defines quictun's Prometheus metrics. Every set is built by a
// constructor that takes the prometheus.Registerer to register on: there are no
// package-level metrics. QUIC transport health is read at scrape time from
// quic.Conn.ConnectionStats by QUICCollector, not by a per-packet tracer.
//
// The package is a leaf: it imports no other quictun package. The domain
// packages declare the events they report as small interfaces, named by what
// happened (egress.Events, ingress.Events, udpflow.Events, tunnel.Metrics),
// and hooks (udpflow.NewTable's drop, ...) that the types here implement
// (events.go: Server, Client, UDP); label values they define (protocol
// codes, refusal, authentication and drop reasons) reach it as Labels, filled in by the composition
// (server.NewMetrics, client.NewMetrics), and their counters through plain
// structs (Conn, LivenessCounts, FECCounts) read at scrape time.
package metrics
