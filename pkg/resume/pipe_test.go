package resume

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil/tcptest"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/splice"
)

// fakeStream is one end of an in-memory stream pair with QUIC's error
// semantics: CancelWrite and CancelRead reach the peer as its
// *quic.StreamError (Remote), kill fails both ends as a lost connection.
type fakeStream struct {
	r    *io.PipeReader // what the peer writes
	w    *io.PipeWriter // what we write
	dead atomic.Bool    // writes fail as on a lost connection (killLocal)
}

func streamPair() (a, b *fakeStream) {
	ar, bw := io.Pipe()
	br, aw := io.Pipe()
	return &fakeStream{r: ar, w: aw}, &fakeStream{r: br, w: bw}
}

var errIdle = &quic.IdleTimeoutError{}

func (s *fakeStream) Read(p []byte) (int, error) { return s.r.Read(p) }

func (s *fakeStream) Write(p []byte) (int, error) {
	if s.dead.Load() {
		return 0, errIdle
	}
	n, err := s.w.Write(p)
	if se := (*quic.StreamError)(nil); errors.As(err, &se) && !se.Remote {
		// The peer's CancelRead: STOP_SENDING reaches us as its error.
		return n, &quic.StreamError{ErrorCode: se.ErrorCode, Remote: true}
	}
	return n, err
}

func (s *fakeStream) Close() error { return s.w.Close() }

func (s *fakeStream) CancelRead(c quic.StreamErrorCode) {
	_ = s.r.CloseWithError(&quic.StreamError{ErrorCode: c})
}

// CancelWrite resets the stream; on a dead connection (killLocal) the
// reset never reaches the peer.
func (s *fakeStream) CancelWrite(c quic.StreamErrorCode) {
	if !s.dead.Load() {
		_ = s.w.CloseWithError(&quic.StreamError{ErrorCode: c, Remote: true})
	}
}

// kill loses the connection under both ends.
func kill(a, b *fakeStream) {
	for _, s := range []*fakeStream{a, b} {
		_ = s.r.CloseWithError(errIdle)
		_ = s.w.CloseWithError(errIdle)
	}
}

// killLocal makes s see its connection lost while its peer does not (yet).
func killLocal(s *fakeStream) {
	s.dead.Store(true)
	_ = s.r.CloseWithError(errIdle)
}

type countEvents struct{ parked, resumed, resent, noWait, gaveUp atomic.Int64 }

func (e *countEvents) TunnelParked() { e.parked.Add(1) }
func (e *countEvents) TunnelResumed(n int64, _, noWait bool) {
	e.resumed.Add(1)
	e.resent.Add(n)
	if noWait {
		e.noWait.Add(1)
	}
}
func (e *countEvents) TunnelGaveUp(reason string) { e.gaveUp.Add(1) }
func (e *countEvents) ResumeRefused(string)       {}

// tunnel is a resumable tunnel between two applications: cli and srv are
// its Pipes, appC and appS the applications' sockets.
type tunnel struct {
	cli, srv   *Pipe
	appC, appS *net.TCPConn
	events     *countEvents
	ended      chan error // each Pipe's OnEnd
}

func newTunnel(t *testing.T, cfg Config) *tunnel {
	t.Helper()
	tu := &tunnel{events: &countEvents{}, ended: make(chan error, 2)}
	cfg.Events = tu.events
	cfg.OnEnd = func(err error) { tu.ended <- err }
	if cfg.Window == 0 {
		cfg.Window = time.Minute
	}
	appC, c := tcptest.Pair(t)
	s, appS := tcptest.Pair(t)
	tu.appC, tu.appS = appC, appS
	tu.cli, tu.srv = NewPipe(c, cfg), NewPipe(s, cfg)
	return tu
}

// attach runs both Pipes on a new stream pair, as a re-attachment does
// when resumed (the server replies with its offset first); it returns
// the pair and each Serve's result.
func (tu *tunnel) attach(conn any, resumed bool) (a, b *fakeStream, cliErr, srvErr chan error) {
	a, b = streamPair()
	cliErr, srvErr = make(chan error, 1), make(chan error, 1)
	if !resumed {
		go func() { cliErr <- tu.cli.Serve(&Attachment{Stream: a, Conn: conn}) }()
		go func() { srvErr <- tu.srv.Serve(&Attachment{Stream: b, Conn: conn}) }()
		return a, b, cliErr, srvErr
	}
	recv := tu.cli.Received()
	go func() { srvErr <- tu.srv.Serve(&Attachment{Stream: b, PeerOffset: recv, Reply: true, Conn: conn}) }()
	go func() {
		off, err := ReadReply(a)
		if err != nil {
			cliErr <- err
			return
		}
		cliErr <- tu.cli.Serve(&Attachment{Stream: a, PeerOffset: off, Conn: conn})
	}()
	return a, b, cliErr, srvErr
}

