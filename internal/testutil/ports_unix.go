//go:build unix

package testutil

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// heldPorts are the lock files of the ports this process reserved: open
// until it exits, when the kernel releases their locks.
var heldPorts []*os.File

// reservePort reserves port among the test binaries of this machine: go test
// runs several packages' binaries at once, each with its own FreeAddr, and
// one's listener on every address (a reverse forward's tcp:0.0.0.0:PORT)
// takes the port from under another's loopback address. The reservation is
// an exclusive flock on a file named after the port in a directory shared by
// them; false when another process holds it. Without the directory the
// reservation is this process's alone (true). Call it with freeMu held.
func reservePort(port int) bool {
	dir := filepath.Join(os.TempDir(), "quictun-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return false
	}
	heldPorts = append(heldPorts, f)
	return true
}
