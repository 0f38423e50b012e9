//go:build !linux

package hostcheck

import (
	"fmt"
	"runtime"
)

// BufferCheck says whether Run checks the UDP socket buffer limits (and so
// replaces quic-go's own warning about them): only on Linux.
const BufferCheck = false

// platformChecks names, in one finding, the Linux-only features this build
// runs without, so an operator knows from the first log lines.
func platformChecks(Options) []Finding {
	missing := "UDP GSO and GRO (batched sends and receives: bulk throughput is lower), " +
		"socket buffers past the system limit (SO_RCVBUFFORCE), the route-MTU check"
	if runtime.GOOS == "windows" {
		missing += ", reload on SIGHUP (restart the daemon to reload)"
	}
	return []Finding{{
		Check:    "platform",
		Severity: Info,
		Detail:   fmt.Sprintf("Linux-only features are off on %s/%s: %s", runtime.GOOS, runtime.GOARCH, missing),
	}}
}

func routeMTU(uintptr, bool) (int, error) { return 0, errNoRouteMTU }
