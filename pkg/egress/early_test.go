package egress_test

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
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

// earlyAnswer is what the server answered a 0-RTT tunnel: the echoed
// bytes, or the code it reset the stream with.
type earlyAnswer struct {
	code proto.Code
	echo string
}

// earlyFixture serves 0-RTT tunnel streams to an echo server, counting its
// dials.
type earlyFixture struct {
	t      *testing.T
	ctx    context.Context
	e      *egress.Handler
	cli    *quic.Conn
	srv    *quic.Conn
	secret []byte
	echo   string
	dials  atomic.Int64
}

func newEarlyFixture(t *testing.T) *earlyFixture {
	t.Helper()
	f := &earlyFixture{t: t, secret: []byte("the server's secret")}
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f.echo = echo.Addr().String()
	var echoes sync.WaitGroup
	t.Cleanup(func() { _ = echo.Close(); echoes.Wait() })
	echoes.Go(func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			f.dials.Add(1)
			echoes.Go(func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				_, _ = c.Write(b)
			})
		}
	})
	f.e = newHandler(t, f.secret, "tcp:"+f.echo, egress.NopEvents{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	f.ctx = ctx
	f.cli, f.srv = quictest.Pair(t)
	return f
}

// header is a tunnel header to the echo server made at at.
func (f *earlyFixture) header(at time.Time) *proto.Header {
	h, err := proto.NewHeader("tcp:"+f.echo, at)
	require.NoError(f.t, err)
	return h
}

// pending is the server's connection with its handshake not complete.
func (f *earlyFixture) pending() *handshaking {
	return &handshaking{Conn: f.srv, done: make(chan struct{}), ctx: f.ctx}
}

// tunnel sends header h as a 0-RTT stream on conn and returns what the
// server answers.
func (f *earlyFixture) tunnel(conn egress.Conn, h *proto.Header) <-chan earlyAnswer {
	t := f.t
	out := make(chan earlyAnswer, 1)
	var served sync.WaitGroup
	t.Cleanup(served.Wait)
	served.Go(func() {
		s, err := f.srv.AcceptStream(f.ctx)
		if err != nil {
			return
		}
		f.e.Serve(f.ctx, egress.Stream{Conn: conn, Stream: s, Early: true, Conn0: f.e.NewConn()})
	})
	str, err := f.cli.OpenStreamSync(f.ctx)
	require.NoError(t, err)
	b, err := h.Append(nil, f.secret)
	require.NoError(t, err)
	_, err = str.Write(append(b, "ping"...))
	require.NoError(t, err)
	if err := str.Close(); err != nil {
		// A server that refuses at once may have cancelled the stream
		// already; its answer below says what it did.
		require.ErrorContains(t, err, "canceled stream", "only a stream the server already refused fails to close")
	}
	served.Go(func() {
		if err := proto.ReadReply(str); err != nil {
			code, _ := proto.FromError(err)
			out <- earlyAnswer{code: code}
			return
		}
		got, _ := io.ReadAll(str)
		out <- earlyAnswer{echo: string(got)}
	})
	return out
}

// TestZeroRTTMadeBeforeRestartIsServed: a 0-RTT header made before the
// server started cannot be checked against its replay cache (a new
// process). It is the client's own when its connection completes the
// handshake (a replayer cannot): it is then served, one round trip late;
// a connection that ends first has it refused as a replay, and a nonce
// seen already refuses it at once. A 0-RTT header made since the start is
// served without waiting. The destination is dialed only for the served ones.
func TestZeroRTTMadeBeforeRestartIsServed(t *testing.T) {
	t.Parallel()
	f := newEarlyFixture(t)
	beforeStart := time.Now().Add(-5 * time.Second)

	// Made before the start: held until the handshake completes, then served.
	conn := f.pending()
	h := f.header(beforeStart)
	got := f.tunnel(conn, h)
	select {
	case a := <-got:
		t.Fatalf("answered before the handshake completed: %+v", a)
	case <-time.After(200 * time.Millisecond):
	}
	assert.Zero(t, f.dials.Load(), "not dialed before the handshake completes")
	close(conn.done)
	assert.Equal(t, earlyAnswer{echo: "ping"}, <-got)
	assert.Equal(t, int64(1), f.dials.Load())

	// The same header again (a replay, in a new connection): refused at
	// once, its nonce is recorded.
	assert.Equal(t, earlyAnswer{code: proto.CodeReplay}, <-f.tunnel(f.pending(), h))

	// Made before the start, and the connection ends before its handshake
	// (a replayed flight): refused as a replay.
	conn = f.pending()
	cctx, end := context.WithCancel(f.ctx)
	conn.ctx = cctx
	got = f.tunnel(conn, f.header(beforeStart))
	time.Sleep(50 * time.Millisecond)
	end()
	assert.Equal(t, earlyAnswer{code: proto.CodeReplay}, <-got)

	// Made since the start: served at once, the handshake still pending.
	assert.Equal(t, earlyAnswer{echo: "ping"}, <-f.tunnel(f.pending(), f.header(time.Now().Add(time.Second))))
	assert.Equal(t, int64(2), f.dials.Load(), "only the served tunnels reach the destination")
}

// TestStaleZeroRTTRefusedAtOnce (issue 30 L2): a 0-RTT header outside the
// replay window (older than the process too) is refused as a replay at
// once, while its connection's handshake is still pending: it is not held
// for the handshake as a fresh header made before the start is, so a
// replayed flight of any age costs the server no wait.
func TestStaleZeroRTTRefusedAtOnce(t *testing.T) {
	t.Parallel()
	f := newEarlyFixture(t)
	for _, age := range []time.Duration{3 * time.Minute, time.Hour, 30 * 24 * time.Hour} {
		conn := f.pending() // its handshake never completes, its connection does not end
		select {
		case a := <-f.tunnel(conn, f.header(time.Now().Add(-age))):
			assert.Equal(t, earlyAnswer{code: proto.CodeReplay}, a, "made %v ago", age)
		case <-time.After(10 * time.Second):
			t.Fatalf("a 0-RTT header made %v ago is held for the handshake instead of refused", age)
		}
	}
	// Made after the window too (a client clock far ahead).
	assert.Equal(t, earlyAnswer{code: proto.CodeReplay}, <-f.tunnel(f.pending(), f.header(time.Now().Add(time.Hour))))
	// A stale hello, as a tunnel.
	hello, err := proto.NewHello(time.Now().Add(-time.Hour))
	require.NoError(t, err)
	assert.Equal(t, earlyAnswer{code: proto.CodeReplay}, <-f.tunnel(f.pending(), hello))
	assert.Zero(t, f.dials.Load())
}
