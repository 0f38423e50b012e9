package splice_test

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quictun/quictun/internal/testutil/quictest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/splice"
)

// unixPair returns both ends of a UNIX stream connection (client listeners
// may be unix:/path).
func unixPair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	ch := make(chan *net.UnixConn, 1)
	go func() {
		c, _ := ln.AcceptUnix()
		ch <- c
	}()
	b, err = net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	a = <-ch
	require.NotNil(t, a)
	t.Cleanup(func() {
		_ = a.Close()
		_ = b.Close()
	})
	return a, b
}

func TestPipeUnixHalfClose(t *testing.T) {
	t.Parallel()
	cli, srv := quictest.Pair(t)
	pipeStr, peer := streamPair(t, cli, srv)
	pipeConn, app := unixPair(t)
	p := splice.New(pipeConn, pipeStr)
	r := runPipe(t, p)

	up := randomBytes(t, 256<<10)
	go func() {
		_, _ = app.Write(up)
		_ = app.CloseWrite()
	}()
	require.NoError(t, peer.SetReadDeadline(time.Now().Add(testTimeout)))
	got, err := io.ReadAll(peer)
	require.NoError(t, err, "UNIX EOF becomes a stream FIN")
	assert.Equal(t, up, got)

	_, err = peer.Write([]byte("reply"))
	require.NoError(t, err)
	require.NoError(t, peer.Close())
	require.NoError(t, app.SetReadDeadline(time.Now().Add(testTimeout)))
	back, err := io.ReadAll(app)
	require.NoError(t, err)
	assert.Equal(t, "reply", string(back))
	require.NoError(t, waitRun(t, r))
	assert.Equal(t, int64(len(up)), p.ToStream.Load())
}

func TestPipeUnixAbort(t *testing.T) {
	t.Parallel()
	cli, srv := quictest.Pair(t)
	pipeStr, peer := streamPair(t, cli, srv)
	pipeConn, app := unixPair(t)
	p := splice.New(pipeConn, pipeStr)
	r := runPipe(t, p)

	p.Abort(proto.CodeShutdown)
	var ae *splice.AbortedError
	require.ErrorAs(t, waitRun(t, r), &ae)
	assert.Equal(t, proto.CodeShutdown, ae.Code)
	// UNIX sockets have no reset (the application sees EOF, or ECONNRESET
	// when unread data was discarded), but the end must come at once.
	require.NoError(t, app.SetReadDeadline(time.Now().Add(testTimeout)))
	_, err := io.ReadAll(app)
	assert.NotErrorIs(t, err, os.ErrDeadlineExceeded)
	se := readStreamError(t, peer)
	assert.Equal(t, proto.CodeShutdown.StreamErrorCode(), se.ErrorCode)
}
