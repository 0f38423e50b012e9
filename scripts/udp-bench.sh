#!/usr/bin/env bash
# UDP through quictun vs direct over the emulated link (issue 12): iperf3 -u
# at RATE with LEN-byte payloads over a 12.5 ms one-way, 100 Mbit/s link at
# each loss rate, direct and through a udp: forward (iperf3's control
# connection goes through a tcp: forward on the same port). Needs root,
# iperf3 and `make build`. Everything runs in two namespaces it creates
# (prefix qu) and removes, bounded by iperf3's -t.
#
# Per loss rate: a WARMUP-second quictun run (printed, left out of the
# summary: the congestion controller meets the loss rate), then REPS
# repetitions of direct and quictun. The first quictun run of all is on a new
# QUIC connection that has carried only iperf3's control connection.
#
# Each run prints the receiver's loss and jitter, the daemons' CPU time, the
# link's bytes client to server per iperf3 packet that reached it (ACKs and
# control traffic included), and where the lost packets went ("lost where"):
#   app>cl    the client host's UDP receive-buffer drops (the quictun
#             client's socket was not read in time; direct: none)
#   cl-drop   quictun client drops (udp_drops_total, by reason)
#   link      the emulator's drops, client to server
#   sv-in     QUIC packets the client declared lost (quictun_quic_packets_lost_total)
#             less the link's drops: lost inside the server host (its socket,
#             quic-go's queue of unprocessed packets); approximate, as the
#             link also drops ACK-only packets, which QUIC does not count
#   sv-dgram  datagrams the client sent that quictun-server neither relayed
#             nor dropped, less the QUIC packets lost: dropped by quic-go's
#             datagram receive queue before patch 0006 counted them
#   sv-drop   quictun server drops (udp_drops_total, by reason)
#   sv-host   the server host's UDP receive-buffer drops (iperf3's socket)
#   sv-closed packets to a closed port on the server host: the test's last
#             packets, after iperf3 closed its socket (not in iperf3's loss)
# The summary at the end gives each loss rate's figures over the REPS runs and
# the per-packet overhead: quictun's bytes per iperf3 packet less direct's.
#
# TRACE=SECONDS samples the client's congestion controller and both
# daemons' counters during each quictun run. GAP=client:SECONDS or
# server:SECONDS stops that daemon (SIGSTOP) for SECONDS once a second
# during quictun runs: a busy host's scheduling gaps, made repeatable.
# BIN=DIR takes the binaries from DIR (to compare builds); KEEP=1 keeps the
# daemons' logs (-v 2) in the work directory it prints.
#
#   scripts/udp-bench.sh [RATE=50M] [LEN=1200] [DURATION=10] [LOSSES="0 1 5"] [REPS=3] [WARMUP=3]
#                        [TRACE=0] [GAP=] [BIN=bin] [KEEP=]
set -euo pipefail
cd "$(dirname "$0")/.."
# bench_env, bench_pin_*: the daemons' added environment (none unless BENCH_RUNTIME_ENV) and CPUs (lib/bench-env.sh).
# shellcheck source=scripts/lib/bench-env.sh
. scripts/lib/bench-env.sh
RATE=${RATE:-50M} LEN=${LEN:-1200} DURATION=${DURATION:-10} LOSSES=${LOSSES:-"0 1 5"} REPS=${REPS:-3}
WARMUP=${WARMUP:-3} TRACE=${TRACE:-0} GAP=${GAP:-} BIN=${BIN:-bin} KEEP=${KEEP:-}
P=qu
CNS=$P-c SNS=$P-s SERVER_IP=198.18.0.2
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "$BIN/linkem" down --prefix $P >/dev/null 2>&1 || true
  if [ -n "$KEEP" ]; then echo "daemons' logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
command -v iperf3 >/dev/null || { echo "iperf3 is not installed (apt-get install iperf3)" >&2; exit 1; }
"$BIN/linkem" down --prefix $P >/dev/null 2>&1 || true
"$BIN/linkem" up --prefix $P --delay 12.5ms --rate 100mbit >"$work/linkem.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do ip netns list | grep -q "^$SNS" && [ -S /run/linkem-$P.sock ] && break; sleep 0.1; done

ip netns exec $SNS iperf3 -s -B 127.0.0.1 -p 5201 >"$work/iperf3-lo.log" 2>&1 &
pids+=($!)
ip netns exec $SNS iperf3 -s -B $SERVER_IP -p 5201 >"$work/iperf3.log" 2>&1 &
pids+=($!)
head -c 32 /dev/urandom | base64 >"$work/secret"
chmod 600 "$work/secret"
fp=$("$BIN/quictun-server" fingerprint --state-dir "$work/state")
ip netns exec $SNS "${bench_pin_server[@]}" env "${bench_env[@]}" "$BIN/quictun-server" --listen-on $SERVER_IP:7500 --state-dir "$work/state" \
  --secret-file "$work/secret" --allow tcp:127.0.0.1:5201,udp:127.0.0.1:5201 \
  --httpd-listen-on 127.0.0.1:8086 -v 2 >"$work/server.log" 2>&1 &
