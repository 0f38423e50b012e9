package splice_test

import (
	"errors"
	"io"
	"sync"
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

var errCancelled = errors.New("read cancelled")

// fakeStream is a splice.Stream whose failures the test chooses. Reads come
// from pr (the test writes to pw); CancelRead unblocks them.
type fakeStream struct {
	pr *io.PipeReader
	pw *io.PipeWriter

	writeErr error
	closeErr error

	mu          sync.Mutex
	written     []byte
	closed      bool
	cancelRead  []quic.StreamErrorCode
	cancelWrite []quic.StreamErrorCode
}

func newFakeStream() *fakeStream {
	pr, pw := io.Pipe()
	return &fakeStream{pr: pr, pw: pw}
}

func (s *fakeStream) Read(p []byte) (int, error) { return s.pr.Read(p) }

func (s *fakeStream) Write(p []byte) (int, error) {
	if s.writeErr != nil {
		return 0, s.writeErr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.written = append(s.written, p...)
	return len(p), nil
}

func (s *fakeStream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return s.closeErr
}

func (s *fakeStream) CancelRead(c quic.StreamErrorCode) {
	s.mu.Lock()
	s.cancelRead = append(s.cancelRead, c)
	s.mu.Unlock()
	_ = s.pr.CloseWithError(errCancelled)
}

func (s *fakeStream) CancelWrite(c quic.StreamErrorCode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancelWrite = append(s.cancelWrite, c)
}

func (s *fakeStream) codes() (read, write []quic.StreamErrorCode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]quic.StreamErrorCode(nil), s.cancelRead...), append([]quic.StreamErrorCode(nil), s.cancelWrite...)
}

// pipeRun is a Pipe running in the background.
type pipeRun struct {
	finished chan struct{}
	err      error // set before finished is closed
}

func runPipe(t *testing.T, p *splice.Pipe) *pipeRun {
	t.Helper()
	r := &pipeRun{finished: make(chan struct{})}
	go func() {
		defer close(r.finished)
		r.err = p.Run()
	}()
	t.Cleanup(func() {
		p.Abort(proto.CodeShutdown)
		select {
		case <-r.finished:
		case <-time.After(testTimeout):
			t.Error("Run did not return")
		}
	})
	return r
}

func waitRun(t *testing.T, r *pipeRun) error {
	t.Helper()
	select {
	case <-r.finished:
		return r.err
	case <-time.After(testTimeout):
		t.Fatal("Run did not return")
		return nil
	}
}

