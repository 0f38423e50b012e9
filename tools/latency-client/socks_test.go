package main

import (
	"io"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/socks5"
)

// socksProxy is a SOCKS5 proxy for tests: it connects to what it is asked
// for unless refuse, then relays. It stops when the test ends.
func socksProxy(t *testing.T, refuse bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				if socks5.Negotiate(c, nil) != nil {
					return
				}
				req, err := socks5.ReadRequest(c)
				if err != nil {
					return
				}
				if refuse {
					_ = socks5.WriteReply(c, socks5.ReplyNotAllowed, socks5.Addr{})
					return
				}
				d, err := net.Dial("tcp", req.Addr.String())
				if err != nil {
					_ = socks5.WriteReply(c, socks5.ReplyConnectionRefused, socks5.Addr{})
					return
				}
				defer d.Close()
				_ = socks5.WriteReply(c, socks5.ReplySucceeded, socks5.Addr{Host: "bound.example", Port: 1})
				go func() { _, _ = io.Copy(d, c); _ = d.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, d)
			})
		}
	})
	return ln.Addr().String()
}

// TestProbeThroughSOCKS5: --socks5 connects through the proxy (by IP and by
// name), and a refusal is a connect error naming the reply.
func TestProbeThroughSOCKS5(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", handleEcho)
	for _, host := range []string{"127.0.0.1", "localhost"} {
		o := newProbeOptions()
		o.target = tcpTarget(t, ln)
		o.target.host = host
		o.target.socks5 = socksProxy(t, false)
		o.number = 20
		require.NoError(t, o.validate())
		r := runProbe(testCtx(t), o)
		require.Zero(t, r.Errors, r.ErrorMessages)
		assert.Equal(t, 20, r.RoundTrips, host)
	}
	o := newProbeOptions()
	o.target = tcpTarget(t, ln)
	o.target.socks5 = socksProxy(t, true)
	o.number = 1
	r := runProbe(testCtx(t), o)
	require.Equal(t, 1, r.Errors)
	assert.Contains(t, r.ErrorMessages[0], "answered 2")

	bad := target{unixPath: "/tmp/x", socks5: "127.0.0.1:" + strconv.Itoa(1)}
	assert.ErrorContains(t, bad.validate(), "--socks5")
}
