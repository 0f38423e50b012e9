package ingress

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/pkg/udpflow"
)

// rcvbuf is c's receive buffer as the kernel reports it (twice what was
// granted), or -1 if it cannot be read.
func rcvbuf(c *net.UDPConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1
	}
	n := -1
	if raw.Control(func(fd uintptr) {
		if v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF); err == nil {
			n = v
		}
	}) != nil {
		return -1
	}
	return n
}

// TestServeUDPRaisesTheSocketBuffer: the forward's socket is the tunnel's
// first queue; with the kernel's default (about 90 packets of 1200 B) a
// burst while the client is not scheduled overflowed it (iperf3 -u at
// 50 Mbit/s on a busy host, scripts/udp-bench.sh).
func TestServeUDPRaisesTheSocketBuffer(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("/proc/sys/net/core/rmem_max")
	if err != nil {
		t.Skipf("no net.core.rmem_max here: %v", err)
	}
	rmemMax, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	h, err := New(Config{MaxConnections: 1, Events: NopEvents{}, Registry: tunnel.NewRegistry()},
		Links{Sessions: noSessions{}, Tokens: func() TokenSource { return nil }, Signer: func() *proto.Signer { return nil }})
	require.NoError(t, err)
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	before := rcvbuf(pc)
	var handlers sync.WaitGroup
	handlers.Go(func() { h.ServeUDP(context.Background(), pc, nil, &handlers) })
	want := 2 * min(udpflow.SocketBuffer, rmemMax)
	require.Eventually(t, func() bool { return rcvbuf(pc) == want }, 5*time.Second, time.Millisecond,
		"receive buffer %d before, want %d", before, want)
	require.NoError(t, pc.Close())
	handlers.Wait()
}
