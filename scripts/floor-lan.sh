#!/usr/bin/env bash
# floor-lan.sh: LAN ping-pong (1000 x 1000 B round trips, the bench's latency case) and echo TPS
# (1 KB x 8 connections) and 16 MiB echo requests on the emulated LAN link (tools/linkem, 0.25 ms each way), direct TCP
# against quictun and against tools/floortun, the simplest tunnel on the same quic-go and
# quic.Config (issue 13's floor). N rounds, the three variants alternating in each (root).
#   sudo scripts/floor-lan.sh                 # daemons of bin/ (make build)
#   BIN=/other/bin N=10 CARGS="--tail-probes 0" SARGS="--tail-probes 0" scripts/floor-lan.sh
# CARGS and SARGS are extra quictun-client and quictun-server flags (quictun only).
# Prints each variant's median, quartiles and its ratio to direct.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}; N=${N:-6}; DELAY=${DELAY:-0.25ms}; PREFIX=${PREFIX:-fl}; LINKEM=bin/linkem
# shellcheck source=scripts/lib/emulated-tunnel.sh
. scripts/lib/emulated-tunnel.sh
mkdir -p "$work/floor"
go build -trimpath -o "$work/floor/quictun-server" ./tools/floortun
go build -trimpath -o "$work/floor/quictun-client" ./tools/floortun
emulated_link
echo_tunnel
# The floor runs with the same environment and CPUs as quictun's daemons (bench_env, bench_pin_*).
ip netns exec "$SNS" "${bench_pin_server[@]}" env "${bench_env[@]}" "$work/floor/quictun-server" --listen-on "$SERVER_IP:7600" --allow tcp:127.0.0.1:15676 \
  >"$work/floor-server.log" 2>&1 & pids+=($!)
ip netns exec "$CNS" "${bench_pin_client[@]}" env "${bench_env[@]}" "$work/floor/quictun-client" --server-endpoint "$SERVER_IP:7600" \
  --forward tcp:127.0.0.1:6600=tcp:127.0.0.1:15676 >"$work/floor-client.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do ip netns exec "$CNS" bash -c "exec 3<>/dev/tcp/127.0.0.1/6600" 2>/dev/null && break; sleep 0.1; done
ip netns exec "$CNS" bash -c "exec 3<>/dev/tcp/127.0.0.1/6600" 2>/dev/null || { cat "$work"/floor-*.log; exit 1; }
for p in 6500 6600; do ip netns exec "$CNS" bin/latency-client --server-host 127.0.0.1 --server-port $p --number 10 >/dev/null; done
for i in $(seq "$N"); do
  for v in direct quictun floor; do
    case $v in direct) h=$SERVER_IP p=15676 ;; quictun) h=127.0.0.1 p=6500 ;; floor) h=127.0.0.1 p=6600 ;; esac
    ip netns exec "$CNS" bin/latency-client --server-host $h --server-port $p --number 1000 --size 1000 --json |
      python3 -c "import json,sys; print('$v pingpong_ms', json.load(sys.stdin)['total_ms'])"
    ip netns exec "$CNS" bin/latency-client --server-host $h --server-port $p --number 1000 --size 1KB --connections 8 --json |
      python3 -c "import json,sys; print('$v echo_tps', json.load(sys.stdin)['tps'])"
    ip netns exec "$CNS" bin/latency-client --server-host $h --server-port $p --number 8 --size 16MiB --json |
      python3 -c "import json,sys; print('$v req16MiB_mbit', json.load(sys.stdin)['mbit_per_s'])"
  done
done >"$work/samples.txt"
python3 - "$work/samples.txt" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    v, m, x = line.split()
    d[(m, v)].append(float(x))
for m in ("pingpong_ms", "echo_tps", "req16MiB_mbit"):
    base = statistics.median(d[(m, "direct")])
    for v in ("direct", "quictun", "floor"):
        s = sorted(d[(m, v)])
        med = statistics.median(s)
        print(f"{m:12} {v:8} median {med:9.1f}  p25 {s[len(s)//4]:9.1f}  p75 {s[3*len(s)//4]:9.1f}  n {len(s)}  ratio {med/base:.3f}")
PY
