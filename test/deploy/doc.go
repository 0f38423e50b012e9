// Package deploy tests the deployment artefacts under deploy/: the systemd units,
// the sysctl drop-in, the example configs, the Docker image and compose file, the
// Helm chart, the Grafana dashboard and the Prometheus alerts.
//
// Everything runs offline and fast. A check that needs a tool (systemd-analyze,
// helm, hadolint) skips with the reason when the tool is missing; deploy/helm/check.sh
// installs helm and runs this package with it, plus the strict manifest validator.
package deploy
