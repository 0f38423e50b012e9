package server

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"
)

// listenerFile is a duplicate of a new listener's socket at network/addr,
// as an upgrade hands it over; the listener itself is closed (without
// removing a UNIX socket's file, as the old process does).
func listenerFile(t *testing.T, network, addr string) *os.File {
	t.Helper()
	ln, err := net.Listen(network, addr)
	require.NoError(t, err)
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	f, err := ln.(interface{ File() (*os.File, error) }).File()
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	return f
}

// TestInheritedReverseDropped: the reverse forwards' sockets a predecessor
// handed over that no client binds again are closed after the grace (a
// UNIX socket's file removed), and at once when Run ends (stop).
func TestInheritedReverseDropped(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "rev.sock")
	tcp := listenerFile(t, "tcp", "127.0.0.1:0")
	ln, err := net.FileListener(tcp) // only to learn its address
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // the duplicate's own descriptor stays in tcp
	b := &binder{inherited: map[string]*held{"tcp:" + addr: {f: tcp}, "unix:" + sock: {f: listenerFile(t, "unix", sock)}}}
	c, err := net.DialTimeout("tcp", addr, time.Second)
	require.NoError(t, err, "held: a connection waits in the backlog")
	_ = c.Close()
	stop := b.dropInheritedAfter(20*time.Millisecond, klog.Background())
	defer stop()
	require.Eventually(t, func() bool {
		_, err := net.DialTimeout("tcp", addr, time.Second)
		return err != nil
	}, 10*time.Second, 10*time.Millisecond, "closed after the grace")
	_, err = os.Stat(sock)
	assert.ErrorIs(t, err, os.ErrNotExist, "the UNIX socket's file is removed")
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.Empty(t, b.inherited)
}
