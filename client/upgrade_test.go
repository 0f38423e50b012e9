package client

import (
	"context"
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/handover"
)

// TestUpgradeNotServing: a client whose Run is not serving refuses an
// upgrade's requests once their context ends (the upgrader then kills the
// new process): HandOver with handover.ErrNotServing, Import the same, and
// Import lets go of the tunnels' sockets.
func TestUpgradeNotServing(t *testing.T) {
	t.Parallel()
	c := &Client{handovers: make(chan handoverReq), imports: make(chan importReq)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := c.HandOver(ctx, func([]handover.Tunnel) error { t.Error("send called"); return nil })
	require.ErrorIs(t, err, handover.ErrNotServing)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	f, err := ln.(*net.TCPListener).File()
	require.NoError(t, err)
	var tu handover.Tunnel
	tu.Conn = f
	n, err := c.Import(ctx, []handover.Tunnel{tu})
	require.ErrorIs(t, err, handover.ErrNotServing)
	assert.Zero(t, n)
	assert.ErrorIs(t, f.Close(), os.ErrClosed, "Import closed the tunnel's socket")
}
