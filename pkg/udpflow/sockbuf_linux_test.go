package udpflow_test

import (
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/udpflow"
)

// socketBuffers returns c's receive and send buffers as the kernel reports
// them (Linux doubles what was asked for, for its bookkeeping).
func socketBuffers(t *testing.T, c *net.UDPConn) (rcv, snd int) {
	t.Helper()
	raw, err := c.SyscallConn()
	require.NoError(t, err)
	var err1, err2 error
	require.NoError(t, raw.Control(func(fd uintptr) {
		rcv, err1 = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
		snd, err2 = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
	}))
	require.NoError(t, err1)
	require.NoError(t, err2)
	return rcv, snd
}

// sysctl reads an integer from /proc/sys.
func sysctl(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(name, ".", "/"))
	if err != nil {
		t.Skipf("no %s here: %v", name, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	return n
}

func TestSetSocketBuffers(t *testing.T) {
	t.Parallel()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, udpflow.SetSocketBuffers(c))
	rcv, snd := socketBuffers(t, c)
	// The kernel grants up to its caps and reports twice that.
	require.Equal(t, 2*min(udpflow.SocketBuffer, sysctl(t, "net.core.rmem_max")), rcv)
	require.Equal(t, 2*min(udpflow.SocketBuffer, sysctl(t, "net.core.wmem_max")), snd)
}
