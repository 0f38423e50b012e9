//go:build unix

package resume

import (
	"errors"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil/tcptest"
)

// TestImportKeepsDescriptor: Import serves the descriptor it was handed
// (as its predecessor sent it) instead of making a net.Conn of a
// duplicate, and the tunnel's bytes go through it both ways.
func TestImportKeepsDescriptor(t *testing.T) {
	t.Parallel()
	app, c := tcptest.Pair(t)
	f, err := c.File()
	require.NoError(t, err)
	fd := rawFD(t, f)
	_ = c.Close() // only the duplicate is left, as in the new process
	p, err := Import(&State{ID: ID{1}, Window: time.Minute, Conn: f}, Config{})
	require.NoError(t, err)
	defer p.Abort(0)
	sc, ok := p.conn.(*sockConn)
	require.True(t, ok, "the connection is %T", p.conn)
	assert.Equal(t, fd, rawFD(t, sc.f), "the descriptor handed over, not a duplicate")

	_, err = app.Write([]byte("hello"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return p.Held() > 0 }, 10*time.Second, time.Millisecond, "read from the application")
	_, err = sc.Write([]byte("back"))
	require.NoError(t, err)
	got := make([]byte, 4)
	_, err = io.ReadFull(app, got)
	require.NoError(t, err)
	assert.Equal(t, "back", string(got))
}

// rawFD is f's descriptor. Unlike f.Fd() it leaves the descriptor
// non-blocking (Fd makes a socket's blocking, and a read on it could then
// no longer be woken).
func rawFD(t *testing.T, f *os.File) uintptr {
	t.Helper()
	rc, err := f.SyscallConn()
	require.NoError(t, err)
	var fd uintptr
	require.NoError(t, rc.Control(func(u uintptr) { fd = u }))
	return fd
}

// TestSockConn: an imported socket's half-close, reset, addresses, wake-up
// by deadline and duplicate (for the next upgrade) work as a
// *net.TCPConn's.
func TestSockConn(t *testing.T) {
	t.Parallel()
	sockOf := func(t *testing.T) (*sockConn, func() (int, error)) {
		app, c := tcptest.Pair(t)
		f, err := c.File()
		require.NoError(t, err)
		_ = c.Close()
		sc, err := importConn(f)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sc.Close() })
		s, ok := sc.(*sockConn)
		require.True(t, ok)
		assert.Equal(t, app.RemoteAddr().String(), s.LocalAddr().String())
		assert.Equal(t, app.LocalAddr().String(), s.RemoteAddr().String())
		return s, func() (int, error) {
			_ = app.SetReadDeadline(time.Now().Add(10 * time.Second))
			return app.Read(make([]byte, 16))
		}
	}
	t.Run("half-close", func(t *testing.T) {
		t.Parallel()
		s, read := sockOf(t)
		require.NoError(t, s.CloseWrite())
		_, err := read()
		assert.ErrorIs(t, err, io.EOF)
	})
	t.Run("reset", func(t *testing.T) {
		t.Parallel()
		s, read := sockOf(t)
		resetConn(s)
		_, err := read()
		assert.ErrorIs(t, err, syscall.ECONNRESET)
	})
	t.Run("deadline wakes a read", func(t *testing.T) {
		t.Parallel()
		s, _ := sockOf(t)
		errc := make(chan error, 1)
		go func() { _, err := s.Read(make([]byte, 16)); errc <- err }()
		time.Sleep(10 * time.Millisecond)
		require.NoError(t, s.SetReadDeadline(time.Unix(1, 0)))
		select {
		case err := <-errc:
			assert.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("the read was not woken")
		}
	})
	t.Run("duplicate", func(t *testing.T) {
		t.Parallel()
		s, read := sockOf(t)
		f, err := s.File()
		require.NoError(t, err)
		assert.NotEqual(t, rawFD(t, s.f), rawFD(t, f))
		_ = s.Close()
		_, err = f.Write([]byte("x"))
		require.NoError(t, err, "the duplicate keeps the socket")
		n, err := read()
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		_ = f.Close()
	})
}
