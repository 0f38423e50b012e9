package egress_test

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil/quictest"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/proto"
)

// handshaking is an egress.Conn whose handshake completes (or whose
// connection ends) when the test says: a 0-RTT connection as the server
// sees it.
type handshaking struct {
	egress.Conn
	done chan struct{}
	ctx  context.Context
}

func (c *handshaking) HandshakeComplete() <-chan struct{} { return c.done }
func (c *handshaking) Context() context.Context           { return c.ctx }

// TestZeroRTTMadeBeforeRestartIsServed: a 0-RTT header made before the
// server started cannot be checked against its replay cache (a new
// process). It is the client's own when its connection completes the
// handshake (a replayer cannot): it is then served, one round trip late;
// a connection that ends first has it refused as a replay, and a nonce
// seen already refuses it at once. A 0-RTT header made since the start is
// served without waiting. The destination is dialed only for the served ones.
func TestZeroRTTMadeBeforeRestartIsServed(t *testing.T) {
	t.Parallel()
	var dials atomic.Int64
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var echoes sync.WaitGroup
	t.Cleanup(func() { _ = echo.Close(); echoes.Wait() })
	echoes.Go(func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			echoes.Go(func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				_, _ = c.Write(b)
			})
		}
	})
	secret := []byte("the server's secret")
	e := newHandler(t, secret, "tcp:"+echo.Addr().String(), egress.NopEvents{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cli, srv := quictest.Pair(t)

	// tunnel sends header h as a 0-RTT stream on conn and returns what the
	// server answered: the echoed bytes, or the code it reset the stream with.
	type answer struct {
		code proto.Code
		echo string
	}
	tunnel := func(conn egress.Conn, h *proto.Header) <-chan answer {
		out := make(chan answer, 1)
		var served sync.WaitGroup
		t.Cleanup(served.Wait)
		served.Go(func() {
			s, err := srv.AcceptStream(ctx)
			if err != nil {
				return
			}
			e.Serve(ctx, egress.Stream{Conn: conn, Stream: s, Early: true, Conn0: e.NewConn()})
		})
		str, err := cli.OpenStreamSync(ctx)
		require.NoError(t, err)
		b, err := h.Append(nil, secret)
		require.NoError(t, err)
		_, err = str.Write(append(b, "ping"...))
		require.NoError(t, err)
		require.NoError(t, str.Close())
		served.Go(func() {
			if err := proto.ReadReply(str); err != nil {
				code, _ := proto.FromError(err)
				out <- answer{code: code}
				return
			}
			got, _ := io.ReadAll(str)
			out <- answer{echo: string(got)}
		})
		return out
	}
	header := func(at time.Time) *proto.Header {
		h, err := proto.NewHeader("tcp:"+echo.Addr().String(), at)
		require.NoError(t, err)
		return h
	}
	pending := func() *handshaking {
		return &handshaking{Conn: srv, done: make(chan struct{}), ctx: ctx}
	}
	beforeStart := time.Now().Add(-5 * time.Second)

	// Made before the start: held until the handshake completes, then served.
	conn := pending()
	h := header(beforeStart)
	got := tunnel(conn, h)
	select {
	case a := <-got:
		t.Fatalf("answered before the handshake completed: %+v", a)
	case <-time.After(200 * time.Millisecond):
	}
	assert.Zero(t, dials.Load(), "not dialed before the handshake completes")
	close(conn.done)
	assert.Equal(t, answer{echo: "ping"}, <-got)
	assert.Equal(t, int64(1), dials.Load())

	// The same header again (a replay, in a new connection): refused at
	// once, its nonce is recorded.
	assert.Equal(t, answer{code: proto.CodeReplay}, <-tunnel(pending(), h))

	// Made before the start, and the connection ends before its handshake
	// (a replayed flight): refused as a replay.
	conn = pending()
	cctx, end := context.WithCancel(ctx)
	conn.ctx = cctx
	got = tunnel(conn, header(beforeStart))
	time.Sleep(50 * time.Millisecond)
	end()
	assert.Equal(t, answer{code: proto.CodeReplay}, <-got)

	// Made since the start: served at once, the handshake still pending.
	assert.Equal(t, answer{echo: "ping"}, <-tunnel(pending(), header(time.Now().Add(time.Second))))
	assert.Equal(t, int64(2), dials.Load(), "only the served tunnels reach the destination")
}
