#!/usr/bin/env bash
# first-packet.sh: first-packet latency through a warm tunnel against direct TCP on the emulated
# WAN link (tools/linkem, 12.5 ms each way), N alternating samples of each (root).
#   sudo scripts/first-packet.sh                      # daemons of bin/ (make build)
#   BIN=/other/bin N=50 CARGS="--tail-probes 0" scripts/first-packet.sh
# Each sample is a new application connection (latency-client --number 3); CARGS and SARGS are
# extra quictun-client and quictun-server flags. Prints medians and quartiles.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}; N=${N:-30}; DELAY=${DELAY:-12.5ms}; PREFIX=${PREFIX:-fp}
CNS=$PREFIX-c SNS=$PREFIX-s SERVER_IP=198.18.0.2
work=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
bin/linkem up --prefix "$PREFIX" --delay "$DELAY" >"$work/linkem.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do ip netns exec "$CNS" true 2>/dev/null && ip netns exec "$SNS" true 2>/dev/null && break; sleep 0.1; done
sleep 1
ip netns exec "$SNS" bin/latency-client serve --listen 0.0.0.0:15676 >"$work/echo.log" 2>&1 & pids+=($!)
mkdir -m 700 "$work/state"; (umask 077; head -c 32 /dev/urandom | base64 >"$work/secret")
fp=$("$BIN/quictun-server" fingerprint --state-dir "$work/state")
ip netns exec "$SNS" "$BIN/quictun-server" --listen-on $SERVER_IP:7500 --state-dir "$work/state" --secret-file "$work/secret" \
  --allow tcp:127.0.0.1:15676 --audit-log=false ${SARGS:-} >"$work/server.log" 2>&1 & pids+=($!)
ip netns exec "$CNS" "$BIN/quictun-client" --server-endpoint $SERVER_IP:7500 --server-fingerprint "$fp" --secret-file "$work/secret" \
  --forward tcp:127.0.0.1:6500=tcp:127.0.0.1:15676 --httpd-listen-on 127.0.0.1:8087 ${CARGS:-} >"$work/client.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do ip netns exec "$CNS" curl -fsS http://127.0.0.1:8087/readyz >/dev/null 2>&1 && break; sleep 0.1; done
ip netns exec "$CNS" bin/latency-client --server-host 127.0.0.1 --server-port 6500 --number 3 >/dev/null 2>&1 || true
for i in $(seq $N); do
  for v in direct tunnel; do
    if [ $v = direct ]; then h=$SERVER_IP p=15676; else h=127.0.0.1 p=6500; fi
    ip netns exec "$CNS" bin/latency-client --server-host $h --server-port $p --number 3 --size 1000 2>&1 | awk -v v=$v '/First packet latency/{print v, $4}'
    sleep 0.2
  done
done | awk '{a[$1]=a[$1]" "$2} END{for(k in a) print k, a[k]}' > "$work/fp.txt"
python3 - "$work/fp.txt" <<'PY'
import sys,statistics
d={}
for l in open(sys.argv[1]):
    p=l.split(); d[p[0]]=[float(x) for x in p[1:]]
for k,v in d.items(): print(k, "median %.3f p25 %.3f p75 %.3f n %d"%(statistics.median(v),sorted(v)[len(v)//4],sorted(v)[3*len(v)//4],len(v)))
print("ratio", statistics.median(d['tunnel'])/statistics.median(d['direct']))
PY
