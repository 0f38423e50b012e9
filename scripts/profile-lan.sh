#!/usr/bin/env bash
# profile-lan.sh: CPU profiles (and execution traces) of quictun-client and
# quictun-server on the emulated LAN link (tools/linkem, 0.25 ms each way),
# during a ping-pong of 1000 B messages and during a bulk upload, written
# with their flame graphs to OUT (default bench/runs/profile-<date>).
#
#   sudo scripts/profile-lan.sh                     # binaries of bin/ (make build)
#   BIN=/other/bin OUT=/tmp/p SECONDS_PER=10 scripts/profile-lan.sh
#
# Needs root (network namespaces, TUN), curl, and for the SVG flame graphs
# npx (Node.js) to run the flamegraph npm package; without it the .cpuprofile
# files are written and the SVG step is skipped. Go's tool reads the .pprof
# files: go tool pprof -top BIN/quictun-server OUT/pingpong-server.pprof
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
OUT=${OUT:-bench/runs/profile-$(date -u +%Y-%m-%dT%H%MZ)}
SECS=${SECONDS_PER:-10}
DELAY=${DELAY:-0.25ms}
PREFIX=${PREFIX:-qp}
LINKEM=$BIN/linkem
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# shellcheck source=scripts/lib/emulated-tunnel.sh
. scripts/lib/emulated-tunnel.sh

emulated_link
ip netns exec "$SNS" "$BIN/latency-client" serve --listen 127.0.0.1:15676 --sink-listen 127.0.0.1:15677 >"$work/echo.log" 2>&1 &
pids+=($!)
server_args=(--allow tcp:127.0.0.1:15676,tcp:127.0.0.1:15677 --httpd-listen-on 127.0.0.1:8086 --enable-pprof)
client_args=(--forward tcp:127.0.0.1:6500=tcp:127.0.0.1:15676 --forward tcp:127.0.0.1:6501=tcp:127.0.0.1:15677 --enable-pprof)
emulated_tunnel

# capture NAME: profile both daemons for SECS seconds while the workload runs.
capture() {
  local name=$1
  ip netns exec "$SNS" curl -fsS -o "$OUT/$name-server.pprof" "http://127.0.0.1:8086/debug/pprof/profile?seconds=$SECS" &
  local a=$!
  ip netns exec "$CNS" curl -fsS -o "$OUT/$name-client.pprof" "http://127.0.0.1:8087/debug/pprof/profile?seconds=$SECS" &
  local b=$!
  ip netns exec "$SNS" curl -fsS -o "$OUT/$name-server.trace" "http://127.0.0.1:8086/debug/pprof/trace?seconds=1" &
  local c=$!
  ip netns exec "$CNS" curl -fsS -o "$OUT/$name-client.trace" "http://127.0.0.1:8087/debug/pprof/trace?seconds=1" &
  local d=$!
  wait $a $b $c $d
}

echo "ping-pong of 1000 B through the tunnel on a $DELAY link, profiled for ${SECS}s"
ip netns exec "$CNS" "$BIN/latency-client" --server-port 6500 --number 1000000 --timeout $((SECS + 3))s \
  >"$OUT/pingpong-latency-client.txt" 2>&1 &
lc=$!
sleep 1
capture pingpong
wait $lc || true   # stopped by its --timeout
echo "bulk upload through the tunnel, profiled for ${SECS}s"
ip netns exec "$CNS" "$BIN/latency-client" bulk --server-port 6501 --duration $((SECS + 2))s >"$OUT/bulk-latency-client.txt" 2>&1 &
lc=$!
sleep 1
capture bulk
wait $lc

for f in "$OUT"/*.pprof; do
  go run ./tools/bench flame "$f" "${f%.pprof}.cpuprofile"
  if command -v npx >/dev/null; then
    npx --yes flamegraph@1.3.0 -t cpuprofile -f "${f%.pprof}.cpuprofile" \
      --titletext "$(basename "${f%.pprof}") ($DELAY link)" >"${f%.pprof}.svg" || rm -f "${f%.pprof}.svg"
  fi
done
cp "$work/server.log" "$work/client.log" "$OUT/" 2>/dev/null || true
echo "Profiles, traces and flame graphs: $OUT"
