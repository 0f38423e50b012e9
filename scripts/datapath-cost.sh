#!/usr/bin/env bash
# What a build costs the data path, against another, as CPU work per byte and per request (issue 35:
# "the accounting and caps cost the data path <= 2 %"). Whole-daemon throughput on a small shared VM
# moves +-10-20 % between runs, so a 2 % difference drowns in it; the CPU time the two daemons spend
# for a fixed amount of data moves far less, and pairing the builds (A then B, then B then A, ...)
# cancels the machine's drift between pairs.
#
# Both builds' daemon pairs run side by side on loopback (server side on CPU 1: quictun-server, the
# sink, redis-server; client side on CPU 0: quictun-client and the load generator). Each pair of runs
# measures, per build and case, the CPU time of both daemons during the transfer (perf stat's
# task-clock when perf works, else /proc ticks) and the throughput:
#   up, down  latency-client bulk --bytes SIZE through the tunnel (CPU s/GB, Mbit/s)
#   redis     redis-benchmark -n REQUESTS -c 50 -t set,get (CPU us/request, requests/s)
# It prints every sample, then per build and case the median (min-max), and B/A: the ratio of the
# medians and the median of the per-pair ratios (the paired figure, robust to drift).
#
# With -P SECONDS it then profiles each build's server for SECONDS per case under the same load
# (its /debug/pprof) and prints the share of the server's CPU samples in the feature's own code: each
# sample is charged to the deepest github.com/ frame on its stack, and counts when that frame matches
# FEATURE (scripts/lib/pprof-share.py; by default the per-identity accounting and caps: pkg/ratecap,
# pkg/usage, egress's account calls, the server's adapters). A wrapper's own work counts, what it wraps
# does not. Being a share within one process, it holds under load that moves the totals by 20 %.
#
# Usage: scripts/datapath-cost.sh [-n PAIRS] [-s SIZE] [-r REQUESTS] [-c CASES] [-t MAXSECONDS] [-P SECONDS] BIN_A BIN_B
#   PAIRS (5) pairs of runs (0: profiles only); SIZE (512MiB) per bulk run; REQUESTS (50000) per redis
#   test (SET and GET); CASES (up,down,redis); MAXSECONDS (540): no new pair starts after this (the run
#   stays bounded); -P needs go (go tool pprof) and python3.
#   ARGS_A, ARGS_B (environment): extra quictun-server flags of build A / B, e.g.
#   ARGS_B=--default-rate-limit=100Gbit. Each BIN holds quictun-server and quictun-client; latency-client
#   is taken from BIN_A. Benchmarks on a shared machine: run it under the bench lock.
#   The build without accounting and caps on the data path (issue 35's comparison):
#   git worktree add --detach OFF HEAD && git -C OFF apply $PWD/scripts/lib/datapath-off.patch &&
#   (cd OFF && bash scripts/quic-go.sh && make build); then scripts/datapath-cost.sh ... bin OFF/bin
set -euo pipefail
pairs=5 size=512MiB requests=50000 cases=up,down,redis maxsec=540 profsec=0
FEATURE=${FEATURE:-'quictun/pkg/ratecap\.|quictun/pkg/usage\.|quictun/pkg/egress\.\(\*stream\)\.(account|suspended|suspendedUntil|throttle|track)|quictun/server\.(ledgerAccounts|account|\(\*conn\)\.identified)|quictun/pkg/metrics\.\(\*IdentityCollector\)'}
while getopts n:s:r:c:t:P: o; do
  case $o in
  n) pairs=$OPTARG ;; s) size=$OPTARG ;; r) requests=$OPTARG ;; c) cases=$OPTARG ;; t) maxsec=$OPTARG ;; P) profsec=$OPTARG ;;
  *) sed -n '2,31p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 2 ] || { sed -n '2,31p' "$0" >&2; exit 2; }
bins=("$(cd "$1" && pwd)" "$(cd "$2" && pwd)")
here=$(cd "$(dirname "$0")" && pwd)
[ "$profsec" = 0 ] || { PATH=/usr/local/go/bin:$PATH; command -v go >/dev/null || { echo "-P needs go" >&2; exit 2; }; }
read -r -a args_a <<<"${ARGS_A:-}"
read -r -a args_b <<<"${ARGS_B:-}"
lc=${bins[0]}/latency-client
IFS=, read -r -a caselist <<<"$cases"

work=$(mktemp -d)
pids=()
stop() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  rm -rf "$work"
}
trap stop EXIT INT TERM

pin_srv=() pin_cli=()
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then pin_cli=(taskset -c 0) pin_srv=(taskset -c 1); fi
use_perf=0
if command -v perf >/dev/null && perf stat -x, -e task-clock true >/dev/null 2>&1; then use_perf=1; fi

