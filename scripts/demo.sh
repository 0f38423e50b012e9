#!/usr/bin/env bash
# Local demo: an echo server, quictun-server, quictun-client, then the latency
# client direct and through the tunnel. Everything runs on loopback and is
# stopped on exit. Ports can be changed with the environment variables below.
# As root it first runs the same transfer over an emulated lossy link, direct and
# through the tunnel (scripts/demo-lossy.sh): the case the tunnel exists for.
set -euo pipefail
cd "$(dirname "$0")/.."
# The daemons run with your environment (Go's defaults unless set); BENCH_RUNTIME_ENV='GOMAXPROCS=1 ...'
# adds settings (a tuned run), BENCH_PIN=0 turns off the CPU pinning (client side on the first half
# of the CPUs, server side on the second): lib/bench-env.sh.
# shellcheck source=scripts/lib/bench-env.sh
. scripts/lib/bench-env.sh
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

wait_log() { # wait until the log $1 has a line with "$2"
  for _ in $(seq 1 100); do
    grep -q "\"$2\"" "$1" && return 0
    sleep 0.1
  done
  echo "no \"$2\" in $1 after 10 s; the logs:" >&2
  for f in "$work"/*.log; do echo "== $f" >&2; show_log "$f" >&2; done
  exit 1
}

admin_address() { # the address of the admin server the daemon logged ("Admin server listening")
  wait_log "$1" "Admin server listening"
  sed -n 's/.*"Admin server listening" address="\([^"]*\)".*/\1/p' "$1" | head -1
}

# show_log prints a daemon log without its effective-configuration dump (-v 1,
# one line per flag): the lines that matter are start, listeners, connection
# and errors. 'quictun-client --write-config' prints the same configuration.
show_log() {
  awk '/"Effective configuration" config=</ { skip = 1; print "  (effective configuration left out: add --write-config to the same command line to see it)"; next }
       skip && /^ >$/ { skip = 0; next }
       !skip' "$1"
}

lossy_shown=""
if [[ $(id -u) == 0 && -x $BIN/linkem && -c /dev/net/tun ]] && command -v ip >/dev/null && command -v curl >/dev/null; then
  if BIN=$BIN bash scripts/demo-lossy.sh; then
    lossy_shown=1
  else
    echo "(the lossy-link part failed: see above; the loopback demo follows)"
  fi
  echo
fi

(umask 077; head -c 32 /dev/urandom | base64 > "$work/secret")   # mode 0600: the daemons refuse a secret others can read
bench_describe
"${bench_pin_server[@]}" "$BIN/latency-client" serve --listen 127.0.0.1:$ECHO_PORT >"$work/echo.log" 2>&1 & pids+=($!)
fp=$("$BIN/quictun-server" fingerprint --state-dir "$work/state")
"${bench_pin_server[@]}" env "${bench_env[@]}" "$BIN/quictun-server" --listen-on 127.0.0.1:$SERVER_PORT --state-dir "$work/state" \
  --secret-file "$work/secret" --allow tcp:127.0.0.1:$ECHO_PORT --httpd-listen-on 127.0.0.1:0 \
  -v 2 >"$work/server.log" 2>&1 & pids+=($!)
"${bench_pin_client[@]}" env "${bench_env[@]}" "$BIN/quictun-client" --server-endpoint 127.0.0.1:$SERVER_PORT \
  --server-fingerprint "$fp" --secret-file "$work/secret" --forward tcp:127.0.0.1:$CLIENT_PORT=tcp:127.0.0.1:$ECHO_PORT \
  --httpd-listen-on 127.0.0.1:0 -v 2 >"$work/client.log" 2>&1 & pids+=($!)
wait_tcp $ECHO_PORT
wait_log "$work/client.log" "Listening for local connections"   # not wait_tcp: a probe would open a tunnel
wait_log "$work/client.log" "Connected to server"
for p in "${pids[@]}"; do   # e.g. a port already taken: the process exited, something else answers there
  if ! kill -0 "$p" 2>/dev/null; then
    echo "a demo process exited at start (a port in use? set ECHO_PORT, SERVER_PORT, CLIENT_PORT); the logs:" >&2
    for f in "$work"/*.log; do echo "== $f" >&2; show_log "$f" >&2; done
    exit 1
  fi
done
client_admin=$(admin_address "$work/client.log")
server_admin=$(admin_address "$work/server.log")

echo "== Direct TCP to the echo server (127.0.0.1:$ECHO_PORT), $NUMBER x $SIZE B"
"${bench_pin_client[@]}" "$BIN/latency-client" --server-host 127.0.0.1 --server-port $ECHO_PORT --number "$NUMBER" --size "$SIZE"
echo
echo "== Through quictun (client 127.0.0.1:$CLIENT_PORT -> server 127.0.0.1:$SERVER_PORT -> echo), $NUMBER x $SIZE B"
"${bench_pin_client[@]}" "$BIN/latency-client" --server-host 127.0.0.1 --server-port $CLIENT_PORT --number "$NUMBER" --size "$SIZE"
echo
echo "This is loopback: the tunnel can only add cost here."
if [[ -n $lossy_shown ]]; then
  echo "The emulated lossy link above is where it pays; 'make bench' (root) measures more links and loss rates."
else
  echo "Where it pays is a lossy or distant link: run 'sudo make demo' (network namespaces and tools/linkem need root)"
  echo "to see the same transfer over an emulated LAN link losing 2 % of its packets, direct and through the tunnel"
  echo "(4-8x faster through it in runs on a loaded 2-core VM), or 'make bench' (root) for more links."
fi
echo

# One tunnel held open, to show what the admin API says about it.
tunnels=""
before=$(grep -c '"Closed tunnel"' "$work/server.log" || true)
if command -v curl >/dev/null; then
  exec 3<>/dev/tcp/127.0.0.1/$CLIENT_PORT
  for _ in $(seq 1 50); do
    tunnels=$(curl -s "http://$server_admin/tunnels") && [[ $tunnels == *uuid* ]] && break
    sleep 0.1
  done
  exec 3>&-
  for _ in $(seq 1 50); do (( $(grep -c '"Closed tunnel"' "$work/server.log") > before )) && break; sleep 0.1; done
fi

echo "== Client log"
show_log "$work/client.log"
echo
echo "== Server log, the lines that matter (the whole log also has the effective configuration at -v 1 and connection events at -v 2)"
grep -E '"(Starting quictun-server|Server certificate|Destinations allowed|Admin server listening|Server listening|Accepted connection|Closed tunnel)"' "$work/server.log"
echo
echo "\"Closed tunnel\" is the audit log: one line per tunnel at the default verbosity, naming the client's key or"
echo "certificate, the destination, the result and the bytes (--audit-log=false turns it off). The last, empty one is"
echo "the tunnel this script held open for the admin API below."
echo
echo "== Admin APIs: client http://$client_admin, server http://$server_admin (/metrics, /readyz, /tunnels, /connections)"
if [[ -n $tunnels ]]; then
  echo "curl -s http://$server_admin/tunnels, while that tunnel was open:"
  jq . <<<"$tunnels" 2>/dev/null || echo "$tunnels"
fi
if [[ -n ${KEEP:-} ]]; then
  echo "KEEP is set: both daemons keep running. Try: curl -s http://$server_admin/tunnels (press Ctrl-C to stop them)."
  wait
else
  echo "The daemons stop with this script; 'KEEP=1 make demo' keeps them up for curl -s http://$server_admin/tunnels."
fi