// acker confirms both ways every millisecond, as the ack datagrams do,
// until stop is called.
func (tu *tunnel) acker(conn *atomic.Value) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			c := conn.Load()
			_ = tu.cli.Ack(tu.srv.Received(), c)
			_ = tu.srv.Ack(tu.cli.Received(), c)
		}
	})
	return func() { close(done); wg.Wait() }
}

// transfer sends n random bytes from w to r (then FIN) and returns the
// SHA-256 of what was sent and of what arrived.
func transfer(w, r *net.TCPConn, n int) (sent, got chan [32]byte) {
	sent, got = make(chan [32]byte, 1), make(chan [32]byte, 1)
	go func() {
		h := sha256.New()
		buf := make([]byte, 16<<10)
		for left := n; left > 0; {
			k := min(left, len(buf))
			_, _ = rand.Read(buf[:k])
			h.Write(buf[:k])
			if _, err := w.Write(buf[:k]); err != nil {
				break
			}
			left -= k
		}
		_ = w.CloseWrite()
		sent <- [32]byte(h.Sum(nil))
	}()
	go func() {
		h := sha256.New()
		_, _ = io.Copy(h, r)
		got <- [32]byte(h.Sum(nil))
	}()
	return sent, got
}

func recvErr(t *testing.T, ch chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("timed out")
		return nil
	}
}

// TestPipeSurvivesLostConnection: bytes both ways arrive whole and in
// order (SHA-256) across two lost connections, with acks keeping each
// direction's buffer under its cap of 64 KiB while 4 MiB move.
func TestPipeSurvivesLostConnection(t *testing.T) {
	t.Parallel()
	const n = 4 << 20
	tu := newTunnel(t, Config{Cap: 2 * ChunkSize})
	var conn atomic.Value
	conn.Store(1)
	stopAck := tu.acker(&conn)
	defer stopAck()
	up, upGot := transfer(tu.appC, tu.appS, n)
	down, downGot := transfer(tu.appS, tu.appC, n)
	a, b, cliErr, srvErr := tu.attach(1, false)
	var maxHeld atomic.Int64
	for i, at := range []uint64{n / 4, n / 2} {
		require.Eventually(t, func() bool {
			maxHeld.Store(max(maxHeld.Load(), int64(tu.cli.Held()), int64(tu.srv.Held())))
			return tu.cli.Received() > at && tu.srv.Received() > at
		}, 30*time.Second, time.Millisecond)
		kill(a, b)
		require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
		require.ErrorIs(t, recvErr(t, srvErr), ErrParked)
		conn.Store(i + 2)
		a, b, cliErr, srvErr = tu.attach(i+2, true)
	}
	require.NoError(t, recvErr(t, cliErr))
	require.NoError(t, recvErr(t, srvErr))
	assert.Equal(t, <-up, <-upGot, "client to server")
	assert.Equal(t, <-down, <-downGot, "server to client")
	require.NoError(t, recvErr(t, tu.ended))
	require.NoError(t, recvErr(t, tu.ended))
	assert.Equal(t, int64(4), tu.events.parked.Load())
	assert.Equal(t, int64(4), tu.events.resumed.Load())
	assert.LessOrEqual(t, maxHeld.Load(), int64(2*ChunkSize), "a direction's buffer stays within its cap")
	t.Logf("resent %d bytes over 2 resumptions", tu.events.resent.Load())
}

// TestPipeTakeover: a re-attachment that arrives while the server still
// runs the tunnel on the old stream (it has not seen the connection die)
// stops that one, which returns ErrTakenOver; no byte is lost or doubled.
func TestPipeTakeover(t *testing.T) {
	t.Parallel()
	const n = 1 << 20
	tu := newTunnel(t, Config{Cap: 4 << 20})
	a, _, cliErr, srvErr := tu.attach(1, false)
	up, upGot := transfer(tu.appC, tu.appS, n)
	require.Eventually(t, func() bool { return tu.srv.Received() > n/4 }, 30*time.Second, time.Millisecond)
	killLocal(a) // only the client sees its connection die
	require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
	_, _, cliErr2, srvErr2 := tu.attach(2, true)
	require.ErrorIs(t, recvErr(t, srvErr), ErrTakenOver)
	_ = tu.appS.CloseWrite()
	require.NoError(t, recvErr(t, cliErr2))
	require.NoError(t, recvErr(t, srvErr2))
	assert.Equal(t, <-up, <-upGot)
}

