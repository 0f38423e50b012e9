// Package tcptest gives package tests a connected pair of loopback TCP
// sockets. It imports no quictun package, so the tests inside pkg/splice
// and pkg/resume (which internal/testutil imports) can use it too.
package tcptest

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// Pair returns both ends of a loopback TCP connection: the one dialled and
// the one accepted. Both are closed when the test ends.
func Pair(tb testing.TB) (dialed, accepted *net.TCPConn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	defer func() { _ = ln.Close() }()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(tb, err)
	r := <-ch
	require.NoError(tb, r.err)
	tb.Cleanup(func() {
		_ = d.Close()
		_ = r.c.Close()
	})
	return d.(*net.TCPConn), r.c.(*net.TCPConn)
}