# A loopback address of its own (127.0.x.y): no port taken by another test collides.
host=127.0.$((1 + RANDOM % 200)).$((2 + RANDOM % 250))
port=$((20000 + RANDOM % 20000))
waittcp() { for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/$host/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 not up" >&2; return 1; }

"${pin_srv[@]}" "$lc" serve --listen "$host:$port" --sink-listen "$host:$((port + 1))" >"$work/sink.log" 2>&1 &
pids+=($!)
want_redis=0
[[ ",$cases," == *,redis,* ]] && want_redis=1
if [ $want_redis = 1 ]; then
  command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null || { echo "redis case: redis-server/redis-benchmark not installed" >&2; exit 1; }
  mkdir -p "$work/redis"
  "${pin_srv[@]}" redis-server --bind "$host" --port $((port + 2)) --save "" --appendonly no --dir "$work/redis" >"$work/redis.log" 2>&1 &
  pids+=($!)
  waittcp $((port + 2))
fi
waittcp $((port + 1))

# Daemon pair of build i (0: A, 1: B): server pid in spid[i], client pid in cpid[i]; forwards at
# fwd base + 1 (sink) and + 2 (redis).
spid=() cpid=() fwd=()
for i in 0 1; do
  b=${bins[$i]} base=$((port + 10 + 10 * i)) st=$work/state$i
  (umask 077; head -c 32 /dev/urandom | base64 >"$work/secret$i")
  fp=$("$b/quictun-server" fingerprint --state-dir "$st")
  extra=()
  if [ $i = 0 ]; then extra=("${args_a[@]}"); else extra=("${args_b[@]}"); fi
  "${pin_srv[@]}" "$b/quictun-server" --listen-on "$host:$base" --state-dir "$st" --secret-file "$work/secret$i" \
    --allow "tcp:$host:$((port + 1)),tcp:$host:$((port + 2))" --httpd-listen-on "$host:$((base + 3))" --enable-pprof --audit-log=false \
    ${extra[@]+"${extra[@]}"} >"$work/server$i.log" 2>&1 &
  spid[i]=$!
  pids+=($!)
  "${pin_cli[@]}" "$b/quictun-client" --server-endpoint "$host:$base" --server-fingerprint "$fp" --secret-file "$work/secret$i" \
    --httpd-listen-on "" --forward "tcp:$host:$((base + 1))=tcp:$host:$((port + 1))" \
    --forward "tcp:$host:$((base + 2))=tcp:$host:$((port + 2))" >"$work/client$i.log" 2>&1 &
  cpid[i]=$!
  pids+=($!)
  fwd[i]=$base
  waittcp $((base + 1))
  # Warm-up: the QUIC connection up, the buffers grown.
  timeout 60 "${pin_cli[@]}" "$lc" bulk --server-host "$host" --server-port $((base + 1)) --bytes 64MiB --json >/dev/null
  timeout 60 "${pin_cli[@]}" "$lc" bulk --server-host "$host" --server-port $((base + 1)) --bytes 64MiB --direction down --json >/dev/null
done

ticks() { local t=0 f p; for p in "$@"; do read -r -a f </proc/"$p"/stat; t=$((t + f[13] + f[14])); done; echo "$t"; }

# cpu_of i CMD...: runs CMD (the load) and prints the CPU seconds both daemons of build i spent meanwhile;
# CMD's output goes to $work/out.
cpu_of() {
  local i=$1 t0 t1
  shift
  t0=$(ticks "${spid[i]}" "${cpid[i]}")
  if [ $use_perf = 1 ]; then
    perf stat -x, -e task-clock -p "${spid[i]},${cpid[i]}" -o "$work/perf" -- "$@" >"$work/out"
    t1=$(ticks "${spid[i]}" "${cpid[i]}")
    awk -F, -v d=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v x="$work/cross" \
      '$3 ~ /^task-clock/ { printf "%.4f\n", $1 / 1000; print $1 / 1000, d / hz >>x; exit }' "$work/perf"
  else
    "$@" >"$work/out"
    t1=$(ticks "${spid[i]}" "${cpid[i]}")
    awk -v d=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.4f\n", d / hz }'
  fi
}

# sample i pair case: one measurement; prints "case build pair cpu_per_unit rate".
sample() {
  local i=$1 n=$2 c=$3 cpu name
  name=$([ "$i" = 0 ] && echo A || echo B)
  case $c in
  up | down)
    cpu=$(cpu_of "$i" timeout 300 "${pin_cli[@]}" "$lc" bulk --server-host "$host" --server-port $((fwd[i] + 1)) \
      --bytes "$size" --direction "$c" --json)
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["verified"] and not r["errors"], r
print("%s %s %d %.4f %.1f" % (sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]) / (r["bytes"] / 1e9), r["mbit_per_s"]))' \
      "$work/out" "$c" "$name" "$n" "$cpu"
    ;;
  redis)
    cpu=$(cpu_of "$i" timeout 300 "${pin_cli[@]}" redis-benchmark -h "$host" -p $((fwd[i] + 2)) -n "$requests" -c 50 -t set,get --csv)
    # --csv: "SET","rps",... and "GET","rps",...; the rate is the mean of both, CPU per request of both.
    awk -F'"' -v c="$c" -v b="$name" -v n="$n" -v cpu="$cpu" -v req="$requests" \
      '$2 == "SET" || $2 == "GET" { s += $4; k++ } END { if (k != 2) exit 1; printf "%s %s %d %.4f %.1f\n", c, b, n, cpu * 1e6 / (2 * req), s / k }' "$work/out"
    ;;
  esac
}