spid=$!
pids+=($spid)
ip netns exec $CNS "${bench_pin_client[@]}" env "${bench_env[@]}" "$BIN/quictun-client" --server-endpoint $SERVER_IP:7500 --server-fingerprint "$fp" \
  --secret-file "$work/secret" --httpd-listen-on 127.0.0.1:8087 \
  --forward tcp:127.0.0.1:5202=tcp:127.0.0.1:5201 --forward udp:127.0.0.1:5202=udp:127.0.0.1:5201 \
  -v 2 >"$work/client.log" 2>&1 &
cpid=$!
pids+=($cpid)
for _ in $(seq 100); do
  ip netns exec $CNS curl -fsS http://127.0.0.1:8087/readyz >/dev/null 2>&1 && break
  sleep 0.1
done

# snapshot DIR saves every counter the accounting needs into DIR.
snapshot() {
  mkdir -p "$1"
  awk '{print ($14+$15)/100}' "/proc/$cpid/stat" >"$1/cpu_client"
  awk '{print ($14+$15)/100}' "/proc/$spid/stat" >"$1/cpu_server"
  "$BIN/linkem" ctl --prefix $P stats >"$1/link"
  ip netns exec $CNS grep ^Udp: /proc/net/snmp >"$1/snmp_client"
  ip netns exec $SNS grep ^Udp: /proc/net/snmp >"$1/snmp_server"
  ip netns exec $CNS curl -fsS http://127.0.0.1:8087/metrics |
    grep -E '^quictun_(client_udp_(packets|drops)|quic_packets_lost)_total' >"$1/metrics_client"
  ip netns exec $SNS curl -fsS http://127.0.0.1:8086/metrics | grep -E '^quictun_server_udp_(packets|drops)_total' >"$1/metrics_server"
}

# account.py NAME LOSS IPERF3_JSON BEFORE AFTER prints a run's lines and
# appends its figures to runs.jsonl.
cat >"$work/account.py" <<'EOF'
import json, sys

def snmp(s):
    head, vals = [l.split()[1:] for l in s.strip().splitlines()]
    return dict(zip(head, map(int, vals)))

def metrics(s):
    out = {}
    for line in s.splitlines():
        k, v = line.rsplit(" ", 1)
        out[k] = float(v)
    return out

def load(d):
    r = {k: open(d + "/" + k).read() for k in ("snmp_client", "snmp_server", "metrics_client", "metrics_server")}
    r["link"] = json.load(open(d + "/link"))["c2s"]
    r["cpu_client"], r["cpu_server"] = float(open(d + "/cpu_client").read()), float(open(d + "/cpu_server").read())
    return r

def delta(a, b, f):
    x, y = f(a), f(b)
    return {k: y[k] - x.get(k, 0) for k in y}

def total(m, *words):
    return sum(v for k, v in m.items() if all(w in k for w in words))

def drops(m):
    return ",".join("%s %d" % (k.split('"')[1], v) for k, v in sorted(m.items()) if "drops_total" in k and v) or "0"

name, loss, out, b, a = sys.argv[1], sys.argv[2], sys.argv[3], load(sys.argv[4]), load(sys.argv[5])
try:
    iperf = json.load(open(out))
except ValueError:
    iperf = {"error": open(out).read()[:200]}
if "error" in iperf:
    print("  %-20s error: %s" % (name, iperf["error"]))
    sys.exit(1)
e = iperf["end"]["sum"]
sent, lost = e.get("packets", 0), e.get("lost_packets", 0)
rx_bps = iperf["end"].get("sum_received", e).get("bits_per_second", e.get("bits_per_second", 0))
link_pkts = a["link"]["rx_packets"] - b["link"]["rx_packets"]
link_bytes = a["link"]["rx_bytes"] - b["link"]["rx_bytes"]
link_drop = sum(a["link"]["dropped"].values()) - sum(b["link"]["dropped"].values())
sc, ss = delta(b["snmp_client"], a["snmp_client"], snmp), delta(b["snmp_server"], a["snmp_server"], snmp)
mc, ms = delta(b["metrics_client"], a["metrics_client"], metrics), delta(b["metrics_server"], a["metrics_server"], metrics)
cpu_c, cpu_s = a["cpu_client"] - b["cpu_client"], a["cpu_server"] - b["cpu_server"]
tunnel = name.startswith("quictun")

