package splice_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quictun/quictun/internal/testutil/quictest"
	"github.com/quictun/quictun/internal/testutil/tcptest"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/splice"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testTimeout = 20 * time.Second

// streamPair opens a stream from cli and accepts it on srv; one byte is sent
// first so that the peer sees the stream. Both ends are ready for use.
func streamPair(tb testing.TB, cli, srv *quic.Conn) (a, b *quic.Stream) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	a, err := cli.OpenStreamSync(ctx)
	require.NoError(tb, err)
	_, err = a.Write([]byte{'x'})
	require.NoError(tb, err)
	b, err = srv.AcceptStream(ctx)
	require.NoError(tb, err)
	one := make([]byte, 1)
	_, err = io.ReadFull(b, one)
	require.NoError(tb, err)
	return a, b
}

// fixture is a running Pipe between tcp (its TCP side: the test holds app, the
// other end) and a QUIC stream whose other end is peer.
type fixture struct {
	pipe   *splice.Pipe
	app    *net.TCPConn
	peer   *quic.Stream
	done   chan error
	writes atomic.Int64
	reads  atomic.Int64
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	cli, srv := quictest.Pair(t)
	pipeStr, peer := streamPair(t, cli, srv)
	app, pipeConn := tcptest.Pair(t)
	f := &fixture{pipe: splice.New(pipeConn, pipeStr), app: app, peer: peer, done: make(chan error, 1)}
	f.pipe.AfterWrite = func() { f.writes.Add(1) }
	f.pipe.AfterRead = func() { f.reads.Add(1) }
	go func() { f.done <- f.pipe.Run() }()
	t.Cleanup(func() {
		f.pipe.Abort(proto.CodeShutdown) // no-op if Run already ended
		select {
		case <-f.done:
		case <-time.After(testTimeout):
			t.Error("Run did not return")
		}
	})
	return f
}

// wait returns Run's result, failing the test if it takes longer than d.
func (f *fixture) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-f.done:
		f.done <- err // keep it for Cleanup
		return err
	case <-time.After(d):
		t.Fatalf("Run did not return within %s", d)
		return nil
	}
}

// readAllHash reads r to EOF and returns the SHA-256 and length.
func readAllHash(r io.Reader) ([32]byte, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum, n, err
}

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

func TestPipeCopiesBothWaysWithIntegrity(t *testing.T) {
	t.Parallel()
	const size = 3 << 20
	f := newFixture(t)
	up, down := randomBytes(t, size), randomBytes(t, size+12345)

	type result struct {
		sum [32]byte
		n   int64
		err error
	}
	upRes, downRes := make(chan result, 1), make(chan result, 1)
	go func() { s, n, err := readAllHash(f.peer); upRes <- result{s, n, err} }()
	go func() { s, n, err := readAllHash(f.app); downRes <- result{s, n, err} }()
	writeErr := make(chan error, 2)
	go func() {
		_, err := f.app.Write(up)
		if err == nil {
			err = f.app.CloseWrite()
		}
		writeErr <- err
	}()
	go func() {
		_, err := f.peer.Write(down)
		if err == nil {
			err = f.peer.Close()
		}
		writeErr <- err
	}()
	for range 2 {
		select {
		case err := <-writeErr:
			require.NoError(t, err)
		case <-time.After(testTimeout):
			t.Fatal("write timed out")
		}
	}
	for _, c := range []struct {
		name string
		ch   chan result
		want []byte
	}{{"upstream", upRes, up}, {"downstream", downRes, down}} {
		select {
		case r := <-c.ch:
			require.NoError(t, r.err, c.name)
			assert.Equal(t, int64(len(c.want)), r.n, c.name)
			assert.Equal(t, sha256.Sum256(c.want), r.sum, "%s: SHA-256 differs", c.name)
		case <-time.After(testTimeout):
			t.Fatalf("%s: read timed out", c.name)
		}
	}
	require.NoError(t, f.wait(t, testTimeout), "both directions ended with EOF")
	assert.Equal(t, int64(len(up)), f.pipe.ToStream.Load())
	assert.Equal(t, int64(len(down)), f.pipe.FromStream.Load())
	// Each read is at most BufferSize, and AfterWrite follows every stream write.
	assert.GreaterOrEqual(t, f.writes.Load(), int64(len(up)/splice.BufferSize), "AfterWrite after every write")
	assert.GreaterOrEqual(t, f.reads.Load(), int64(len(down)/splice.BufferSize), "AfterRead after every read with data")
}

