package e2e

import (
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// namedEchoServer says name, then echoes: a test can tell which
// destination a tunnel reached.
func namedEchoServer(t *testing.T, name string) string {
	t.Helper()
	return testutil.ServeTCP(t, func(c net.Conn) {
		if _, err := io.WriteString(c, name); err != nil {
			return
		}
		_, _ = io.Copy(c, c)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	})
}

// greeting connects to addr and reads the named echo server's name.
func greeting(t *testing.T, addr string) (*net.TCPConn, string) {
	t.Helper()
	c := dialApp(t, addr)
	_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
	b := make([]byte, 1)
	_, err := io.ReadFull(c, b)
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Time{})
	return c, string(b)
}

// TestClientReloadsTokenFile: the built client with --token-source-plugin
// File reads its token file again on SIGHUP: a new local connection goes to
// the destination the file names now, and a tunnel opened before the
// reload keeps running to the old one.
func TestClientReloadsTokenFile(t *testing.T) {
	checkLeaks(t)
	a, b := namedEchoServer(t, "A"), namedEchoServer(t, "B")
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + a, "tcp:" + b}})
	tokens := writeFile(t, "tokens", "127.0.0.0/8 tcp:"+a+"\n")
	cl := startClient(t, srv, clientOpts{Token: tokens, Args: []string{"--token-source-plugin", "File"}})

	live, name := greeting(t, cl.Addr)
	require.Equal(t, "A", name, "the file names a")
	require.NoError(t, roundTrip(live, "before"))

	require.NoError(t, os.WriteFile(tokens, []byte("127.0.0.0/8 tcp:"+b+"\n"), 0o600))
	cl.signal(t, syscall.SIGHUP)
	waitMetric(t, cl, ioTimeout, eq(1), "quictun_client_config_reloads_total", "result", "success")
	c, name := greeting(t, cl.Addr)
	require.Equal(t, "B", name, "a new local connection goes where the file says now")
	require.NoError(t, roundTrip(c, "to b"))
	require.NoError(t, roundTrip(live, "the open tunnel to a keeps running"))

	// A broken file is refused as a whole; the previous tokens stay.
	require.NoError(t, os.WriteFile(tokens, []byte("not a token line\n"), 0o600))
	cl.signal(t, syscall.SIGHUP)
	waitMetric(t, cl, ioTimeout, eq(1), "quictun_client_config_reloads_total", "result", "failure")
	_, name = greeting(t, cl.Addr)
	require.Equal(t, "B", name)
	require.NoError(t, live.CloseWrite())
	require.NoError(t, c.CloseWrite())
}