budget = [("app>cl", sc.get("RcvbufErrors", 0))]
own = sc.get("RcvbufErrors", 0)
if tunnel:
    quic_lost = total(mc, "quictun_quic_packets_lost_total")
    sv_relayed = total(ms, "udp_packets_total", 'direction="upstream"')
    sv_dropped = total(ms, "udp_drops_total")
    # approximate: the link also drops ACK-only packets, which QUIC does not count as lost
    sv_in = int(max(0, quic_lost - link_drop))
    sv_dgram = int(max(0, total(mc, "udp_packets_total", 'direction="upstream"') - max(quic_lost, link_drop) - sv_relayed - sv_dropped))
    budget += [("cl-drop", drops(mc)), ("link", link_drop), ("sv-in", sv_in), ("sv-dgram", sv_dgram), ("sv-drop", drops(ms))]
    # the server's write_error drops are the test's last packets, after iperf3 closed its socket (sv-closed)
    own += int(total(mc, "udp_drops_total") + sv_in + sv_dgram + sv_dropped - total(ms, "udp_drops_total", "write_error"))
else:
    budget += [("link", link_drop)]
budget += [("sv-host", ss.get("RcvbufErrors", 0))]
if ss.get("NoPorts", 0):
    budget += [("sv-closed", ss["NoPorts"])]
# per packet that reached the link (drops before it would lower the figure)
entered = sent - sc.get("RcvbufErrors", 0) - (total(mc, "udp_drops_total") if tunnel else 0)
per_packet = link_bytes / entered if entered > 0 else 0
print("  %-20s sent %6d pkts, lost %5d (%.2f %%), jitter %.3f ms, %.1f Mbit/s received" % (
    name, sent, lost, 100.0 * lost / sent if sent else 0, e.get("jitter_ms", 0), rx_bps / 1e6))
print("  %-20s quictun CPU client %.2f s, server %.2f s; link client->server %d packets, %.1f bytes per iperf3 packet on it" % (
    "", cpu_c, cpu_s, link_pkts, per_packet))
print("  %-20s lost where: %s" % ("", "; ".join("%s %s" % kv for kv in budget)))
with open(sys.argv[6], "a") as f:
    f.write(json.dumps({"name": name, "loss": loss, "tunnel": tunnel, "sent": sent, "lost": lost,
                        "jitter": e.get("jitter_ms", 0), "cpu": cpu_c + cpu_s, "per_packet": per_packet,
                        "own": own}) + "\n")
EOF

# summary.py RUNS_JSONL prints each loss rate's figures over its repetitions.
cat >"$work/summary.py" <<'EOF'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("summary (repetitions in order; warm-ups left out):")
print("| link loss | direct: loss | quictun: loss | quictun's own drops | jitter direct / quictun (ms) | quictun CPU, client + server | bytes per packet direct / quictun: overhead |")
print("|---|---|---|---|---|---|---|")
overheads = []
for loss in dict.fromkeys(r["loss"] for r in runs):
    d = [r for r in runs if r["loss"] == loss and not r["tunnel"] and "warm-up" not in r["name"]]
    q = [r for r in runs if r["loss"] == loss and r["tunnel"] and "warm-up" not in r["name"]]
    pct = lambda rs: ", ".join("%.2f %%" % (100.0 * r["lost"] / r["sent"]) for r in rs)
    rng = lambda xs, f: (f % min(xs)) if min(xs) == max(xs) else (f + "-" + f) % (min(xs), max(xs))
    if not d or not q:
        continue
    dp, qp = sum(r["per_packet"] for r in d) / len(d), sum(r["per_packet"] for r in q) / len(q)
    overheads.append(qp - dp)
    print("| %s %% | %s | %s | %s | %s / %s | %s s per run | %.1f / %.1f: %.1f B |" % (
        loss, pct(d), pct(q), ", ".join("%d" % r["own"] for r in q),
        rng([r["jitter"] for r in d], "%.2f"), rng([r["jitter"] for r in q], "%.2f"),
        rng([r["cpu"] for r in q], "%.1f"), dp, qp, qp - dp))
new = [r for r in runs if ", new" in r["name"]]
for r in new:
    print("new connection (%s, link loss %s %%): lost %d of %d (%.2f %%), the tunnel's own drops %d" % (
        r["name"], r["loss"], r["lost"], r["sent"], 100.0 * r["lost"] / r["sent"], r["own"]))
if overheads:
    print("per-packet overhead (quictun's link bytes per iperf3 packet less direct's, mean over loss rates): %.1f B" % (
        sum(overheads) / len(overheads)))
EOF

