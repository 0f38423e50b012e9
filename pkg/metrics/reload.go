package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reload results (label values of config_reloads_total).
const (
	ReloadSuccess = "success"
	ReloadFailure = "failure"
)

// Reload counts configuration reloads (SIGHUP), in blackbox_exporter's shape.
type Reload struct {
	Total                *prometheus.CounterVec
	LastSuccessful       prometheus.Gauge
	LastSuccessTimestamp prometheus.Gauge
}

// NewReload registers the reload metrics of daemon ("server" or "client")
// on reg; the configuration loaded at start counts as a successful load now.
func NewReload(reg prometheus.Registerer, daemon string) *Reload {
	m := &Reload{
		Total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: daemon, Name: "config_reloads_total",
			Help: "Configuration reloads (SIGHUP), by result (success, failure: the previous configuration kept running).",
		}, []string{"result"}),
		LastSuccessful: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: daemon, Name: "config_last_reload_successful",
			Help: "1 if the last configuration reload succeeded (or none was tried), 0 if it failed.",
		}),
		LastSuccessTimestamp: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: daemon, Name: "config_last_reload_success_timestamp_seconds",
			Help: "When the configuration was last loaded successfully (at start or by a reload), in seconds since the epoch.",
		}),
	}
	for _, r := range []string{ReloadSuccess, ReloadFailure} {
		m.Total.WithLabelValues(r)
	}
	reg.MustRegister(m.Total, m.LastSuccessful, m.LastSuccessTimestamp)
	m.LastSuccessful.Set(1)
	m.LastSuccessTimestamp.Set(float64(time.Now().UnixNano()) / 1e9)
	return m
}

// Succeeded records a successful reload at t.
func (m *Reload) Succeeded(t time.Time) {
	m.Total.WithLabelValues(ReloadSuccess).Inc()
	m.LastSuccessful.Set(1)
	m.LastSuccessTimestamp.Set(float64(t.UnixNano()) / 1e9)
}

// Failed records a failed reload.
func (m *Reload) Failed() {
	m.Total.WithLabelValues(ReloadFailure).Inc()
	m.LastSuccessful.Set(0)
}
