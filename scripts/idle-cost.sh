#!/usr/bin/env bash
# Idle cost of a connected quictun-client and quictun-server (issue 22): both on loopback inside a
# network namespace of their own (so its /proc/net/snmp counts only their UDP datagrams), connected,
# then left alone; prints each daemon's context switches a second (all threads, from
# /proc/PID/task/*/status), CPU (10 ms ticks) and the UDP datagrams both sent in SECONDS. With perf
# (linux-perf), also its wake-ups a second: bursts of activity of the process, any of its threads,
# 10 ms or more apart (one timer or packet wakes several Go threads in turn: each is a context
# switch, the burst is one wake-up of the process, as powertop counts them).
# MODE=ssh keeps one tunnel open but quiet (an echo, then nothing), as an idle ssh session.
# DAEMON_ARGS adds flags to both daemons, e.g. DAEMON_ARGS='--resume-window 10m' (resumable tunnels).
# OUT=file also writes the figures as JSON, for `bench scale-report --idle` (the bench report's Idle section).
# Needs root and `make build`.
#   scripts/idle-cost.sh [BIN=bin] [SECONDS=60] [MODE=none|ssh] [OUT=bench/runs/idle-DATE-MODE.json]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin} SECS=${SECONDS_IDLE:-${1:-60}} MODE=${MODE:-none} OUT=${OUT:-}
started=$(date -u +%Y-%m-%dT%H:%M:%SZ) load0=$(cut -d' ' -f1-3 /proc/loadavg)
ns=qtidle$$
work=$(mktemp -d)
ip netns add "$ns"
ip -n "$ns" link set lo up
cleanup() {
  ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
  sleep 0.5
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
X=(ip netns exec "$ns")
(umask 077; head -c 32 /dev/urandom | base64 >"$work/secret")
fp=$("$BIN/quictun-server" fingerprint --state-dir "$work/state")
"${X[@]}" "$BIN/latency-client" serve --listen 127.0.0.1:7000 >"$work/echo.log" 2>&1 &
"${X[@]}" "$BIN/quictun-server" --listen-on 127.0.0.1:7500 --state-dir "$work/state" --secret-file "$work/secret" \
  --allow tcp:127.0.0.1:7000 --httpd-listen-on 127.0.0.1:8086 ${DAEMON_ARGS:-} >"$work/server.log" 2>&1 &
spid=$!
sleep 0.5
"${X[@]}" "$BIN/quictun-client" --listen-on tcp:127.0.0.1:6500 --server-endpoint 127.0.0.1:7500 --server-fingerprint "$fp" \
  --secret-file "$work/secret" --token-source tcp:127.0.0.1:7000 --httpd-listen-on 127.0.0.1:8087 ${DAEMON_ARGS:-} >"$work/client.log" 2>&1 &
cpid=$!
sleep 2
if [ "$MODE" = ssh ]; then
  # one tunnel, one echo, then quiet for the rest of the run (bash's /dev/tcp)
  "${X[@]}" bash -c 'exec 3<>/dev/tcp/127.0.0.1/6500; printf hello >&3; head -c 5 <&3 >/dev/null; sleep 100000' &
fi
sleep 10 # past the client's 5 s without work
csw() { local t=0 v f; for f in /proc/"$1"/task/*/status; do v=$(awk '/^(non)?voluntary_ctxt_switches/{s+=$2} END{print s+0}' "$f"); t=$((t + v)); done; echo "$t"; }
ticks() { awk '{print $14+$15}' /proc/"$1"/stat; }
udp() { "${X[@]}" awk '/^Udp:/{n++; if (n==2) print $2, $5}' /proc/net/snmp; }
c0=$(csw $cpid) s0=$(csw $spid) ct0=$(ticks $cpid) st0=$(ticks $spid)
read -r in0 out0 < <(udp)
if command -v perf >/dev/null && perf record -q -e sched:sched_switch -p "$cpid,$spid" -o "$work/perf.data" -- sleep "$SECS" 2>/dev/null; then
  # a switch-out of one of the daemon's threads ends a run; a run 10 ms or more after the
  # process's previous one starts a new burst
  perf script -i "$work/perf.data" -F pid,time 2>/dev/null | awk -v c="$cpid" -v s="$SECS" '
    { t = $2 + 0; p = $1 }
    last[p] == "" || t - last[p] >= 0.010 { n[p]++ }
    { last[p] = t }
    END { printf "wake-ups (perf, bursts 10 ms apart): client %.2f/s, server %.2f/s\n", n[c] / s, n[p2] / s
          printf "%.3f %.3f\n", n[c] / s, n[p2] / s >w }' p2="$spid" w="$work/wakeups"
else
  sleep "$SECS"
fi
c1=$(csw $cpid) s1=$(csw $spid) ct1=$(ticks $cpid) st1=$(ticks $spid)
read -r in1 out1 < <(udp)
awk -v s="$SECS" -v c=$((c1 - c0)) -v sv=$((s1 - s0)) -v ct=$((ct1 - ct0)) -v st=$((st1 - st0)) -v i=$((in1 - in0)) -v o=$((out1 - out0)) -v m="$MODE" 'BEGIN {
  printf "idle %d s (mode %s): client %.2f context switches/s, %.3f %% of a core; server %.2f/s, %.3f %%; UDP datagrams sent %d, received %d (both daemons)\n",
    s, m, c/s, ct/s, sv/s, st/s, o, i }'
if [ -n "$OUT" ]; then
  mkdir -p "$(dirname "$OUT")"
  # the client's keep-alive period: its --keepalive-period default, as this script runs it
  ka=$("$BIN/quictun-client" --help 2>&1 | awk '/--keepalive-period/{f=1} f && match($0, /\(default [0-9.]+s\)/) {print substr($0, RSTART + 9, RLENGTH - 11); exit}')
  rev=$("$BIN/quictun-server" version 2>/dev/null | head -1 || true)
  awk -v s="$SECS" -v c=$((c1 - c0)) -v sv=$((s1 - s0)) -v ct=$((ct1 - ct0)) -v st=$((st1 - st0)) -v i=$((in1 - in0)) -v o=$((out1 - out0)) \
    -v m="$MODE" -v ka="${ka:-0}" -v t="$started" -v rev="$rev" -v l0="$load0" -v l1="$(cut -d' ' -f1-3 /proc/loadavg)" -v wk="$(cat "$work/wakeups" 2>/dev/null)" 'BEGIN {
    printf "{\n  \"started\": \"%s\",\n  \"mode\": \"%s\",\n  \"seconds\": %d,\n  \"keepalive_seconds\": %s,\n", t, m, s, ka + 0
    printf "  \"client_context_switches_per_second\": %.3f,\n  \"server_context_switches_per_second\": %.3f,\n", c/s, sv/s
    if (wk != "") { split(wk, w, " "); printf "  \"client_wakeups_per_second\": %s,\n  \"server_wakeups_per_second\": %s,\n", w[1], w[2] }
    printf "  \"client_cpu_percent\": %.4f,\n  \"server_cpu_percent\": %.4f,\n", ct/s, st/s
    printf "  \"udp_datagrams_sent\": %d,\n  \"udp_datagrams_received\": %d,\n", o, i
    printf "  \"revision\": \"%s\",\n  \"loadavg_before\": \"%s\",\n  \"loadavg_after\": \"%s\"\n}\n", rev, l0, l1 }' >"$OUT"
  echo "wrote $OUT"
fi
