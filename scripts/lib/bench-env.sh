# bench-env.sh, sourced by the scripts that run quictun's daemons (or tools/floortun) to measure
# or show them (demo.sh, udp-bench.sh, and through emulated-tunnel.sh profile-lan.sh,
# first-packet.sh, floor-lan.sh). It sets bench_env, the Go runtime environment to start them
# with (env "${bench_env[@]}" DAEMON ...): the settings every figure in docs/ and bench/reference
# was measured with, which the daemons chose for themselves until issue 22 and now leave to the
# operator (docs/tuning.md); tools/bench gives its daemons the same (harness/daemonenv.go).
#   GOMAXPROCS  half of nproc, at least 1, unless GOMAXPROCS is set (GOMAXPROCS=$(nproc): Go's default)
#   GODEBUG     schedtrace=2147483647 added, unless GODEBUG names schedtrace (schedtrace=0: Go's default)
bench_env=()
if [ -z "${GOMAXPROCS+set}" ]; then
  bench_half=$(($(nproc) / 2))
  bench_env+=("GOMAXPROCS=$((bench_half > 0 ? bench_half : 1))")
fi
case ",${GODEBUG:-}" in
  *,schedtrace=* | *", schedtrace="*) ;;
  *) bench_env+=("GODEBUG=${GODEBUG:+$GODEBUG,}schedtrace=2147483647") ;;
esac
