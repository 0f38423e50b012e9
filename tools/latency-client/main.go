// Command latency-client measures TCP round-trip latency, throughput and
// connection rate, directly or through a tunnel such as quictun, and runs
// the echo and sink servers it measures against. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

func main() { os.Exit(run()) }

// run executes the command line and returns the process exit code:
// 0 on success, 1 when a run failed or measured an error, 2 for usage errors.
func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, restore default handling: a second SIGINT
	// or SIGTERM ends the process at once instead of waiting for a drain.
	context.AfterFunc(ctx, stop)
	defer klog.Flush()
	return execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
}
