package ingress

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/pkg/udpflow"
)

type noSessions struct{}

func (noSessions) Wait(context.Context) (*Session, func(), error) {
	return nil, func() {}, errors.New("no session")
}

// waitSessions has no session until ctx ends: a client whose server is
// unreachable.
type waitSessions struct{}

func (waitSessions) Wait(ctx context.Context) (*Session, func(), error) {
	<-ctx.Done()
	return nil, func() {}, ctx.Err()
}

// serveUDP serves a UDP socket on loopback toward udp:127.0.0.1:9 with a
// Handler of maxConns connections over sessions, reporting to ev, until the
// test ends; it returns the socket.
func serveUDP(t *testing.T, maxConns int, sessions Sessions, ev Events) *net.UDPConn {
	t.Helper()
	h, err := New(Config{MaxConnections: maxConns, Events: ev, Registry: tunnel.NewRegistry()},
		Links{Sessions: sessions, Tokens: func() TokenSource { return nil }, Signer: func() *proto.Signer { return nil }})
	require.NoError(t, err)
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var handlers sync.WaitGroup
	handlers.Go(func() { h.ServeUDP(ctx, pc, staticToken("udp:127.0.0.1:9"), &handlers) })
	t.Cleanup(func() { cancel(); _ = pc.Close(); handlers.Wait() })
	return pc
}

// TestUDPQueuesBoundedInBytes (issue 21 item 2): while the server is
// unreachable, each flow queues at most udpflow.DefaultQueueBytes of its
// application's packets, whatever their size; the rest are dropped as
// queue_full. Bounded in packets (512 of up to 64 KiB each), 16 source ports
// took the client from 26 to 391 MB.
func TestUDPQueuesBoundedInBytes(t *testing.T) {
	t.Parallel()
	ev := &recorder{}
	pc := serveUDP(t, 64, waitSessions{}, ev)

	const sources, perSource, size = 16, 40, 60000 // 38 MB in all, 2.4 MB a source
	queued := func() int { return int(ev.queuedBytes()) / (size + 64) }
	dropped := func() int { return ev.dropped(udpflow.DropQueueFull) }
	p := make([]byte, size)
	sent := 0
	for range sources {
		c, err := net.DialUDP("udp", nil, pc.LocalAddr().(*net.UDPAddr))
		require.NoError(t, err)
		defer c.Close()
		for range perSource {
			_, err := c.Write(p)
			require.NoError(t, err)
			sent++
			// One at a time, so the kernel drops none of them.
			require.Eventually(t, func() bool { return queued()+dropped() == sent }, 10*time.Second, time.Millisecond,
				"packet %d: %d queued, %d dropped", sent, queued(), dropped())
		}
	}
	perFlow := udpflow.DefaultQueueBytes / (size + 64)
	assert.Equal(t, sources*perFlow, queued(), "each flow holds what fits in its bytes")
	assert.Equal(t, sent-sources*perFlow, dropped())
}

// TestUDPFlowWithoutSession: a flow that finds no connection to the server
// ends as no_session, and the packets it had queued are dropped as such.
func TestUDPFlowWithoutSession(t *testing.T) {
	t.Parallel()
	ev := &recorder{}
	pc := serveUDP(t, 4, noSessions{}, ev)

	c, err := net.DialUDP("udp", nil, pc.LocalAddr().(*net.UDPAddr))
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("query"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(ev.failedFlows()) > 0 }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, []string{ResultNoSession}, ev.failedFlows())
	require.Eventually(t, func() bool { return ev.dropped(udpflow.DropNoSession) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the flow's queued packet is lost with it")
	assert.Zero(t, ev.queuedBytes(), "and its queue gives its bytes back")
}

type staticToken string

func (s staticToken) Token(context.Context, net.Addr) (string, error) { return string(s), nil }
