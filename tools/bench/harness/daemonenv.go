package harness

import (
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// SysmonPolling is the GODEBUG setting the harness gives quictun's daemons:
// a scheduler trace every 24.8 days, whose side effect is that Go's system
// monitor polls every 10 ms instead of sleeping while every P is idle and
// being woken by the first system call after each idle spell (docs/tuning.md,
// "Tuning": about half the thread wake-ups per ping-pong round trip, ~100
// idle wake-ups a second).
const SysmonPolling = "schedtrace=2147483647"

// daemonEnv returns what to add to the environment inherited for a quictun
// daemon (or the floor's: tools/floortun) that the harness starts: extra,
// with the Go runtime settings every recorded run had, which the daemons
// chose for themselves until issue 22 and now leave to the operator:
// GOMAXPROCS at half of procs (Go's default for this host), at least one,
// and SysmonPolling in GODEBUG, each unless inherited or extra sets it (a
// GODEBUG that does not name schedtrace gets it added; one that does, e.g.
// schedtrace=0, is kept as it is).
func daemonEnv(inherited, extra []string, procs int) []string {
	all := append(slices.Clone(inherited), extra...)
	var out []string
	if _, ok := lookupEnv(all, "GOMAXPROCS"); !ok {
		out = append(out, "GOMAXPROCS="+strconv.Itoa(max(1, procs/2)))
	}
	out = append(out, extra...)
	godebug, _ := lookupEnv(all, "GODEBUG")
	for s := range strings.SplitSeq(godebug, ",") {
		if name, _, _ := strings.Cut(strings.TrimSpace(s), "="); name == "schedtrace" {
			return out
		}
	}
	if godebug != "" {
		godebug += ","
	}
	return append(out, "GODEBUG="+godebug+SysmonPolling)
}

// benchDaemonEnv is daemonEnv for this process's environment and Go's
// default GOMAXPROCS here (the harness does not set its own).
func benchDaemonEnv(extra []string) []string {
	return daemonEnv(os.Environ(), extra, runtime.GOMAXPROCS(0))
}

// lookupEnv returns the value of name in env, the last one if several (as
// os/exec passes it on).
func lookupEnv(env []string, name string) (string, bool) {
	for _, kv := range slices.Backward(env) {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v, true
		}
	}
	return "", false
}
