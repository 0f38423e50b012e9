package integration

import (
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// memInUse is heap plus goroutine stacks after a GC.
func memInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

// openIdle opens n connections to addr, does one small round trip on each and leaves them open.
func openIdle(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	buf := make([]byte, 16)
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		_, err = c.Write(buf)
		require.NoError(t, err)
		_, err = io.ReadFull(c, buf)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	return conns
}

// TestIdleTunnelMemory measures (and logs) the memory an idle tunneled
// connection costs, client and server together, beyond a direct connection.
func TestIdleTunnelMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("QUICTUN_IDLE_CONNS")); err == nil && v > 0 {
		n = v // e.g. 10000: needs ulimit -n above 3*n
	}
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})

	base := memInUse()
	direct := openIdle(t, echo, n)
	afterDirect := memInUse()
	for _, c := range direct {
		_ = c.Close()
	}
	require.Eventually(t, func() bool { return memInUse() < afterDirect }, 5*time.Second, 50*time.Millisecond)

	base2 := memInUse()
	tunneled := openIdle(t, cl.Addr, n)
	require.Eventually(t, func() bool { return srv.Server.Registry().Len() == n }, 10*time.Second, 10*time.Millisecond)
	afterTunnel := memInUse()
	perDirect := float64(afterDirect-base) / float64(n)
	perTunnel := float64(afterTunnel-base2) / float64(n)
	t.Logf("idle connections: direct %.1f KiB each; through the tunnel %.1f KiB each, i.e. %.1f KiB for client and server together",
		perDirect/1024, perTunnel/1024, (perTunnel-perDirect)/1024)
	for _, c := range tunneled {
		_ = c.Close()
	}
	require.Eventually(t, func() bool { return srv.Server.Registry().Len() == 0 }, 10*time.Second, 10*time.Millisecond)
}
