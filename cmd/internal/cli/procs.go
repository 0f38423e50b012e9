package cli

import (
	"os"
	"runtime"
)

// DefaultProcs is how many Ps (GOMAXPROCS) a daemon runs with when the
// GOMAXPROCS environment variable is not set: half the CPUs Go would use
// (it already counts a container's CPU limit), at least one.
//
// Why half: a tunnel daemon shares its host with what it serves (the
// application beside the client, the destinations beside the server), and a
// message crosses three goroutines in each daemon. With a P per CPU the
// runtime wakes an idle thread on another CPU at each hand-off, which finds
// the work already taken and sleeps again. Measured on a 2-CPU host
// (bench loopback and the emulated LAN link, GOMAXPROCS 1 against 2): 30-45 %
// fewer thread wake-ups per round trip, 10-25 % less CPU per request,
// loopback bulk +30 % and LAN ping-pong 5-14 % faster, echo TPS +10 %.
// A server with many busy clients on a host of its own may want every CPU:
// set GOMAXPROCS.
func DefaultProcs(cpus int) int { return max(1, cpus/2) }

// SetDefaultProcs sets GOMAXPROCS to DefaultProcs unless the environment
// sets it. Each daemon's app.Run (what its main runs) calls it first: it
// changes the whole process, so the commands tests run in-process do not.
func SetDefaultProcs() {
	if _, ok := os.LookupEnv("GOMAXPROCS"); !ok {
		runtime.GOMAXPROCS(DefaultProcs(runtime.GOMAXPROCS(0)))
	}
}

// procsInForce returns GOMAXPROCS and whether the environment set it.
func procsInForce() (procs int, fromEnv bool) {
	_, fromEnv = os.LookupEnv("GOMAXPROCS")
	return runtime.GOMAXPROCS(0), fromEnv
}
