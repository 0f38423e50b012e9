package metrics

import "github.com/prometheus/client_golang/prometheus"

// NewLinkRest registers quictun_server_link_rest_bytes_per_second{direction}:
// the rate the identities without a cap of their own share under
// --link-rate, read by rest (down: what the server sends, up: what it
// reads; 0 without --link-rate).
func NewLinkRest(reg prometheus.Registerer, rest func() (down, up float64)) {
	for _, d := range []struct {
		dir string
		get func() float64
	}{
		{"down", func() float64 { v, _ := rest(); return v }},
		{"up", func() float64 { _, v := rest(); return v }},
	} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: "server", Name: "link_rest_bytes_per_second",
			Help:        "Under --link-rate: the rate the identities without a cap of their own share, the link's less what the capped identities use (at least 5 % of it), by direction (down: sent by the server, up: read by it); 0 without --link-rate.",
			ConstLabels: prometheus.Labels{"direction": d.dir}}, d.get))
	}
}