func TestPipeHalfClose(t *testing.T) {
	t.Parallel()
	msg := []byte("still flowing after the other side finished")

	t.Run("tcp EOF first", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		_, err := f.app.Write([]byte("hello"))
		require.NoError(t, err)
		require.NoError(t, f.app.CloseWrite())
		got, err := io.ReadAll(f.peer) // the stream FIN arrives as EOF
		require.NoError(t, err)
		assert.Equal(t, "hello", string(got))

		// The other direction still flows.
		_, err = f.peer.Write(msg)
		require.NoError(t, err)
		buf := make([]byte, len(msg))
		require.NoError(t, f.app.SetReadDeadline(time.Now().Add(testTimeout)))
		_, err = io.ReadFull(f.app, buf)
		require.NoError(t, err)
		assert.Equal(t, msg, buf)
		select {
		case err := <-f.done:
			t.Fatalf("Run returned while a direction was open: %v", err)
		default:
		}

		require.NoError(t, f.peer.Close())
		n, err := f.app.Read(buf)
		assert.Zero(t, n)
		require.ErrorIs(t, err, io.EOF, "stream FIN becomes TCP FIN")
		require.NoError(t, f.wait(t, testTimeout))
		assert.Equal(t, int64(5), f.pipe.ToStream.Load())
		assert.Equal(t, int64(len(msg)), f.pipe.FromStream.Load())
	})

	t.Run("stream EOF first", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		_, err := f.peer.Write([]byte("bye"))
		require.NoError(t, err)
		require.NoError(t, f.peer.Close())
		require.NoError(t, f.app.SetReadDeadline(time.Now().Add(testTimeout)))
		got, err := io.ReadAll(f.app)
		require.NoError(t, err)
		assert.Equal(t, "bye", string(got))

		_, err = f.app.Write(msg)
		require.NoError(t, err)
		buf := make([]byte, len(msg))
		require.NoError(t, f.peer.SetReadDeadline(time.Now().Add(testTimeout)))
		_, err = io.ReadFull(f.peer, buf)
		require.NoError(t, err)
		assert.Equal(t, msg, buf)

		require.NoError(t, f.app.CloseWrite())
		n, err := f.peer.Read(buf)
		assert.Zero(t, n)
		require.ErrorIs(t, err, io.EOF)
		require.NoError(t, f.wait(t, testTimeout))
		assert.Equal(t, int64(len(msg)), f.pipe.ToStream.Load())
		assert.Equal(t, int64(3), f.pipe.FromStream.Load())
	})
}

// streamErrorCode reads from s until it fails and returns the stream error.
func readStreamError(t *testing.T, s *quic.Stream) *quic.StreamError {
	t.Helper()
	require.NoError(t, s.SetReadDeadline(time.Now().Add(testTimeout)))
	_, err := io.Copy(io.Discard, s)
	require.Error(t, err, "want a stream reset, got a clean EOF")
	var se *quic.StreamError
	require.ErrorAs(t, err, &se)
	return se
}

func TestPipeTCPResetResetsStream(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, err := f.app.Write([]byte("some data"))
	require.NoError(t, err)
	buf := make([]byte, 9)
	_, err = io.ReadFull(f.peer, buf)
	require.NoError(t, err)

	require.NoError(t, f.app.SetLinger(0))
	require.NoError(t, f.app.Close()) // RST

	se := readStreamError(t, f.peer)
	assert.Equal(t, proto.CodeConnReset.StreamErrorCode(), se.ErrorCode)
	assert.True(t, se.Remote)
	code, ok := proto.FromError(se)
	assert.True(t, ok)
	assert.Equal(t, proto.CodeConnReset, code)

	err = f.wait(t, testTimeout)
	var ae *splice.AbortedError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, proto.CodeConnReset, ae.Code)
	assert.ErrorIs(t, err, syscall.ECONNRESET, "the cause is kept")
}