// TestPipeWindowPasses: a tunnel not re-attached within its window resets
// the application's connection and ends with GaveUpWindow; a later Serve
// is refused (ErrEnded) and holds nothing.
func TestPipeWindowPasses(t *testing.T) {
	t.Parallel()
	tu := newTunnel(t, Config{Window: 50 * time.Millisecond})
	a, b, cliErr, srvErr := tu.attach(1, false)
	kill(a, b)
	require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
	require.ErrorIs(t, recvErr(t, srvErr), ErrParked)
	for range 2 {
		var g *GaveUpError
		require.ErrorAs(t, recvErr(t, tu.ended), &g)
		assert.Equal(t, GaveUpWindow, g.Reason)
	}
	_, err := tu.appC.Read(make([]byte, 1))
	require.ErrorIs(t, err, syscall.ECONNRESET, "the application sees a reset, as without resumption")
	assert.Equal(t, int64(2), tu.events.gaveUp.Load())
	c, _ := streamPair()
	require.ErrorIs(t, tu.cli.Serve(&Attachment{Stream: c}), ErrEnded)
}

// TestPipePeerReset: the peer's reset is not a lost connection: the
// tunnel ends with the peer's code at once.
func TestPipePeerReset(t *testing.T) {
	t.Parallel()
	tu := newTunnel(t, Config{})
	_, b, cliErr, srvErr := tu.attach(1, false)
	_, err := tu.appC.Write([]byte{1})
	require.NoError(t, err)
	_, err = io.ReadFull(tu.appS, make([]byte, 1)) // the tunnel runs
	require.NoError(t, err)
	tu.srv.Abort(proto.CodeRefused)
	var ab *splice.AbortedError
	require.ErrorAs(t, recvErr(t, cliErr), &ab)
	assert.Equal(t, proto.CodeRefused, ab.Code)
	require.ErrorAs(t, recvErr(t, srvErr), &ab)
	_ = b
	recvErr(t, tu.ended)
	recvErr(t, tu.ended)
	assert.Zero(t, tu.events.parked.Load())
}

// TestPipeBadOffset: a peer that reports an offset ahead of what was sent
// (or behind what it confirmed) cannot resume: the tunnel ends.
func TestPipeBadOffset(t *testing.T) {
	t.Parallel()
	tu := newTunnel(t, Config{})
	a, b, cliErr, srvErr := tu.attach(1, false)
	kill(a, b)
	require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
	require.ErrorIs(t, recvErr(t, srvErr), ErrParked)
	c, _ := streamPair()
	var g *GaveUpError
	require.ErrorAs(t, tu.srv.Serve(&Attachment{Stream: c, PeerOffset: 1 << 30, Reply: true}), &g)
	assert.Equal(t, GaveUpOffset, g.Reason)
	tu.cli.Abort(proto.CodeConnReset)
	recvErr(t, tu.ended)
	recvErr(t, tu.ended)
}

// parkConfirmed runs tu on a first stream, writes msg from the client's
// application, waits until the server confirmed it (the client's buffer
// empty) and loses the connection: both Pipes park. It returns the offset
// the server confirmed.
func parkConfirmed(t *testing.T, tu *tunnel, msg string) uint64 {
	t.Helper()
	var conn atomic.Value
	conn.Store(1)
	stopAck := tu.acker(&conn)
	a, b, cliErr, srvErr := tu.attach(1, false)
	_, err := tu.appC.Write([]byte(msg))
	require.NoError(t, err)
	_, err = io.ReadFull(tu.appS, make([]byte, len(msg)))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return tu.cli.Held() == 0 }, 30*time.Second, time.Millisecond, "the server confirms")
	stopAck()
	kill(a, b)
	require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
	require.ErrorIs(t, recvErr(t, srvErr), ErrParked)
	off, all := tu.cli.Confirmed()
	require.True(t, all, "every byte sent was confirmed")
	require.Equal(t, uint64(len(msg)), off)
	return off
}

