package cli

import (
	"os"
	"strings"
)

// SysmonSetting is the GODEBUG setting the daemons run with unless GODEBUG
// names schedtrace itself: a scheduler trace once every 24.8 days, the
// largest period (one "SCHED" line on standard error at start on a host up
// longer than that, then one per period), whose side effect is that Go's
// system monitor never enters its deep sleep.
//
// Why: a daemon is idle between a message and the next. When every P is
// idle the runtime's system monitor (sysmon) sleeps until woken, and the
// first system call after that wakes it (a futex call on the message's
// path), after which it polls every 20 us before sleeping again: two thread
// wake-ups per message in each daemon, for nothing a tunnel needs. With a
// trace period set, sysmon polls every 10 ms instead, idle or not (about
// 100 wake-ups a second). Measured on a 2-CPU host, the same build with and
// without (bench/results/loopback-2026-11-25T014142Z): thread wake-ups per
// ping-pong round trip 7.41 -> 3.40, per redis request 0.41 -> 0.08; the
// daemons' CPU per redis request 27.8 -> 19.8 us (redis 0.32 -> 0.40 of
// direct TCP), per new connection 223 -> 177 us.
const SysmonSetting = "schedtrace=2147483647"

// sysmonEnv returns the environment to re-execute with: env with
// SysmonSetting added to GODEBUG, and false if GODEBUG already names
// schedtrace (the user's setting wins, schedtrace=0 included).
func sysmonEnv(env []string) ([]string, bool) {
	out := make([]string, 0, len(env)+1)
	found := false
	for _, kv := range env {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			out = append(out, kv)
			continue
		}
		for s := range strings.SplitSeq(v, ",") {
			if name, _, _ := strings.Cut(strings.TrimSpace(s), "="); name == "schedtrace" {
				return nil, false
			}
		}
		if !found {
			found = true
			if v != "" {
				v += ","
			}
			out = append(out, "GODEBUG="+v+SysmonSetting)
		}
	}
	if !found {
		out = append(out, "GODEBUG="+SysmonSetting)
	}
	return out, true
}

// KeepSysmonPolling makes the process run with SysmonSetting: GODEBUG is
// read once, as the runtime starts, so it re-executes the program with the
// setting added (same PID, arguments and environment otherwise). It returns
// only when GODEBUG names schedtrace already or the re-execution failed;
// then the process goes on as it is. Only a daemon's main calls it (app.Run),
// never code that tests run in-process.
func KeepSysmonPolling() {
	env, ok := sysmonEnv(os.Environ())
	if !ok {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	_ = reexec(exe, os.Args, env)
}
