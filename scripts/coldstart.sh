#!/bin/bash
# Cold start on the emulated WAN link (root; tools/linkem): start quictun-client and connect
# an application at once, with and without --session-file; prints the first-packet latency
# next to a direct TCP connection. NOFILE_REPS / REPS set the repetitions. Uses netns prefix qx.
set -u
B=${BIN:-$(cd "$(dirname "$0")/.." && pwd)/bin}; P=qx; W=$(mktemp -d)
$B/linkem up --prefix $P --control $W/ctl.sock ${LINK:---delay 12.5ms} --timeout 300s > $W/linkem.log 2>&1 &
LP=$!
trap 'kill $(jobs -p) 2>/dev/null; wait; rm -rf $W' EXIT
sleep 2
head -c 32 /dev/urandom | base64 > $W/secret
ip netns exec $P-s $B/latency-client serve --listen 127.0.0.1:15676 > $W/echo.log 2>&1 &
S1=$!
FP=$($B/quictun-server fingerprint --state-dir $W/st)
ip netns exec $P-s $B/quictun-server --listen-on 198.18.0.2:7500 --state-dir $W/st --secret-file $W/secret --allow tcp:127.0.0.1:15676 > $W/srv.log 2>&1 &
S2=$!
sleep 0.5
cold() { # $1 = extra client args
  ip netns exec $P-c $B/quictun-client --listen-on tcp:127.0.0.1:6501 --server-endpoint 198.18.0.2:7500 --server-fingerprint $FP --secret-file $W/secret --token-source tcp:127.0.0.1:15676 --httpd-listen-on 127.0.0.1:8087 $1 > $W/cli.log 2>&1 &
  C=$!
  for i in $(seq 1 400); do
    out=$(ip netns exec $P-c $B/latency-client --server-host 127.0.0.1 --server-port 6501 --number 1 --timeout 5s 2>&1) && break
    sleep 0.005
  done
  echo "$out" | grep -E "First packet|Connect" | tr '\n' ' '
  ip netns exec $P-c curl -s 127.0.0.1:8087/metrics | grep -E '^quictun_client_dials_total' | tr '\n' ' '; echo
  kill $C; wait $C 2>/dev/null
}
ip netns exec $P-s $B/latency-client serve --listen 198.18.0.2:15677 > /dev/null 2>&1 & S3=$!
sleep 0.3
ip netns exec $P-c $B/latency-client --server-host 198.18.0.2 --server-port 15677 --number 1 2>&1 | grep -E "First|Connect" | tr '\n' ' '; echo " (direct, new TCP connection)"
for r in $(seq 1 ${NOFILE_REPS:-3}); do
  echo -n "no session file:   "; cold ""
done
cold "--session-file $W/sess.json" > /dev/null
for r in $(seq 1 ${REPS:-3}); do
  echo -n "with session file: "; cold "--session-file $W/sess.json"
done
kill $S1 $S2 $S3; sleep 0.3