// TestPipeAwaitReply: a client re-attachment that does not wait for the
// reply (AwaitReply) writes at once and reads the reply first; a refusal
// or another offset than the one confirmed ends the tunnel (the
// application's connection reset), a stream lost before the reply parks
// it again with ErrNoReply. The peer here is the raw stream.
func TestPipeAwaitReply(t *testing.T) {
	t.Parallel()
	serve := func(t *testing.T) (tu *tunnel, b *fakeStream, cliErr chan error) {
		tu = newTunnel(t, Config{})
		t.Cleanup(func() {
			tu.cli.Abort(proto.CodeConnReset)
			tu.srv.Abort(proto.CodeConnReset)
			recvErr(t, tu.ended)
			recvErr(t, tu.ended)
		})
		off := parkConfirmed(t, tu, "ping")
		a, b := streamPair()
		cliErr = make(chan error, 1)
		go func() { cliErr <- tu.cli.Serve(&Attachment{Stream: a, PeerOffset: off, AwaitReply: true, Conn: 2}) }()
		_, err := tu.appC.Write([]byte("more"))
		require.NoError(t, err)
		got := make([]byte, 4)
		_, err = io.ReadFull(b, got) // no reply was written
		require.NoError(t, err)
		require.Equal(t, "more", string(got), "written before the reply")
		return tu, b, cliErr
	}
	gaveUp := func(t *testing.T, tu *tunnel, err error, reason string) {
		t.Helper()
		var g *GaveUpError
		require.ErrorAs(t, err, &g)
		assert.Equal(t, reason, g.Reason)
		_ = tu.appC.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, rerr := tu.appC.Read(make([]byte, 1))
		require.ErrorIs(t, rerr, syscall.ECONNRESET, "the application's connection is reset")
		assert.Equal(t, int64(1), tu.events.gaveUp.Load())
		assert.Zero(t, tu.events.resumed.Load())
	}

	t.Run("reply", func(t *testing.T) {
		t.Parallel()
		tu, b, cliErr := serve(t)
		_, err := b.Write(append(AppendReply(nil, 4), "pong"...))
		require.NoError(t, err)
		got := make([]byte, 4)
		_, err = io.ReadFull(tu.appC, got)
		require.NoError(t, err)
		assert.Equal(t, "pong", string(got), "the reply is not the application's")
		require.Eventually(t, func() bool { return tu.events.resumed.Load() == 1 }, 10*time.Second, time.Millisecond)
		assert.Equal(t, int64(1), tu.events.noWait.Load())
		kill(b, b)
		require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		tu, b, cliErr := serve(t)
		b.CancelWrite(proto.CodeResumeRefused.StreamErrorCode())
		b.CancelRead(proto.CodeResumeRefused.StreamErrorCode())
		gaveUp(t, tu, recvErr(t, cliErr), GaveUpRefused)
	})
	t.Run("another offset", func(t *testing.T) {
		t.Parallel()
		tu, b, cliErr := serve(t)
		_, err := b.Write(AppendReply(nil, 2))
		require.NoError(t, err)
		gaveUp(t, tu, recvErr(t, cliErr), GaveUpOffset)
		_, err = io.ReadAll(b)
		code, ok := proto.FromError(err)
		require.True(t, ok, "the peer's stream is reset: %v", err)
		assert.Equal(t, proto.CodeConnReset, code)
	})
	t.Run("lost before the reply", func(t *testing.T) {
		t.Parallel()
		tu, b, cliErr := serve(t)
		parked := tu.events.parked.Load()
		tu.cli.mu.Lock()
		until := tu.cli.parkedUntil
		tu.cli.mu.Unlock()
		kill(b, b)
		err := recvErr(t, cliErr)
		require.ErrorIs(t, err, ErrParked)
		require.ErrorIs(t, err, ErrNoReply)
		assert.Equal(t, parked, tu.events.parked.Load(), "not counted parked again")
		tu.cli.mu.Lock()
		assert.Equal(t, until, tu.cli.parkedUntil, "it waits within the window it was parked for, not a new one")
		tu.cli.mu.Unlock()
		_, all := tu.cli.out.Confirmed()
		assert.False(t, all, "bytes were sent that the peer did not confirm")
	})
}

