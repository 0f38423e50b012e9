#!/usr/bin/env bash
# What one message costs the daemons' schedulers (issue 32, item 2): a 1000 B ping-pong through
# quictun on loopback, once per runtime environment in turn (interleaved, REPS rounds), and per round
# trip: the mean latency, the CPU time of both daemons, and their threads' voluntary context switches
# (each one a thread that went to sleep and had to be woken: on an idle machine, a wake-up of an
# idle CPU). Direct TCP to the echo server is measured in the same rounds. With TRACE=DIR, the last
# round also saves a 2 s runtime trace of each daemon per environment and prints, per round trip,
# the goroutine unblocks, system calls and Ps started from idle (go tool trace -d=parsed).
#
# Usage: scripts/sched-cost.sh [REPS] [ENV ...]
#   ENV is a space-separated NAME=VALUE list, "-" for none (Go's defaults); the default set is
#   - GOMAXPROCS=1 GODEBUG=schedtrace=2147483647 "GOMAXPROCS=1 GODEBUG=schedtrace=2147483647"
#   NUMBER (5000) round trips per run, BIN (bin) the binaries (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
BIN=${BIN:-bin}
NUMBER=${NUMBER:-5000}
REPS=${1:-5}
shift || true
envs=("$@")
[ ${#envs[@]} -gt 0 ] || envs=(- GOMAXPROCS=1 GODEBUG=schedtrace=2147483647 "GOMAXPROCS=1 GODEBUG=schedtrace=2147483647")

work=$(mktemp -d)
pids=()
echo_pid=""
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; pids=(); }
trap 'stop; [ -z "$echo_pid" ] || kill "$echo_pid" 2>/dev/null || true; rm -rf "$work"' EXIT INT TERM

# A loopback address of its own for each run (127.0.x.y): no port taken by another test collides.
host=127.0.$((1 + RANDOM % 200)).$((2 + RANDOM % 250))
port=$((20000 + RANDOM % 20000))
(umask 077; head -c 32 /dev/urandom | base64 >"$work/secret")
fp=$("$BIN/quictun-server" fingerprint --state-dir "$work/state")
"$BIN/latency-client" serve --listen "$host:$port" >"$work/echo.log" 2>&1 &
echo_pid=$!
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null && break; sleep 0.1; done

ticks() { local t=0 f; for p in "$@"; do read -r -a f </proc/"$p"/stat; t=$((t + f[13] + f[14])); done; echo "$t"; }
vcsw() { for p in "$@"; do cat /proc/"$p"/task/*/status; done 2>/dev/null | awk '/^voluntary_ctxt_switches/ { v += $2 } END { print v + 0 }'; }

# run ENV [TRACEDIR]: one ping-pong through freshly started daemons; prints "mean_us cpu_us vcsw" per round trip.
run() {
  local env=() kv
  [ "$1" = - ] || for kv in $1; do env+=("$kv"); done
  env+=(QUICTUN_SCHED_COST=1) # so that env always has an argument (set -u and an empty array)
  env "${env[@]}" "$BIN/quictun-server" --listen-on "$host:$((port + 1))" --state-dir "$work/state" --secret-file "$work/secret" \
    --allow "tcp:$host:$port" --httpd-listen-on "$host:$((port + 3))" --enable-pprof >"$work/server.log" 2>&1 &
  pids+=($!)
  env "${env[@]}" "$BIN/quictun-client" --server-endpoint "$host:$((port + 1))" --server-fingerprint "$fp" \
    --secret-file "$work/secret" --forward "tcp:$host:$((port + 2))=tcp:$host:$port" \
    --httpd-listen-on "$host:$((port + 4))" --enable-pprof -v 2 >"$work/client.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do grep -q '"Connected to server"' "$work/client.log" && break; sleep 0.1; done
  "$BIN/latency-client" --server-host "$host" --server-port $((port + 2)) --number 200 >/dev/null # warm-up
  local tr=()
  if [ -n "${2:-}" ]; then
    curl -s -o "$2.server.trace" "http://$host:$((port + 3))/debug/pprof/trace?seconds=2" & tr+=($!)
    curl -s -o "$2.client.trace" "http://$host:$((port + 4))/debug/pprof/trace?seconds=2" & tr+=($!)
    sleep 0.2
  fi
  local t0 v0 t1 v1
  t0=$(ticks "${pids[@]}"); v0=$(vcsw "${pids[@]}")
  "$BIN/latency-client" --server-host "$host" --server-port $((port + 2)) --number "$NUMBER" --json >"$work/out.json"
  t1=$(ticks "${pids[@]}"); v1=$(vcsw "${pids[@]}")
  [ ${#tr[@]} -eq 0 ] || wait "${tr[@]}"
  stop
  jq -r --argjson t $((t1 - t0)) --argjson v $((v1 - v0)) \
    '"\(.mean_ms * 1000 | round) \($t * 1000000 / 100 / .round_trips | round) \($v / .round_trips * 10 | round / 10)"' "$work/out.json"
}

# per_rt TRACE: unblocks, system calls and Ps started from idle per round trip (a round trip is one
# write to a TCP connection by the daemon).
per_rt() {
  go tool trace -d=parsed "$1" 2>/dev/null | awk '
    /^M=/ && / StateTransition / {
      if (/GoID=[0-9]+ Waiting->Runnable/) u++
      if (/GoID=[0-9]+ Running->Syscall/) { s++; want = 1; next }
      if (/ProcID=[0-9]+ Idle->Running/) p++
      want = 0; next
    }
    /^M=/ { want = 0; next }
    want && /@ 0x/ { if ($1 == "net.(*netFD).Write") w++; if ($1 !~ /^(runtime|internal|syscall)/) want = 0 }
    END { if (w) printf "%.2f unblocks, %.2f syscalls, %.2f P starts per round trip (%d round trips)", u / w, s / w, p / w, w }'
}

declare -A lat cpu csw
for r in $(seq 1 "$REPS"); do
  read -r m _ _ < <("$BIN/latency-client" --server-host "$host" --server-port "$port" --number "$NUMBER" --json |
    jq -r '"\(.mean_ms * 1000 | round) 0 0"')
  lat[direct]+="$m "
  for i in "${!envs[@]}"; do
    tdir=""
    if [ -n "${TRACE:-}" ] && [ "$r" = "$REPS" ]; then mkdir -p "$TRACE"; tdir=$TRACE/env$i; fi
    read -r m c v < <(run "${envs[$i]}" "$tdir")
    lat[$i]+="$m "; cpu[$i]+="$c "; csw[$i]+="$v "
  done
done

median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "ping-pong 1000 B x $NUMBER on loopback, $REPS interleaved rounds, medians (all runs)"
printf '%-45s %s\n' "direct TCP" "mean $(median ${lat[direct]}) us  (${lat[direct]% })"
for i in "${!envs[@]}"; do
  printf '%-45s %s\n' "quictun, env: ${envs[$i]}" \
    "mean $(median ${lat[$i]}) us  (${lat[$i]% }); daemons' CPU $(median ${cpu[$i]}) us/rt; context switches $(median ${csw[$i]})/rt"
  if [ -n "${TRACE:-}" ]; then
    for side in client server; do echo "    $side: $(per_rt "$TRACE/env$i.$side.trace")"; done
  fi
done