func TestPipeStreamResetResetsTCP(t *testing.T) {
	t.Parallel()
	for _, code := range []proto.Code{proto.CodeShutdown, proto.CodeTimeout, proto.CodeInternal} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.peer.CancelWrite(code.StreamErrorCode())

			require.NoError(t, f.app.SetReadDeadline(time.Now().Add(testTimeout)))
			_, err := io.Copy(io.Discard, f.app)
			require.Error(t, err, "want a TCP reset, got a clean EOF")
			assert.ErrorIs(t, err, syscall.ECONNRESET)

			err = f.wait(t, testTimeout)
			var ae *splice.AbortedError
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, code, ae.Code, "the peer's code is passed on")

			// The pipe also stops the peer's reading side with the code.
			se := readStreamError(t, f.peer)
			assert.Equal(t, code.StreamErrorCode(), se.ErrorCode)
		})
	}
}

func TestPipeAbort(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// Traffic in flight both ways does not delay the abort.
	_, err := f.app.Write([]byte("in flight"))
	require.NoError(t, err)

	start := time.Now()
	go f.pipe.Abort(proto.CodeShutdown)
	err = f.wait(t, 5*time.Second)
	assert.Less(t, time.Since(start), 5*time.Second)

	var ae *splice.AbortedError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, proto.CodeShutdown, ae.Code)
	assert.ErrorIs(t, err, splice.ErrAborted)
	assert.Contains(t, err.Error(), "shutdown")

	// A second Abort with another code changes nothing.
	f.pipe.Abort(proto.CodeInternal)
	require.ErrorAs(t, f.wait(t, time.Second), &ae)
	assert.Equal(t, proto.CodeShutdown, ae.Code)

	require.NoError(t, f.app.SetReadDeadline(time.Now().Add(testTimeout)))
	_, err = io.Copy(io.Discard, f.app)
	assert.ErrorIs(t, err, syscall.ECONNRESET, "aborted TCP side is reset, not closed")

	// The peer gets the code; it may first read the bytes already sent.
	se := readStreamError(t, f.peer)
	assert.Equal(t, proto.CodeShutdown.StreamErrorCode(), se.ErrorCode)
}

func TestAbortedErrorUnwrap(t *testing.T) {
	t.Parallel()
	cause := errors.New("boom")
	err := error(&splice.AbortedError{Code: proto.CodeDialFailed, Cause: cause})
	assert.ErrorIs(t, err, cause)
	assert.Contains(t, err.Error(), "dial_failed")
	assert.Contains(t, err.Error(), "boom")
}

