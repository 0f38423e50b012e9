package harness

import (
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The daemons' runtime environment (issue 32). The harness starts quictun's
// daemons with the environment it inherited and nothing added: what a user
// who runs the binaries gets (Go's defaults unless the user sets
// GOMAXPROCS or GODEBUG). A tuned environment is never the headline: it is
// a variant of its own, named after its settings (runtimeEnvName), beside
// the untuned one.

// SysmonPolling is a GODEBUG setting that makes Go's system monitor poll
// every 10 ms instead of sleeping while every P is idle (a scheduler trace
// every 24.8 days, whose side effect this is). Every figure before issue 32
// was measured with it and GOMAXPROCS at half the CPUs, added silently.
const SysmonPolling = "schedtrace=2147483647"

// TunedRuntimeEnv is the environment the figures before issue 32 were
// measured with on this 2-core machine, for --runtime-env.
const TunedRuntimeEnv = "GOMAXPROCS=1 GODEBUG=" + SysmonPolling

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ParseRuntimeEnv reads a --runtime-env value: NAME=VALUE settings
// separated by spaces (e.g. TunedRuntimeEnv). An empty value is no tuned
// variant (nil).
func ParseRuntimeEnv(s string) ([]string, error) {
	var out []string
	var errs []error
	for _, kv := range strings.Fields(s) {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || !envNameRE.MatchString(name) {
			errs = append(errs, fmt.Errorf("%q: want NAME=VALUE", kv))
			continue
		}
		out = append(out, kv)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("runtime env %q: %w", s, err)
	}
	return out, nil
}

// runtimeEnvName is the name of the variant base run with env: base
// followed by "-env(" and the settings, comma-separated ("quictun-env(GOMAXPROCS=1,GODEBUG=...)");
// base alone when env is empty. The family (before the first '-') stays
// base's, so --variants quictun selects it too.
func runtimeEnvName(base string, env []string) string {
	if len(env) == 0 {
		return base
	}
	return base + "-env(" + strings.Join(env, ",") + ")"
}

// benchDaemonEnv is the environment the harness adds for a quictun daemon
// (or the floor's: tools/floortun): extra only, nil when it is empty (the
// inherited environment as it is).
func benchDaemonEnv(extra []string) []string {
	if len(extra) == 0 {
		return nil
	}
	return slices.Clone(extra)
}

// inheritedRuntimeEnv describes the Go runtime settings a daemon started
// with env added inherits from environ: "GOMAXPROCS=.. GODEBUG=.." as set,
// or "Go's defaults".
func inheritedRuntimeEnv(environ, env []string) string {
	all := append(slices.Clone(environ), env...)
	var set []string
	for _, name := range []string{"GOMAXPROCS", "GODEBUG", "GOGC", "GOMEMLIMIT"} {
		if v, ok := lookupEnv(all, name); ok {
			set = append(set, name+"="+v)
		}
	}
	if len(set) == 0 {
		return "Go's defaults (no GOMAXPROCS, GODEBUG, GOGC or GOMEMLIMIT set)"
	}
	return strings.Join(set, " ")
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

// CPU pinning (issue 32): where a figure is about the tunnel, not about two
// daemons and the load sharing the cores, each side runs on its own CPUs:
// the client side (the tunnel's client daemon and the load generator) on
// the first half, the server side (the tunnel's server daemon and the
// echo/sink server) on the second half. Processes are started under
// taskset(1), which execs, so every thread of the daemon inherits the
// affinity and its PID is the one the harness records.

// cpuPin holds the CPU lists of the two sides (taskset -c syntax); empty
// lists leave processes unpinned.
type cpuPin struct {
	Client, Server string
}

// Sides of a pinned process.
const (
	sideClient = "client"
	sideServer = "server"
)

// pinPlan chooses the CPU lists for cpus CPUs: with pinning wanted and
// taskset at hand, CPUs [0, cpus/2) for the client side and [cpus/2, cpus)
// for the server side. The description is for the report's header.
func pinPlan(want bool, cpus int, haveTaskset bool) (cpuPin, string) {
	switch {
	case !want:
		return cpuPin{}, "off (--pin=false): the kernel places every process on any CPU"
	case cpus < 2:
		return cpuPin{}, fmt.Sprintf("off: %d CPU", cpus)
	case !haveTaskset:
		return cpuPin{}, "off: taskset(1) not found (util-linux)"
	}
	p := cpuPin{Client: cpuRange(0, cpus/2), Server: cpuRange(cpus/2, cpus)}
	return p, fmt.Sprintf("client side (tunnel client daemon, load generator) on CPU %s, server side (tunnel server daemon, echo/sink/redis server) on CPU %s (taskset)",
		p.Client, p.Server)
}

// cpuRange is [from, to) in taskset -c syntax.
func cpuRange(from, to int) string {
	if to-from == 1 {
		return strconv.Itoa(from)
	}
	return fmt.Sprintf("%d-%d", from, to-1)
}

// hostPinPlan is pinPlan for this host.
func hostPinPlan(want bool, cpus int) (cpuPin, string) {
	_, err := exec.LookPath("taskset")
	return pinPlan(want, cpus, err == nil)
}

// wrap returns bin and args run on side's CPUs (unchanged when that side is
// not pinned).
func (p cpuPin) wrap(side, bin string, args []string) (string, []string) {
	cpus := p.Client
	if side == sideServer {
		cpus = p.Server
	}
	if cpus == "" {
		return bin, args
	}
	return "taskset", append([]string{"-c", cpus, bin}, args...)
}