# trace samples the client's congestion controller and both daemons'
# counters every TRACE seconds until killed.
trace() {
  local t0
  t0=$(date +%s.%N)
  while :; do
    ip netns exec $CNS curl -fsS http://127.0.0.1:8087/metrics 2>/dev/null | awk -v t="$(date +%s.%N)" -v t0="$t0" '
      /^quictun_quic_pacing_rate_bytes_per_second/ {pr=$2}
      /^quictun_quic_bandwidth_estimate_bytes_per_second/ {bw=$2}
      /^quictun_quic_congestion_window_bytes/ {cw=$2}
      /^quictun_quic_inflight_cap_bytes/ {cap=$2}
      /^quictun_quic_congestion_state/ && $2 == 1 {match($0, /state="[a-z_]+"/); st=substr($0, RSTART+7, RLENGTH-8)}
      /^quictun_client_udp_drops_total/ {d+=$2}
      /^quictun_client_udp_packets_total.*upstream/ {u+=$2}
      END {printf "    t=%5.2fs %-9s pacing %6.1f Mbit/s, bw %6.1f Mbit/s, cwnd %7d B, cap %7d B; client sent %7d, dropped %6d; ",
        t-t0, st, pr*8/1e6, bw*8/1e6, cw, cap, u, d}'
    ip netns exec $SNS curl -fsS http://127.0.0.1:8086/metrics 2>/dev/null | awk '
      /^quictun_server_udp_drops_total/ {d+=$2}
      /^quictun_server_udp_packets_total.*upstream/ {u+=$2}
      END {printf "server relayed %7d, dropped %6d\n", u, d}'
    sleep "$TRACE"
  done
}

# gaps N stops the daemon GAP names for GAP's seconds once a second, N times.
gaps() {
  local pid=$cpid
  [ "${GAP%%:*}" = server ] && pid=$spid
  for _ in $(seq "$1"); do
    sleep 0.5
    kill -STOP "$pid"
    sleep "${GAP#*:}"
    kill -CONT "$pid"
    sleep 0.4
  done
}

run() { # name loss host port duration [again]
  local tpid='' gpid=''
  rm -rf "$work/before" "$work/after"
  snapshot "$work/before"
  if [[ $1 == quictun* ]]; then
    if [ "$TRACE" != 0 ]; then trace >"$work/trace" & tpid=$!; fi
    if [ -n "$GAP" ]; then gaps "$5" & gpid=$!; fi
  fi
  ip netns exec $CNS iperf3 -u -c "$3" -p "$4" -b "$RATE" -l "$LEN" -t "$5" --json >"$work/iperf3.json" || true
  if [ -n "$tpid" ]; then kill "$tpid"; wait "$tpid" 2>/dev/null || true; fi
  if [ -n "$gpid" ]; then wait "$gpid" || true; fi
  snapshot "$work/after"
  if ! python3 "$work/account.py" "$1" "$2" "$work/iperf3.json" "$work/before" "$work/after" "$work/runs.jsonl"; then
    # iperf3 itself failed (its control connection times out now and then
    # at 5 % loss, direct as well): once more
    [ "${6:-}" = again ] || run "$1 (again)" "$2" "$3" "$4" "$5" again
  fi
  if [ -n "$tpid" ]; then cat "$work/trace"; fi
}

echo "iperf3 -u -b $RATE -l $LEN -t $DURATION over 12.5 ms one-way, 100 Mbit/s (linkem); REPS=$REPS WARMUP=${WARMUP}s${GAP:+ GAP=$GAP}"
echo "$("$BIN/quictun-client" version 2>/dev/null | head -1); $(nproc) CPUs, load average at the start $(cut -d' ' -f1-3 /proc/loadavg)"
first=1
for loss in $LOSSES; do
  "$BIN/linkem" ctl --prefix $P set --loss "$loss%" >/dev/null
  echo "loss $loss %:"
  new=''
  [ $first = 1 ] && new=', new'
  if [ "$WARMUP" != 0 ]; then
    run "quictun warm-up$new" "$loss" 127.0.0.1 5202 "$WARMUP"
    first=0 new=''
  fi
  for rep in $(seq "$REPS"); do
    run "direct #$rep" "$loss" $SERVER_IP 5201 "$DURATION"
    run "quictun #$rep$new" "$loss" 127.0.0.1 5202 "$DURATION"
    first=0 new=''
  done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$work/summary.py" "$work/runs.jsonl"
echo "counters at the end:"
ip netns exec $CNS curl -fsS http://127.0.0.1:8087/metrics | grep -E '^quictun_client_udp_(packets|drops)_total' | grep -v ' 0$' || true
ip netns exec $SNS curl -fsS http://127.0.0.1:8086/metrics | grep -E '^quictun_server_udp_(packets|drops)_total' | grep -v ' 0$' || true
