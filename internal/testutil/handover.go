//go:build unix

package testutil

import (
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/handover"
)

// HandoverPair returns both ends of an upgrade's handover socket pair in
// this process, the child's taken as a new process takes it
// (handover.FromEnv, through the environment: not for parallel tests).
// Both are closed when the test ends. Linux only (handover.Pair).
func HandoverPair(t *testing.T) (parent, child *handover.Conn) {
	t.Helper()
	parent, cf, err := handover.Pair()
	require.NoError(t, err)
	t.Cleanup(func() { _ = parent.Close() })
	// As the child inherits it: a descriptor of its own, named in the
	// environment (cf's own is closed: one owner per descriptor).
	fd, err := syscall.Dup(int(cf.Fd()))
	require.NoError(t, err)
	require.NoError(t, cf.Close())
	t.Setenv(handover.EnvFD, strconv.Itoa(fd))
	child, err = handover.FromEnv()
	require.NoError(t, err)
	t.Cleanup(func() { _ = child.Close() })
	return parent, child
}
