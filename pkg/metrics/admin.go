package metrics

import "github.com/prometheus/client_golang/prometheus"

// NewAdminRefused registers quictun_<daemon>_admin_requests_refused_total{reason}
// on reg, its series at 0 for reasons (admin.RefusedReasons), and returns
// the admin.Options.Refused hook that counts a refusal.
func NewAdminRefused(reg prometheus.Registerer, daemon string, reasons []string) func(reason string) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: daemon, Name: "admin_requests_refused_total",
		Help: "Admin API requests refused without the bearer token by the Host and Origin rule, by reason (host, origin).",
	}, []string{"reason"})
	for _, r := range reasons {
		c.WithLabelValues(r)
	}
	reg.MustRegister(c)
	return func(reason string) { c.WithLabelValues(reason).Inc() }
}
