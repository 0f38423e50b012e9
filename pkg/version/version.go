// Package version holds the build's version, set with -ldflags -X, and the
// quictun_build_info metric.
package version

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// Version and Revision are set at build time:
// -ldflags "-X github.com/quictun/quictun/pkg/version.Version=v0.1.0 -X github.com/quictun/quictun/pkg/version.Revision=abc123".
var (
	Version  = "dev"
	Revision = "unknown"
)

// String is the human-readable version line.
func String() string {
	return Version + " (revision " + Revision + ", " + runtime.Version() + ")"
}

// NewCollector returns the quictun_build_info gauge, always 1.
func NewCollector() prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "quictun", Name: "build_info",
		Help: "A metric with a constant '1' value labelled by version, revision and goversion.",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(Version, Revision, runtime.Version()).Set(1)
	return g
}
