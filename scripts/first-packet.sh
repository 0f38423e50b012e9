#!/usr/bin/env bash
# first-packet.sh: first-packet latency through a warm tunnel against direct TCP on the emulated
# WAN link (tools/linkem, 12.5 ms each way), N alternating samples of each (root).
#   sudo scripts/first-packet.sh                      # daemons of bin/ (make build)
#   BIN=/other/bin N=50 CARGS="--tail-probes 0" scripts/first-packet.sh
# Each sample is a new application connection (latency-client --number 3); CARGS and SARGS are
# extra quictun-client and quictun-server flags. Prints medians and quartiles.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}; N=${N:-30}; DELAY=${DELAY:-12.5ms}; PREFIX=${PREFIX:-fp}; LINKEM=bin/linkem
# shellcheck source=scripts/lib/emulated-tunnel.sh
. scripts/lib/emulated-tunnel.sh
emulated_link
echo_tunnel
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
