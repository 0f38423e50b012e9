#!/usr/bin/env bash
# demo-lossy.sh (root): the demo's transfer, 1000-byte round trips, on an emulated LAN link that
# loses LOSS of the packets each way (tools/linkem: two network namespaces joined by a userspace
# link, because this kernel may have no netem), first direct TCP, then through quictun. make demo
# runs it first when it runs as root: this is the case the tunnel exists for.
#   sudo scripts/demo-lossy.sh                   # daemons of bin/ (make build)
#   sudo LOSS=1% NUMBER=1000 scripts/demo-lossy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}; DELAY=${DELAY:-0.25ms}; LOSS=${LOSS:-2%}; PREFIX=${PREFIX:-qdemo}; LINKEM=$BIN/linkem
NUMBER=${NUMBER:-500}; SIZE=${SIZE:-1000}
# The emulator ends by itself after 5 minutes, should this script be killed before its cleanup.
LINK_ARGS="--loss $LOSS --timeout 5m"
# shellcheck source=scripts/lib/emulated-tunnel.sh
. scripts/lib/emulated-tunnel.sh
emulated_link
echo_tunnel
if ! ip netns exec "$CNS" curl -fsS http://127.0.0.1:8087/readyz >/dev/null 2>&1; then
  echo "demo-lossy: the tunnel did not come up on the emulated link; the logs:" >&2
  tail -n 20 "$work"/*.log >&2
  exit 1
fi

total() { sed -n 's/^Total latency: *//p' "$1"; }
echo "== Over an emulated LAN link: $DELAY each way, $LOSS of the packets lost each way (tools/linkem), $NUMBER x $SIZE B round trips"
echo "-- Direct TCP (what ssh -L or any TCP tunnel gives too)"
ip netns exec "$CNS" "$BIN/latency-client" --server-host "$SERVER_IP" --server-port 15676 --number "$NUMBER" --size "$SIZE" | tee "$work/direct.txt"
echo "-- Through quictun"
ip netns exec "$CNS" "$BIN/latency-client" --server-host 127.0.0.1 --server-port 6500 --number "$NUMBER" --size "$SIZE" | tee "$work/tunnel.txt"
echo
echo "Total time: direct TCP $(total "$work/direct.txt"), through quictun $(total "$work/tunnel.txt"). TCP waits for"
echo "every lost packet's retransmission (200 ms at least); the tunnel's QUIC stream recovers it in about one round trip."
