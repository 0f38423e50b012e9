#!/usr/bin/env bash
# UDP through quictun vs direct over the emulated link (issue 12): iperf3 -u
# at RATE with LEN-byte payloads over a 12.5 ms one-way link at each loss
# rate, direct and through a udp: forward (iperf3's control connection goes
# through a tcp: forward on the same port). Prints the receiver's loss and
# jitter and the daemons' CPU time for each run. Needs root, iperf3 and
# `make build`. Everything runs in two namespaces it creates (prefix qu) and
# removes, bounded by iperf3's -t.
#
#   scripts/udp-bench.sh [RATE=50M] [LEN=1200] [DURATION=10] [LOSSES="0 1 5"]
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-50M} LEN=${LEN:-1200} DURATION=${DURATION:-10} LOSSES=${LOSSES:-"0 1 5"}
P=qu
CNS=$P-c SNS=$P-s SERVER_IP=198.18.0.2
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  bin/linkem down --prefix $P >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
command -v iperf3 >/dev/null || { echo "iperf3 is not installed (apt-get install iperf3)" >&2; exit 1; }
bin/linkem down --prefix $P >/dev/null 2>&1 || true
bin/linkem up --prefix $P --delay 12.5ms --rate 100mbit >"$work/linkem.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do ip netns list | grep -q "^$SNS" && [ -S /run/linkem-$P.sock ] && break; sleep 0.1; done

ip netns exec $SNS iperf3 -s -B 127.0.0.1 -p 5201 >"$work/iperf3-lo.log" 2>&1 &
pids+=($!)
ip netns exec $SNS iperf3 -s -B $SERVER_IP -p 5201 >"$work/iperf3.log" 2>&1 &
pids+=($!)
head -c 32 /dev/urandom | base64 >"$work/secret"
chmod 600 "$work/secret"
fp=$(bin/quictun-server fingerprint --state-dir "$work/state")
ip netns exec $SNS bin/quictun-server --listen-on $SERVER_IP:7500 --state-dir "$work/state" \
  --secret-file "$work/secret" --allow tcp:127.0.0.1:5201,udp:127.0.0.1:5201 \
  --httpd-listen-on 127.0.0.1:8086 >"$work/server.log" 2>&1 &
spid=$!
pids+=($spid)
ip netns exec $CNS bin/quictun-client --server-endpoint $SERVER_IP:7500 --server-fingerprint "$fp" \
  --secret-file "$work/secret" --httpd-listen-on 127.0.0.1:8087 \
  --forward tcp:127.0.0.1:5202=tcp:127.0.0.1:5201 --forward udp:127.0.0.1:5202=udp:127.0.0.1:5201 \
  >"$work/client.log" 2>&1 &
cpid=$!
pids+=($cpid)
for _ in $(seq 100); do
  ip netns exec $CNS curl -fsS http://127.0.0.1:8087/readyz >/dev/null 2>&1 && break
  sleep 0.1
done

cpu() { awk '{print ($14+$15)/100}' "/proc/$1/stat"; }
c2s() { bin/linkem ctl --prefix $P stats | python3 -c 'import json,sys; d=json.load(sys.stdin)["c2s"]; print(d["rx_packets"], d["rx_bytes"])'; }
run() { # name host port
  local c0 s0 out l0 l1
  c0=$(cpu $cpid) s0=$(cpu $spid) l0=$(c2s)
  out=$(ip netns exec $CNS iperf3 -u -c "$2" -p "$3" -b "$RATE" -l "$LEN" -t "$DURATION" --json)
  echo "$out" | python3 -c '
import json, sys
d = json.load(sys.stdin)
e = d.get("end", {}).get("sum", {})
if "error" in d: print("  %-7s error: %s" % (sys.argv[1], d["error"])); sys.exit()
print("  %-7s sent %6d pkts, lost %5d (%.2f %%), jitter %.3f ms, %.1f Mbit/s received" % (
  sys.argv[1], e.get("packets", 0), e.get("lost_packets", 0), e.get("lost_percent", 0), e.get("jitter_ms", 0),
  d["end"].get("sum_received", e).get("bits_per_second", e.get("bits_per_second", 0)) / 1e6))' "$1"
  l1=$(c2s)
  echo "          quictun CPU during the run: client $(awk "BEGIN{print $(cpu $cpid)-$c0}") s, server $(awk "BEGIN{print $(cpu $spid)-$s0}") s;" \
    "link client->server: $(echo "$l0 $l1" | awk '{printf "%d packets, %.1f bytes each", $3-$1, ($4-$2)/($3-$1)}')"
}
echo "iperf3 -u -b $RATE -l $LEN -t $DURATION over 12.5 ms one-way, 100 Mbit/s (linkem)"
for loss in $LOSSES; do
  bin/linkem ctl --prefix $P set --loss "$loss%" >/dev/null
  echo "loss $loss %:"
  run direct $SERVER_IP 5201
  run quictun 127.0.0.1 5202
done
ip netns exec $CNS curl -fsS http://127.0.0.1:8087/metrics | grep -E '^quictun_client_udp_(packets|drops)_total' | grep -v ' 0$' || true
ip netns exec $SNS curl -fsS http://127.0.0.1:8086/metrics | grep -E '^quictun_server_udp_(packets|drops)_total' | grep -v ' 0$' || true
