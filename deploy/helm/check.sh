#!/usr/bin/env bash
# Checks the deployment artefacts offline, as CI does:
#   1. installs helm (pinned, with go install) unless it is on PATH,
#   2. helm lint --strict with the default values and every ci/*-values.yaml,
#   3. helm template with each of them, and checks that invalid values are refused,
#   4. validates the rendered manifests strictly against the Kubernetes API types
#      (deploy/validate: unknown fields, names, labels, selectors, named ports,
#      volumes, the security policy), the alert rules as promtool does, every
#      PromQL expression of the Grafana dashboard, and the compose file as
#      "docker compose config" loads it (compose-go),
#   5. runs go test ./test/deploy with helm on PATH, so the chart tests run too.
# Usage: deploy/helm/check.sh [OUTDIR]   (rendered manifests are kept in OUTDIR if given)
# Needs Go and the Go module proxy (first run: about 4 minutes to build helm).
set -euo pipefail

HELM_VERSION=v3.22.0   # helm.sh/helm/v3; bump deliberately, never @latest
root=$(cd "$(dirname "$0")/../.." && pwd)
chart=$root/deploy/helm/quictun
export PATH=/usr/local/go/bin:$PATH
gobin=$(go env GOBIN)
[ -n "$gobin" ] || gobin=$(go env GOPATH)/bin
export PATH=$gobin:$PATH

log() { printf '== %s\n' "$*"; }

if ! command -v helm >/dev/null; then
  log "installing helm $HELM_VERSION with go install (into $gobin)"
  GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
log "helm $(helm version --short 2>/dev/null || helm version)"

out=${1:-}
if [ -z "$out" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"

values=("")
for f in "$chart"/ci/*-values.yaml; do values+=("$f"); done

for v in "${values[@]}"; do
  name=default
  args=()
  if [ -n "$v" ]; then
    name=$(basename "$v" -values.yaml)
    args=(-f "$v")
  fi
  log "helm lint --strict ($name)"
  helm lint --strict "$chart" "${args[@]}"
  log "helm template ($name)"
  helm template quictun "$chart" --namespace quictun "${args[@]}" > "$out/$name.yaml"
done

log "invalid values are refused"
if helm template quictun "$chart" --set clientExample.enabled=true >/dev/null 2>&1; then
  echo "helm template accepted the client example without a destination" >&2
  exit 1
fi

log "building deploy/validate"
(cd "$root/deploy/validate" && GOWORK=off go build -o "$out/validate" .)

log "validating rendered manifests"
for v in "${values[@]}"; do
  name=default
  [ -n "$v" ] && name=$(basename "$v" -values.yaml)
  # Secrets named in existingSecret values are created out of band.
  external=$(grep -hoE 'existingSecret: *[A-Za-z0-9.-]+' ${v:+"$v"} /dev/null | awk '{print $2}' | paste -sd, - || true)
  "$out/validate" k8s -external "$external" "$out/$name.yaml"
done

log "validating Prometheus rules and the Grafana dashboard"
"$out/validate" rules "$root/deploy/prometheus/alerts.yml"
"$out/validate" dashboard "$root/deploy/grafana/quictun-dashboard.json"

log "validating the compose file (with stand-in secrets, as init.sh would create)"
cp -r "$root/deploy/docker" "$out/compose"
for f in secret admin-token; do printf '0123456789abcdef0123456789\n' > "$out/compose/secrets/$f"; done
(cd "$out/compose" && "$out/validate" compose docker-compose.yml)

log "go test ./test/deploy (with helm)"
(cd "$root" && go test -count=1 ./test/deploy/)

log "deploy checks passed"
