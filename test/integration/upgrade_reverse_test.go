package integration

import (
	"context"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/handover"
	"github.com/quictun/quictun/server"
)

// TestServerHandOverReverseForwards (issue 34 part 2: "reverse-forward
// listeners are handed over the same way", in process): server A holds a
// TCP and a UNIX reverse forward's listener for its client; an upgrade
// hands their sockets (Server.ReverseSockets, duplicated) with the UDP
// socket to server B. Between A's exit and the client's new bind on B,
// connections to both addresses are not refused: they wait in the
// sockets' backlogs (the UNIX socket's file stays), and B, taking each
// socket over when the client binds its address again, serves them. Before,
// A closed both listeners (the UNIX one removing its file) and such a
// connection was refused.
func TestServerHandOverReverseForwards(t *testing.T) { // not parallel: it sets the environment (handoverPair)
	echo := testutil.EchoServer(t)
	listen := testutil.FreeAddr(t, "tcp")
	dir := t.TempDir()
	sock := dir + "/rev.sock"
	rules := []string{"tcp:" + listen, "unix:" + dir + "/*"}
	mutate := func(c *server.Config) {
		c.AllowRemoteListen = endpoint.MustParseAllowList(rules...)
		c.Reverse.Events = server.NewReverseMetrics(prometheus.NewRegistry())
		c.DrainTimeout = 0
	}
	a := testutil.StartServer(t, testutil.ServerOptions{Mutate: mutate})
	reverseClient(t, a, "tcp:"+listen+"=tcp:"+echo, "unix:"+sock+"=tcp:"+echo)
	echoCheck(t, dialWhenListening(t, listen), 64<<10)
	var uc net.Conn
	require.Eventually(t, func() bool {
		var err error
		uc, err = net.DialTimeout("unix", sock, time.Second)
		return err == nil
	}, 15*time.Second, 20*time.Millisecond)
	echoCheck(t, uc, 64<<10)

	// The upgrade's listeners: the UDP socket and the reverse forwards'.
	parent, child := handoverPair(t)
	socks := a.ReverseSockets(handover.MaxListeners - 1)
	require.Len(t, socks, 2)
	var ls []handover.Listener
	for name, s := range map[string]any{"udp": a.PacketConn()} {
		socks[name] = s
	}
	for name, s := range socks {
		f, err := s.(interface{ File() (*os.File, error) }).File()
		require.NoError(t, err)
		ls = append(ls, handover.Listener{Name: name, File: f})
	}
	require.NoError(t, parent.SendListeners(ls))
	for _, l := range ls {
		_ = l.File.Close()
	}
	got, err := child.RecvListeners()
	require.NoError(t, err)
	var pcB net.PacketConn
	inherited := map[string]*os.File{}
	for _, l := range got {
		if rest, ok := strings.CutPrefix(l.Name, server.ReverseSocketPrefix); ok {
			inherited[rest] = l.File
			continue
		}
		pcB, err = net.FilePacketConn(l.File)
		require.NoError(t, err)
		_ = l.File.Close()
	}
	require.Len(t, inherited, 2)
	require.NoError(t, a.HandOver(context.Background(), func([]handover.Tunnel) error { return nil }))
	a.Stop(t) // as the old process exits

	// Between the processes: neither address refuses a connection.
	tc, err := net.DialTimeout("tcp", listen, time.Second)
	require.NoError(t, err, "the TCP listener is not closed between the processes")
	defer tc.Close()
	uc2, err := net.DialTimeout("unix", sock, time.Second)
	require.NoError(t, err, "the UNIX socket's file stays between the processes")
	defer uc2.Close()
	for _, c := range []net.Conn{tc, uc2} {
		_, err := c.Write([]byte("ping"))
		require.NoError(t, err)
	}

	testutil.StartServer(t, testutil.ServerOptions{StateDir: a.StateDir, PacketConn: pcB.(*net.UDPConn),
		Mutate: func(c *server.Config) { mutate(c); c.InheritedReverse = inherited }})
	// The client reconnects to B and binds both addresses again: B takes
	// the sockets over and serves what waited in their backlogs.
	for _, c := range []net.Conn{tc, uc2} {
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 4)
		_, err := io.ReadFull(c, buf)
		require.NoError(t, err, "a connection made between the processes is served by the new one")
		assert.Equal(t, "ping", string(buf))
	}
	echoCheck(t, dialWhenListening(t, listen), 64<<10)
}
