package cli

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSdNotify: the state reaches $NOTIFY_SOCKET as one datagram; without
// the variable nothing is sent and nothing fails.
func TestSdNotify(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	require.NoError(t, SdNotify("READY=1"), "no socket: nothing to do")

	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	require.NoError(t, err)
	defer c.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	require.NoError(t, SdNotify("MAINPID=42\nREADY=1"))
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "MAINPID=42\nREADY=1", string(buf[:n]))
}
