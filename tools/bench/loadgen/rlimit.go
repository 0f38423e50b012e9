package loadgen

import (
	"fmt"
	"syscall"
)

// fdsWanted is the file descriptors a run of n clients may hold: each
// client has its UDP socket and, once it has probed a new path, a spare one
// (client/rescue.go); tunnel clients a forward listener and a connection or
// two; plus the load generator's own. fdsNeeded leaves out the spares.
func fdsWanted(clients, tunnels int) uint64 { return uint64(2*clients + 3*tunnels + 512) }

func fdsNeeded(clients, tunnels int) uint64 { return uint64(clients + 3*tunnels + 512) }

// raiseNoFile raises this process's RLIMIT_NOFILE toward fdsWanted (Go
// raises the soft limit to the hard one at start; the hard limit needs
// CAP_SYS_RESOURCE). Short of fdsNeeded it fails; between the two it
// returns a note: clients that rescue a path may find no socket for it
// (their rescue counts as an error). The server it starts gets the limit Go
// restores for children: it holds one socket.
func raiseNoFile(clients, tunnels int) (note string, err error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return "", fmt.Errorf("read RLIMIT_NOFILE: %w", err)
	}
	want, need := fdsWanted(clients, tunnels), fdsNeeded(clients, tunnels)
	if lim.Cur >= want {
		return "", nil
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: max(lim.Max, want)}); err == nil {
		return "", nil
	}
	// No privilege for the hard limit: as high as it allows.
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim.Max, Max: lim.Max})
	if lim.Max < need {
		return "", fmt.Errorf("%d clients need %d file descriptors, the hard limit is %d and raising it failed: run as root or raise ulimit -Hn", clients, need, lim.Max)
	}
	return fmt.Sprintf("file descriptors: limit %d, under the %d that %d clients with a rescue socket each would hold (CAP_SYS_RESOURCE missing): a rescue finding none counts as an error", lim.Max, want, clients), nil
}
