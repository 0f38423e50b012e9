package metrics

import "github.com/prometheus/client_golang/prometheus"

// Results of an upgrade (quictun_server_upgrades_total) and of its tunnels
// (quictun_server_upgrade_tunnels_total).
const (
	// UpgradeSucceeded is counted by the new process once it took over.
	UpgradeSucceeded = "success"
	// UpgradeFailed is counted by the old process, which keeps serving:
	// the new binary did not start or did not report ready in time.
	UpgradeFailed = "failed"
	// UpgradeImported and UpgradeRefused count the tunnels the new process
	// continued, and those it could not (over its bounds).
	UpgradeImported = "imported"
	UpgradeRefused  = "refused"
)

// Upgrade counts the server's upgrades (SIGUSR2): its series start at 0.
type Upgrade struct {
	Upgrades *prometheus.CounterVec
	Tunnels  *prometheus.CounterVec
}

// NewUpgrade registers quictun_server_upgrades_total{result} and
// quictun_server_upgrade_tunnels_total{result}.
func NewUpgrade(reg prometheus.Registerer) *Upgrade {
	m := &Upgrade{
		Upgrades: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "server", Name: "upgrades_total",
			Help: "Upgrades (SIGUSR2) by result: success (counted by the new process once it took the sockets and tunnels over), failed (counted by the old process, which keeps serving: the new binary did not start or report ready in time)."},
			[]string{"result"}),
		Tunnels: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "server", Name: "upgrade_tunnels_total",
			Help: "Resumable tunnels the previous process handed over in an upgrade, by result: imported (parked for their clients to re-attach), refused (over this process's bounds; reset)."},
			[]string{"result"}),
	}
	for _, r := range []string{UpgradeSucceeded, UpgradeFailed} {
		m.Upgrades.WithLabelValues(r)
	}
	for _, r := range []string{UpgradeImported, UpgradeRefused} {
		m.Tunnels.WithLabelValues(r)
	}
	reg.MustRegister(m.Upgrades, m.Tunnels)
	return m
}