// BenchmarkPipe measures loopback throughput TCP -> Pipe -> QUIC stream.
func BenchmarkPipe(b *testing.B) {
	cli, srv := quictest.Pair(b)
	pipeStr, peer := streamPair(b, cli, srv)
	app, pipeConn := tcptest.Pair(b)
	p := splice.New(pipeConn, pipeStr)
	done := make(chan error, 1)
	go func() { done <- p.Run() }()

	chunk := make([]byte, 64<<10)
	total := int64(b.N) * int64(len(chunk))
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	got := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(io.Discard, peer)
		got <- n
	}()
	b.ResetTimer()
	for range b.N {
		if _, err := app.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	if err := app.CloseWrite(); err != nil {
		b.Fatal(err)
	}
	if n := <-got; n != total {
		b.Fatalf("peer read %d bytes, want %d", n, total)
	}
	b.StopTimer()
	_ = peer.Close()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

func TestPipePeerStopSending(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.peer.CancelRead(proto.CodeTimeout.StreamErrorCode()) // STOP_SENDING

	// The pipe notices on its next write to the stream after STOP_SENDING
	// arrived, so keep writing until the TCP side fails.
	stop := make(chan struct{})
	writeErr := make(chan error, 1)
	go func() {
		for range 500 {
			if _, err := f.app.Write([]byte("data the peer no longer wants")); err != nil {
				writeErr <- err
				return
			}
			select {
			case <-stop:
				writeErr <- nil
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		writeErr <- errors.New("the pipe never failed")
	}()
	err := f.wait(t, testTimeout)
	close(stop)
	var ae *splice.AbortedError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, proto.CodeTimeout, ae.Code, "the peer's STOP_SENDING code is passed on")

	// The TCP side is reset: the writer or a read reports it (Linux reports a
	// reset once, to whichever call comes first).
	werr := <-writeErr
	if werr == nil {
		require.NoError(t, f.app.SetReadDeadline(time.Now().Add(testTimeout)))
		_, werr = io.Copy(io.Discard, f.app)
	}
	assert.True(t, errors.Is(werr, syscall.ECONNRESET) || errors.Is(werr, syscall.EPIPE), "want a reset, got %v", werr)
}

func TestPipeAbortBeforeRun(t *testing.T) {
	t.Parallel()
	cli, srv := quictest.Pair(t)
	pipeStr, peer := streamPair(t, cli, srv)
	app, pipeConn := tcptest.Pair(t)
	p := splice.New(pipeConn, pipeStr)
	p.Abort(proto.CodeRefused)
	done := make(chan error, 1)
	go func() { done <- p.Run() }()
	select {
	case err := <-done:
		var ae *splice.AbortedError
		require.ErrorAs(t, err, &ae)
		assert.Equal(t, proto.CodeRefused, ae.Code)
	case <-time.After(testTimeout):
		t.Fatal("Run of an aborted pipe did not return")
	}
	require.NoError(t, app.SetReadDeadline(time.Now().Add(testTimeout)))
	_, err := io.Copy(io.Discard, app)
	assert.ErrorIs(t, err, syscall.ECONNRESET)
	se := readStreamError(t, peer)
	assert.Equal(t, proto.CodeRefused.StreamErrorCode(), se.ErrorCode)
}

func TestPipeManyConcurrent(t *testing.T) {
	t.Parallel()
	// Many pipes over one QUIC connection, each echoing through its own TCP
	// pair, to exercise stream multiplexing and the shared buffer pool.
	cli, srv := quictest.Pair(t)
	const n = 16
	errs := make(chan error, n)
	for i := range n {
		pipeStr, peer := streamPair(t, cli, srv)
		app, pipeConn := tcptest.Pair(t)
		p := splice.New(pipeConn, pipeStr)
		done := make(chan error, 1)
		go func() { done <- p.Run() }()
		go func() {
			msg := bytes.Repeat([]byte{byte(i)}, 100<<10)
			go func() {
				_, _ = peer.Write(msg)
				_ = peer.Close()
			}()
			got, err := io.ReadAll(app)
			if err == nil && !bytes.Equal(got, msg) {
				err = fmt.Errorf("pipe %d: got %d bytes, corrupted", i, len(got))
			}
			if err == nil {
				err = app.CloseWrite()
			}
			if err == nil {
				_, err = io.Copy(io.Discard, peer)
			}
			if err == nil {
				err = <-done
			}
			errs <- err
		}()
	}
	for range n {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-time.After(testTimeout):
			t.Fatal("timed out")
		}
	}
}

func TestPipeEOFAfterPeerStopSending(t *testing.T) {
	t.Parallel()
	cli, srv := quictest.Pair(t)
	pipeStr, peer := streamPair(t, cli, srv)
	app, pipeConn := tcptest.Pair(t)
	p := splice.New(pipeConn, pipeStr)
	r := runPipe(t, p)

	peer.CancelRead(proto.CodeTimeout.StreamErrorCode())
	select {
	case <-pipeStr.Context().Done(): // STOP_SENDING arrived
	case <-time.After(testTimeout):
		t.Fatal("STOP_SENDING not received")
	}
	require.NoError(t, app.CloseWrite())

	// Downstream data still flows, or at least the peer's code is reported.
	_, err := peer.Write([]byte("downstream"))
	require.NoError(t, err)
	require.NoError(t, peer.Close())
	require.NoError(t, app.SetReadDeadline(time.Now().Add(testTimeout)))
	got, rerr := io.ReadAll(app)
	err = waitRun(t, r)
	var ae *splice.AbortedError
	if errors.As(err, &ae) {
		assert.Equal(t, proto.CodeTimeout, ae.Code, "the peer's code, not internal")
		return
	}
	require.NoError(t, rerr)
	assert.Equal(t, "downstream", string(got))
}
