package metrics

import "github.com/prometheus/client_golang/prometheus"

// Reasons the admin API refused a request without the bearer token (label
// values of admin_requests_refused_total).
const (
	// AdminRefusedHost: the Host header is not a loopback name or address nor
	// the admin listener's address (DNS rebinding, or a wrong name).
	AdminRefusedHost = "host"
	// AdminRefusedOrigin: a web page's request, by its Origin header (any
	// Origin on a method that changes state, another host's on a read).
	AdminRefusedOrigin = "origin"
)

// NewAdminRefused registers quictun_<daemon>_admin_requests_refused_total{reason}
// on reg, for admin.Options.Refused; its series start at 0.
func NewAdminRefused(reg prometheus.Registerer, daemon string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: daemon, Name: "admin_requests_refused_total",
		Help: "Admin API requests refused without the bearer token by the Host and Origin rule, by reason (host, origin).",
	}, []string{"reason"})
	for _, r := range []string{AdminRefusedHost, AdminRefusedOrigin} {
		c.WithLabelValues(r)
	}
	reg.MustRegister(c)
	return c
}