// TestPipeLingersUntilConfirmed: an end whose both directions ended keeps
// the tunnel until the peer confirms its last bytes; when the connection
// dies first it parks (a response written just before a blackout is not
// lost), and both ends finish on the next stream. Each end also sends its
// final count at once.
func TestPipeLingersUntilConfirmed(t *testing.T) {
	t.Parallel()
	tu := newTunnel(t, Config{ID: ID{9}})
	var finals atomic.Int64
	send := func(b []byte) error {
		require.NoError(t, ParseAcks(b, func(a Ack) { assert.Equal(t, ID{9}, a.ID) }))
		finals.Add(1)
		return nil
	}
	a, b := streamPair()
	connDone := make(chan struct{}) // the connection's context
	cliErr, srvErr := make(chan error, 1), make(chan error, 1)
	go func() { cliErr <- tu.cli.Serve(&Attachment{Stream: a, Conn: 1, SendAck: send, Done: connDone}) }()
	go func() { srvErr <- tu.srv.Serve(&Attachment{Stream: b, Conn: 1, SendAck: send, Done: connDone}) }()
	_, err := tu.appC.Write([]byte("request"))
	require.NoError(t, err)
	require.NoError(t, tu.appC.CloseWrite())
	req, err := io.ReadAll(tu.appS)
	require.NoError(t, err)
	assert.Equal(t, "request", string(req))
	_, err = tu.appS.Write([]byte("response"))
	require.NoError(t, err)
	require.NoError(t, tu.appS.CloseWrite())
	got, err := io.ReadAll(tu.appC)
	require.NoError(t, err)
	assert.Equal(t, "response", string(got))
	require.Eventually(t, func() bool { return finals.Load() == 4 }, 10*time.Second, time.Millisecond, "two final acks from each end")
	select {
	case err := <-srvErr:
		t.Fatalf("the server ended before the client confirmed its bytes: %v", err)
	case err := <-cliErr:
		t.Fatalf("the client ended before the server confirmed its bytes: %v", err)
	default:
	}
	kill(a, b)
	close(connDone)
	require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
	require.ErrorIs(t, recvErr(t, srvErr), ErrParked)
	_, _, cliErr, srvErr = tu.attach(2, true)
	require.NoError(t, recvErr(t, cliErr))
	require.NoError(t, recvErr(t, srvErr))
	require.NoError(t, recvErr(t, tu.ended))
	require.NoError(t, recvErr(t, tu.ended))
}

// TestPipeAbortDuringTakeover: an abort racing a re-attachment ends the
// tunnel exactly once, whichever Serve sees it (either may take over the
// other); both Serves return.
func TestPipeAbortDuringTakeover(t *testing.T) {
	t.Parallel()
	for range 50 {
		tu := newTunnel(t, Config{})
		a, _ := streamPair()
		first := make(chan error, 1)
		go func() { first <- tu.cli.Serve(&Attachment{Stream: a, Conn: 1}) }()
		c, _ := streamPair()
		second := make(chan error, 1)
		go func() { second <- tu.cli.Serve(&Attachment{Stream: c, Conn: 2}) }()
		go tu.cli.Abort(proto.CodeShutdown)
		taken := 0
		for _, err := range []error{recvErr(t, first), recvErr(t, second)} {
			require.NotErrorIs(t, err, ErrParked)
			if errors.Is(err, ErrTakenOver) {
				taken++
			}
		}
		require.LessOrEqual(t, taken, 1, "one of them sees the abort")
		select {
		case <-tu.cli.Ended():
		case <-time.After(10 * time.Second):
			t.Fatal("an aborted tunnel must end")
		}
		require.Len(t, tu.ended, 1, "OnEnd once")
		<-tu.ended
		tu.srv.Abort(0)
		recvErr(t, tu.ended)
	}
}

