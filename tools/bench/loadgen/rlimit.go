package loadgen

import (
	"fmt"
	"syscall"
)

// fdsNeeded is the file descriptors a run of n clients may hold: each client
// has its UDP socket and, once it has probed a new path, a spare one
// (client/rescue.go); tunnel clients a forward listener and a connection or
// two; plus the load generator's own.
func fdsNeeded(clients, tunnels int) uint64 {
	return uint64(2*clients + 3*tunnels + 512)
}

// raiseNoFile raises this process's RLIMIT_NOFILE to need when it is lower
// (Go raises the soft limit to the hard one at start; the hard limit needs
// CAP_SYS_RESOURCE, which a root run has). The server it starts gets the
// limit Go restores for children (the original soft one): it holds one socket.
func raiseNoFile(clients, tunnels int) error {
	need := fdsNeeded(clients, tunnels)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("read RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur >= need {
		return nil
	}
	want := syscall.Rlimit{Cur: need, Max: max(lim.Max, need)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return fmt.Errorf("%d clients need %d file descriptors, the limit is %d (hard %d) and raising it failed (%w): run as root or raise ulimit -n",
			clients, need, lim.Cur, lim.Max, err)
	}
	return nil
}
