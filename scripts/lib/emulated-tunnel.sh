# emulated-tunnel.sh, sourced by the scripts that measure quictun on the emulated link
# (profile-lan.sh, first-packet.sh, floor-lan.sh). The caller sets BIN (quictun's daemons), LINKEM
# (tools/linkem's binary), PREFIX and DELAY; this sets CNS, SNS, SERVER_IP, work (a
# temporary directory for state and logs), pids and bench_env (lib/bench-env.sh: the Go
# runtime settings the daemons run with), and on exit stops every process listed in pids
# and removes work.
# shellcheck source=scripts/lib/bench-env.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-env.sh"
CNS=$PREFIX-c SNS=$PREFIX-s SERVER_IP=198.18.0.2
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# emulated_link: the link between the client namespace CNS and the server namespace SNS,
# DELAY each way (and the linkem flags of LINK_ARGS, e.g. --loss 2%); returns once both
# namespaces exist.
emulated_link() {
  # shellcheck disable=SC2086 # LINK_ARGS is a list of flags
  "$LINKEM" up --prefix "$PREFIX" --delay "$DELAY" ${LINK_ARGS:-} >"$work/linkem.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do ip netns exec "$CNS" true 2>/dev/null && ip netns exec "$SNS" true 2>/dev/null && break; sleep 0.1; done
  sleep 1
}

# emulated_tunnel: quictun-server in SNS (QUIC on SERVER_IP:7500, a new state dir and
# secret, then the words of the server_args array) and quictun-client in CNS (admin API on
# 127.0.0.1:8087, then client_args); returns once the client's /readyz answers (at most 10 s).
# Logs: $work/server.log, $work/client.log.
emulated_tunnel() {
  mkdir -m 700 "$work/state"
  (umask 077; head -c 32 /dev/urandom | base64 >"$work/secret")
  local fp
  fp=$("$BIN/quictun-server" fingerprint --state-dir "$work/state")
  ip netns exec "$SNS" "${bench_pin_server[@]}" env "${bench_env[@]}" "$BIN/quictun-server" --listen-on "$SERVER_IP:7500" --state-dir "$work/state" \
    --secret-file "$work/secret" --audit-log=false "${server_args[@]}" >"$work/server.log" 2>&1 &
  pids+=($!)
  ip netns exec "$CNS" "${bench_pin_client[@]}" env "${bench_env[@]}" "$BIN/quictun-client" --server-endpoint "$SERVER_IP:7500" --server-fingerprint "$fp" \
    --secret-file "$work/secret" --httpd-listen-on 127.0.0.1:8087 "${client_args[@]}" >"$work/client.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do ip netns exec "$CNS" curl -fsS http://127.0.0.1:8087/readyz >/dev/null 2>&1 && break; sleep 0.1; done
}

# echo_tunnel: latency-client's echo server in SNS on 0.0.0.0:15676 and emulated_tunnel with a
# forward from the client namespace's 127.0.0.1:6500 to it; SARGS and CARGS are extra
# quictun-server and quictun-client flags.
echo_tunnel() {
  ip netns exec "$SNS" bin/latency-client serve --listen 0.0.0.0:15676 >"$work/echo.log" 2>&1 &
  pids+=($!)
  # shellcheck disable=SC2206 # SARGS and CARGS are lists of flags
  server_args=(--allow tcp:127.0.0.1:15676 ${SARGS:-})
  # shellcheck disable=SC2206
  client_args=(--forward tcp:127.0.0.1:6500=tcp:127.0.0.1:15676 ${CARGS:-})
  emulated_tunnel
}
