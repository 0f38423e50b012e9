package metrics

import "github.com/prometheus/client_golang/prometheus"

// Results of an upgrade (quictun_{server,client}_upgrades_total) and of its
// tunnels (quictun_{server,client}_upgrade_tunnels_total).
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

// Upgrade counts a daemon's upgrades (SIGUSR2): its series start at 0.
type Upgrade struct {
	Upgrades *prometheus.CounterVec
	Tunnels  *prometheus.CounterVec
}

// NewUpgrade registers quictun_<side>_upgrades_total{result} and
// quictun_<side>_upgrade_tunnels_total{result} (side: "server" or
// "client").
func NewUpgrade(reg prometheus.Registerer, side string) *Upgrade {
	waiting := "parked for their clients to re-attach"
	if side == "client" {
		waiting = "re-attached to the server by this process"
	}
	m := &Upgrade{
		Upgrades: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: side, Name: "upgrades_total",
			Help: "Upgrades (SIGUSR2) by result: success (counted by the new process once it took the sockets and tunnels over), failed (counted by the old process, which keeps serving: the new binary did not start or report ready in time)."},
			[]string{"result"}),
		Tunnels: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: side, Name: "upgrade_tunnels_total",
			Help: "Resumable tunnels the previous process handed over in an upgrade, by result: imported (" + waiting + "), refused (over this process's bounds; reset)."},
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
