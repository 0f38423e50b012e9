package cli

import (
	"os"
	"runtime"
)

// procsInForce returns GOMAXPROCS and whether the environment set it. The
// daemons leave it to Go: without GOMAXPROCS in the environment it is the
// CPUs the process may use, lowered to a container's CPU limit (and
// following changes of that limit). The "Starting" line logs it beside
// GODEBUG, the runtime settings an operator may give (docs/tuning.md).
func procsInForce() (procs int, fromEnv bool) {
	_, fromEnv = os.LookupEnv("GOMAXPROCS")
	return runtime.GOMAXPROCS(0), fromEnv
}