echo "# datapath-cost: A=${bins[0]} ${ARGS_A:-} B=${bins[1]} ${ARGS_B:-}; pairs=$pairs size=$size requests=$requests; cpu from $([ $use_perf = 1 ] && echo 'perf task-clock' || echo '/proc ticks'); $(uptime)"
echo "# case build pair cpu(s/GB or us/request) rate(Mbit/s or requests/s)"
start=$SECONDS
: >"$work/samples"
for n in $(seq 1 "$pairs"); do
  if [ $((SECONDS - start)) -ge "$maxsec" ]; then echo "# stopped after $((n - 1)) pairs: -t $maxsec s reached" >&2; break; fi
  order=(0 1)
  [ $((n % 2)) = 0 ] && order=(1 0)
  for c in "${caselist[@]}"; do
    for i in "${order[@]}"; do sample "$i" "$n" "$c" | tee -a "$work/samples"; done
  done
done
[ "$pairs" = 0 ] || echo "# $(uptime)"
[ ! -s "$work/cross" ] || awk '{ p += $1; t += $2 } END { printf "# CPU of all samples: perf task-clock %.2f s, /proc ticks %.2f s (a cross-check)\n", p, t }' "$work/cross"
[ "$pairs" = 0 ] || echo "# case: figure  A median (min-max)  B median (min-max)  B/A of medians  B/A median of pairs (min-max) [95 % interval of that median, bootstrap]"
[ "$pairs" = 0 ] || python3 - "$work/samples" <<'EOF'
import random, statistics as st, sys
random.seed(1)
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
d = {}
for c, b, n, cpu, rate in rows:
    d.setdefault((c, b), {})[int(n)] = (float(cpu), float(rate))
for c in dict.fromkeys(r[0] for r in rows):
    a, b = d.get((c, "A"), {}), d.get((c, "B"), {})
    for k, label in ((0, "CPU s/GB" if c != "redis" else "CPU us/request"), (1, "Mbit/s" if c != "redis" else "requests/s")):
        va, vb = [v[k] for v in a.values()], [v[k] for v in b.values()]
        if not va or not vb:
            continue
        pr = [b[n][k] / a[n][k] for n in a if n in b and a[n][k]]
        f = lambda v: "%.4g (%.4g-%.4g)" % (st.median(v), min(v), max(v))
        boot = sorted(st.median(random.choices(pr, k=len(pr))) for _ in range(4000))
        print("%-5s %-15s A %-26s B %-26s %.3f  %.3f (%.3f-%.3f) [%.3f-%.3f]" % (c, label, f(va), f(vb), st.median(vb) / st.median(va),
              st.median(pr), min(pr), max(pr), boot[100], boot[3899]))
EOF

[ "$profsec" != 0 ] || exit 0

# load i case seconds: case's load on build i for about seconds.
load() {
  local i=$1 c=$2 d=$3
  case $c in
  up | down) timeout $((d + 60)) "${pin_cli[@]}" "$lc" bulk --server-host "$host" --server-port $((fwd[i] + 1)) \
    --duration "${d}s" --direction "$c" --json >/dev/null ;;
  redis) timeout "$d" "${pin_cli[@]}" redis-benchmark -h "$host" -p $((fwd[i] + 2)) -n 100000000 -c 50 -t set,get -q >/dev/null || true ;;
  esac
}
echo "# profiles: $profsec s per build and case; $(uptime)"
echo "# case build feature-s total-s share-% (of the server's CPU samples) top feature functions"
for c in "${caselist[@]}"; do
  for i in 0 1; do
    curl -s -o "$work/prof$i" "http://$host:$((fwd[i] + 3))/debug/pprof/profile?seconds=$profsec" &
    cp=$!
    sleep 0.2
    load "$i" "$c" $((profsec - 1))
    wait $cp
    printf '%s %s ' "$c" "$([ "$i" = 0 ] && echo A || echo B)"
    go tool pprof -traces "$work/prof$i" 2>/dev/null | python3 "$here/lib/pprof-share.py" "$FEATURE"
  done
done
echo "# $(uptime)"