func TestPipeStreamFailures(t *testing.T) {
	t.Parallel()
	localErr := errors.New("connection closed locally")
	for _, tc := range []struct {
		name string
		// set up the failure on s; trigger it through app (the TCP peer)
		setup    func(s *fakeStream)
		trigger  func(t *testing.T, s *fakeStream, app io.Writer)
		wantCode proto.Code
		wantErr  error
	}{
		{
			name:  "local write error counts as a reset",
			setup: func(s *fakeStream) { s.writeErr = localErr },
			trigger: func(t *testing.T, _ *fakeStream, app io.Writer) {
				_, err := app.Write([]byte("x"))
				require.NoError(t, err)
			},
			wantCode: proto.CodeConnReset, wantErr: localErr,
		},
		{
			name: "peer STOP_SENDING code is passed on",
			setup: func(s *fakeStream) {
				s.writeErr = &quic.StreamError{ErrorCode: proto.CodeOverloaded.StreamErrorCode(), Remote: true}
			},
			trigger: func(t *testing.T, _ *fakeStream, app io.Writer) {
				_, err := app.Write([]byte("x"))
				require.NoError(t, err)
			},
			wantCode: proto.CodeOverloaded,
		},
		// A FIN that cannot be sent (the stream was cancelled, e.g. by the
		// peer's STOP_SENDING) ends that direction quietly: the peer's reset is
		// reported by the other direction (TestPipeEOFAfterPeerStopSending).
		{
			name:  "peer closed the connection with a code",
			setup: func(*fakeStream) {},
			trigger: func(_ *testing.T, s *fakeStream, _ io.Writer) {
				_ = s.pw.CloseWithError(&quic.ApplicationError{ErrorCode: proto.CodeAuthFailed.ApplicationErrorCode(), Remote: true})
			},
			wantCode: proto.CodeAuthFailed,
		},
		{
			name:  "local read error counts as a reset",
			setup: func(*fakeStream) {},
			trigger: func(_ *testing.T, s *fakeStream, _ io.Writer) {
				_ = s.pw.CloseWithError(&quic.StreamError{ErrorCode: 3, Remote: false})
			},
			wantCode: proto.CodeConnReset,
		},
		{
			name:  "idle timeout counts as a reset",
			setup: func(*fakeStream) {},
			trigger: func(_ *testing.T, s *fakeStream, _ io.Writer) {
				_ = s.pw.CloseWithError(&quic.IdleTimeoutError{})
			},
			wantCode: proto.CodeConnReset,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			app, pipeConn := tcptest.Pair(t)
			s := newFakeStream()
			tc.setup(s)
			p := splice.New(pipeConn, s)
			done := runPipe(t, p)
			tc.trigger(t, s, app)
			err := waitRun(t, done)

			var ae *splice.AbortedError
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, tc.wantCode, ae.Code)
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
			}
			read, write := s.codes()
			assert.Equal(t, []quic.StreamErrorCode{tc.wantCode.StreamErrorCode()}, read, "CancelRead once with the code")
			assert.Equal(t, []quic.StreamErrorCode{tc.wantCode.StreamErrorCode()}, write, "CancelWrite once with the code")

			require.NoError(t, app.SetReadDeadline(time.Now().Add(testTimeout)))
			_, rerr := io.Copy(io.Discard, app)
			assert.ErrorIs(t, rerr, syscall.ECONNRESET, "the TCP side is reset")
		})
	}
}

func TestPipeCleanEndDoesNotCancel(t *testing.T) {
	t.Parallel()
	app, pipeConn := tcptest.Pair(t)
	s := newFakeStream()
	p := splice.New(pipeConn, s)
	var after, reads int
	p.AfterWrite = func() { after++ } // called from the one goroutine that writes
	p.AfterRead = func() { reads++ }  // called from the one goroutine that reads the stream
	done := runPipe(t, p)

	_, err := app.Write([]byte("abc"))
	require.NoError(t, err)
	require.NoError(t, app.CloseWrite())
	go func() {
		_, _ = s.pw.Write([]byte("defg"))
		_ = s.pw.Close() // EOF
	}()
	got, err := io.ReadAll(app)
	require.NoError(t, err)
	assert.Equal(t, "defg", string(got))
	require.NoError(t, waitRun(t, done))

	s.mu.Lock()
	assert.Equal(t, "abc", string(s.written))
	assert.True(t, s.closed, "FIN sent")
	s.mu.Unlock()
	read, write := s.codes()
	assert.Empty(t, read)
	assert.Empty(t, write)
	assert.Equal(t, int64(3), p.ToStream.Load())
	assert.Equal(t, int64(4), p.FromStream.Load())
	assert.Equal(t, 1, after)
	assert.Equal(t, 1, reads, "one read with data; the EOF read does not count")
}

// A Close that fails (the stream was cancelled: the peer sent STOP_SENDING)
// ends the upstream direction quietly; the other direction goes on.
func TestPipeCloseErrorEndsDirectionQuietly(t *testing.T) {
	t.Parallel()
	app, pipeConn := tcptest.Pair(t)
	s := newFakeStream()
	s.closeErr = errors.New("close called for canceled stream 0")
	p := splice.New(pipeConn, s)
	r := runPipe(t, p)

	require.NoError(t, app.CloseWrite())
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closed
	}, testTimeout, time.Millisecond, "Close called at EOF")

	go func() {
		_, _ = s.pw.Write([]byte("downstream"))
		_ = s.pw.Close()
	}()
	got, err := io.ReadAll(app)
	require.NoError(t, err)
	assert.Equal(t, "downstream", string(got))
	require.NoError(t, waitRun(t, r))
	read, write := s.codes()
	assert.Empty(t, read, "no abort")
	assert.Empty(t, write)
}
