#!/usr/bin/env bash
# Local demo: an echo server, quictun-server, quictun-client, then the latency
# client direct and through the tunnel. Everything runs on loopback and is
# stopped on exit. Ports can be changed with the environment variables below.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
ECHO_PORT=${ECHO_PORT:-15676}
SERVER_PORT=${SERVER_PORT:-7500}
CLIENT_PORT=${CLIENT_PORT:-6500}
NUMBER=${NUMBER:-1000}
SIZE=${SIZE:-1000}

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

wait_tcp() { # wait until something listens on 127.0.0.1:$1
  for _ in $(seq 1 100); do
    (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on 127.0.0.1:$1; the logs:" >&2
  for f in "$work"/*.log; do echo "== $f" >&2; show_log "$f" >&2; done
  exit 1
}

# show_log prints a daemon log without its effective-configuration dump (-v 1,
# one line per flag): the lines that matter are start, listeners, connection
# and errors. 'quictun-client --write-config' prints the same configuration.
show_log() {
  awk '/"Effective configuration" config=</ { skip = 1; print "  (effective configuration left out: add --write-config to the same command line to see it)"; next }
       skip && /^ >$/ { skip = 0; next }
       !skip' "$1"
}

(umask 077; head -c 32 /dev/urandom | base64 > "$work/secret")   # mode 0600: the daemons refuse a secret others can read
"$BIN/latency-client" serve --listen 127.0.0.1:$ECHO_PORT >"$work/echo.log" 2>&1 & pids+=($!)
fp=$("$BIN/quictun-server" fingerprint --state-dir "$work/state")
"$BIN/quictun-server" --listen-on 127.0.0.1:$SERVER_PORT --state-dir "$work/state" \
  --secret-file "$work/secret" --allow tcp:127.0.0.1:$ECHO_PORT --httpd-listen-on 127.0.0.1:0 \
  -v 2 >"$work/server.log" 2>&1 & pids+=($!)
"$BIN/quictun-client" --listen-on tcp:127.0.0.1:$CLIENT_PORT --server-endpoint 127.0.0.1:$SERVER_PORT \
  --server-fingerprint "$fp" --secret-file "$work/secret" --token-source tcp:127.0.0.1:$ECHO_PORT \
  --httpd-listen-on 127.0.0.1:0 -v 2 >"$work/client.log" 2>&1 & pids+=($!)
wait_tcp $ECHO_PORT
wait_tcp $CLIENT_PORT
for _ in $(seq 1 50); do grep -q "Connected to server" "$work/client.log" && break; sleep 0.1; done

echo "== Direct TCP to the echo server (127.0.0.1:$ECHO_PORT), $NUMBER x $SIZE B"
"$BIN/latency-client" --server-host 127.0.0.1 --server-port $ECHO_PORT --number "$NUMBER" --size "$SIZE"
echo
echo "== Through quictun (client 127.0.0.1:$CLIENT_PORT -> server 127.0.0.1:$SERVER_PORT -> echo), $NUMBER x $SIZE B"
"$BIN/latency-client" --server-host 127.0.0.1 --server-port $CLIENT_PORT --number "$NUMBER" --size "$SIZE"
echo
echo "This is loopback: the tunnel can only add cost here. For lossy and distant links run 'make bench' (root)."
echo "== Client log"
show_log "$work/client.log"
