package metrics

import "github.com/prometheus/client_golang/prometheus"

// RemoteListens are the server's metrics of the listeners it opens for
// clients' reverse forwards (--allow-remote-listen): how many are open, and
// the requests it refused, by reason.
type RemoteListens struct {
	// Active is the number of reverse forward listeners open.
	Active prometheus.Gauge
	// RefusedTotal counts refused reverse forward requests by reason.
	RefusedTotal *prometheus.CounterVec
}

// NewRemoteListens creates and registers the metrics of reverse forward
// listeners on reg (nil: unregistered), a series at 0 for each of reasons.
func NewRemoteListens(reg prometheus.Registerer, reasons []string) *RemoteListens {
	m := &RemoteListens{
		Active: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "server", Name: "remote_listeners",
			Help: "Listeners open for clients' reverse forwards (at most --max-remote-listeners).",
		}),
		RefusedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "server", Name: "refused_remote_listens_total",
			Help: "Reverse forward requests refused, by reason: not_allowed (no --allow-remote-listen rule admits the address), " +
				"reserved_port (a port the server itself listens on), addr_in_use (another client's binding or another program holds it), " +
				"server_limit (--max-remote-listeners), conn_limit (--max-remote-listeners-per-conn), " +
				"identity_limit (--max-remote-listeners-per-identity), needs_quic (the client came over TCP), " +
				"bad_address (the listen address does not parse), listen_failed (the server could not listen there).",
		}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.Active, m.RefusedTotal)
	}
	for _, r := range reasons {
		m.RefusedTotal.WithLabelValues(r)
	}
	return m
}
