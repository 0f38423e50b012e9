package splice

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil/tcptest"
)

// The splice makes raw system calls only on the net package's own sockets:
// a type wrapping one may do more in its Read and Write (buffered bytes).
func TestRawIOOnlyOnNetSockets(t *testing.T) {
	tc, _ := tcptest.Pair(t)
	type wrapped struct{ *net.TCPConn }
	assert.Nil(t, newRawIO(wrapped{tc}), "a wrapper's Read and Write are called")
	if runtime.GOOS == "linux" {
		assert.NotNil(t, newRawIO(tc))
	} else {
		assert.Nil(t, newRawIO(tc))
	}
}

// A raw write larger than the socket's buffers waits for room (EAGAIN, then
// the poller) and goes on where it stopped; raw reads get every byte in
// order, then io.EOF.
func TestRawIOFullSocket(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("raw system calls are Linux only")
	}
	c, peer := tcptest.Pair(t)
	require.NoError(t, c.SetWriteBuffer(16<<10))
	require.NoError(t, peer.SetReadBuffer(16<<10))

	data := make([]byte, 8<<20)
	_, _ = rand.Read(data)
	wrote := make(chan error, 1)
	go func() {
		w := newRawIO(c)
		n, err := w.write(data)
		if err == nil && n != len(data) {
			err = io.ErrShortWrite
		}
		wrote <- errors.Join(err, c.CloseWrite())
	}()
	time.Sleep(50 * time.Millisecond) // the writer fills both buffers and waits
	r := newRawIO(peer)
	got := make([]byte, 0, len(data))
	buf := make([]byte, 3000)
	for {
		n, err := r.read(buf)
		got = append(got, buf[:n]...)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.Positive(t, n)
	}
	require.NoError(t, <-wrote)
	assert.Equal(t, sha256.Sum256(data), sha256.Sum256(got))
}

// A raw read's or write's error is a *net.OpError, as the net package's,
// and still matches what it wraps.
func TestRawIOErrors(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("raw system calls are Linux only")
	}
	tc, _ := tcptest.Pair(t)
	rw := newRawIO(tc)
	require.NoError(t, tc.SetReadDeadline(time.Now().Add(-time.Second)))
	_, err := rw.read(make([]byte, 10))
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "read", oe.Op)
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.NoError(t, tc.Close())
	_, err = rw.write([]byte("x"))
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "write", oe.Op)
	assert.ErrorIs(t, err, net.ErrClosed)
}
