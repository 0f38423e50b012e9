# bench-env.sh, sourced by the scripts that run quictun's daemons (or tools/floortun) to measure
# or show them (demo.sh, udp-bench.sh, and through emulated-tunnel.sh profile-lan.sh,
# first-packet.sh, floor-lan.sh). It sets:
#   bench_env          what to add to the daemons' environment (env "${bench_env[@]}" DAEMON ...):
#                      nothing, unless BENCH_RUNTIME_ENV is set. The daemons run with the environment
#                      the user has (Go's defaults unless GOMAXPROCS/GODEBUG are set), as a user who
#                      starts the binaries does (issue 32). A tuned run is asked for by name, e.g.
#                      BENCH_RUNTIME_ENV='GOMAXPROCS=1 GODEBUG=schedtrace=2147483647' (what every
#                      figure before issue 32 was silently measured with; tools/bench: --runtime-env),
#                      and is announced on stderr.
#   bench_pin_client   taskset prefix for the client side (client daemon, load generator): CPUs
#   bench_pin_server   0..n/2-1 and n/2..n-1, e.g. "${bench_pin_client[@]}" env ... DAEMON; empty
#                      with BENCH_PIN=0, on one CPU or without taskset (tools/bench: --pin).
#   bench_describe     prints both settings (for a script's header).
bench_env=()
if [ -n "${BENCH_RUNTIME_ENV:-}" ]; then
  for bench_kv in $BENCH_RUNTIME_ENV; do
    case $bench_kv in
      [A-Za-z_]*=*) bench_env+=("$bench_kv") ;;
      *) echo "BENCH_RUNTIME_ENV: \"$bench_kv\" is not NAME=VALUE" >&2; exit 2 ;;
    esac
  done
  echo "bench-env: tuned run, the daemons get ${bench_env[*]} added (BENCH_RUNTIME_ENV)" >&2
fi
bench_pin_client=()
bench_pin_server=()
bench_ncpu=$(nproc)
if [ "${BENCH_PIN:-1}" != 0 ] && [ "$bench_ncpu" -ge 2 ] && command -v taskset >/dev/null; then
  bench_half=$((bench_ncpu / 2))
  if [ "$bench_half" -eq 1 ]; then bench_pin_client=(taskset -c 0); else bench_pin_client=(taskset -c "0-$((bench_half - 1))"); fi
  if [ $((bench_ncpu - bench_half)) -eq 1 ]; then bench_pin_server=(taskset -c "$bench_half"); else bench_pin_server=(taskset -c "$bench_half-$((bench_ncpu - 1))"); fi
fi
bench_describe() {
  if [ ${#bench_env[@]} -gt 0 ]; then
    echo "runtime env added to the daemons: ${bench_env[*]} (BENCH_RUNTIME_ENV)"
  else
    echo "runtime env added to the daemons: none (Go's defaults unless set)"
  fi
  if [ ${#bench_pin_client[@]} -gt 0 ]; then
    echo "CPU pinning: client side (client daemon, load) ${bench_pin_client[*]}, server side (server daemon, echo server) ${bench_pin_server[*]} (BENCH_PIN=0: off)"
  else
    echo "CPU pinning: off"
  fi
}