// TestPipeParksWhileApplicationNotReading (found by the bench's resume
// scenario): the server's application is not reading (its socket buffers
// are full: it waits to write its own answer, as an echo does) when the
// connection dies. The server's Pipe, blocked writing to it, must still
// notice the loss and park, counting only the bytes the application took;
// after the re-attachment the application reads again and every byte
// arrives once, in order (SHA-256). Before, that write was never
// interrupted: the tunnel never parked and its re-attachment waited forever.
func TestPipeParksWhileApplicationNotReading(t *testing.T) {
	t.Parallel()
	const n = 16 << 20 // far more than the loopback socket's buffers
	tu := newTunnel(t, Config{Cap: 4 << 20})
	var conn atomic.Value
	conn.Store(1)
	stopAck := tu.acker(&conn)
	defer stopAck()
	sent := make(chan [32]byte, 1)
	go func() {
		h := sha256.New()
		buf := make([]byte, 64<<10)
		for left := n; left > 0; left -= len(buf) {
			_, _ = rand.Read(buf)
			h.Write(buf)
			if _, err := tu.appC.Write(buf); err != nil {
				break
			}
		}
		_ = tu.appC.CloseWrite()
		sent <- [32]byte(h.Sum(nil))
	}()
	reading := make(chan struct{})
	got := make(chan [32]byte, 1)
	go func() {
		<-reading
		h := sha256.New()
		_, _ = io.Copy(h, tu.appS)
		_ = tu.appS.CloseWrite() // the answer: none
		got <- [32]byte(h.Sum(nil))
	}()
	serve := func(p *Pipe, att *Attachment, errc chan error) { errc <- p.Serve(att) }
	a, b := streamPair()
	lost := make(chan struct{}) // the connection's end, as Attachment.Done
	cliErr, srvErr := make(chan error, 1), make(chan error, 1)
	go serve(tu.cli, &Attachment{Stream: a, Conn: 1, Done: lost}, cliErr)
	go serve(tu.srv, &Attachment{Stream: b, Conn: 1, Done: lost}, srvErr)
	// The server's Pipe is stuck writing to its application.
	var last uint64
	require.Eventually(t, func() bool {
		r := tu.srv.Received()
		stuck := r > 0 && r == last
		last = r
		return stuck
	}, 30*time.Second, 100*time.Millisecond, "the server's application stops reading")
	kill(a, b)
	close(lost)
	require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
	require.ErrorIs(t, recvErr(t, srvErr), ErrParked, "parked although its application was not reading")
	conn.Store(2)
	close(reading)
	_, _, cliErr, srvErr = tu.attach(2, true)
	require.NoError(t, recvErr(t, cliErr))
	require.NoError(t, recvErr(t, srvErr))
	assert.Equal(t, <-sent, <-got, "every byte once and in order")
}

// TestWrittenNotSentTwice: bytes the caller wrote on the first stream
// before the Pipe (Config.Written: a proxy request's pipelined bytes, a
// tunnel's 0-RTT bytes) reach the destination once: the first
// attachment goes on after them, and a re-attachment resends them only
// if the peer did not get them.
func TestWrittenNotSentTwice(t *testing.T) {
	t.Parallel()
	written := []byte("written before the pipe, ")
	appC, c := tcptest.Pair(t)
	s, appS := tcptest.Pair(t)
	cli := NewPipe(c, Config{Window: time.Minute, Written: written})
	srv := NewPipe(s, Config{Window: time.Minute})
	a, b := streamPair()
	cliErr, srvErr := make(chan error, 1), make(chan error, 1)
	go func() { srvErr <- srv.Serve(&Attachment{Stream: b, Conn: 1}) }()
	_, err := a.Write(written) // as the caller did, with the header, before the Pipe runs
	require.NoError(t, err)
	go func() { cliErr <- cli.Serve(&Attachment{Stream: a, Conn: 1}) }()
	var conn atomic.Value
	conn.Store(1)
	tu := &tunnel{cli: cli, srv: srv}
	defer tu.acker(&conn)()

	_, err = appC.Write([]byte("then the application's"))
	require.NoError(t, err)
	require.NoError(t, appC.CloseWrite())
	require.NoError(t, appS.CloseWrite())
	got, err := io.ReadAll(appS)
	require.NoError(t, err)
	assert.Equal(t, "written before the pipe, then the application's", string(got))
	_, _ = io.ReadAll(appC)
	require.NoError(t, <-cliErr)
	require.NoError(t, <-srvErr)
}

// TestServeGoroutines: an attachment runs on the goroutine that called
// Serve and one more (the stream's writer, which then watches for
// interruptAppWrites): a re-attachment of many tunnels starts one
// goroutine each besides its caller's, not two. It counts the goroutines
// Pipe's methods started (by their "created by" frame), so that others'
// (earlier tests' ending) do not count.
func TestServeGoroutines(t *testing.T) {
	tu := newTunnel(t, Config{})
	a, b, cliErr, srvErr := tu.attach(1, false)
	started := func() int {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		return strings.Count(string(buf), "created by github.com/quictun/quictun/pkg/resume.(*Pipe).")
	}
	// One writer for each end's attachment.
	require.Eventually(t, func() bool { return started() >= 2 }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, 2, started(), "goroutines Pipe started for two running attachments")
	kill(a, b)
	require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
	require.ErrorIs(t, recvErr(t, srvErr), ErrParked)
	tu.cli.Abort(proto.CodeConnReset)
	tu.srv.Abort(proto.CodeConnReset)
	recvErr(t, tu.ended)
	recvErr(t, tu.ended)
}
