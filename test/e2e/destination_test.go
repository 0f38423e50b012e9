package e2e

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// unacceptedListener returns the address of a loopback TCP socket that listens
// with backlog 0 and never accepts, with its accept queue filled, so further
// connects hang in SYN retransmission: a destination that is slow to accept.
func unacceptedListener(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), "unaccepted")
	t.Cleanup(func() { _ = f.Close() })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for i := 0; ; i++ {
		require.Less(t, i, 32, "could not fill the accept queue of %s", addr)
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			return addr // this connect hung: the queue is full
		}
		t.Cleanup(func() { _ = c.Close() })
	}
}

// resettingServer accepts connections, reads the first bytes and resets the connection.
func resettingServer(t *testing.T) string {
	t.Helper()
	return testutil.ServeTCP(t, func(c net.Conn) {
		_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
		_, _ = c.Read(make([]byte, 64))
		_ = c.(*net.TCPConn).SetLinger(0)
	})
}

// dialFrom connects to addr from the loopback source IP src, so the client's
// File token source picks the destination for that source.
func dialFrom(t *testing.T, src, addr string) (*net.TCPConn, error) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn), nil
}

// TestDestinationFailures: destinations that are down, never accept, or reset
// each fail the application's connection with a reset and a clear code in
// both ends' streams_total; a slow destination is bounded by --dial-timeout
// and does not hold up tunnels to other destinations.
func TestDestinationFailures(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	slow := unacceptedListener(t)
	down := testutil.FreeAddr(t, "tcp")
	reset := resettingServer(t)
	tokens := writeFile(t, "tokens", fmt.Sprintf("# source IP -> destination\n127.0.0.2 tcp:%s\n127.0.0.3 tcp:%s\n127.0.0.4 tcp:%s\n* tcp:%s\n",
		slow, down, reset, echo))
	srv := startServer(t, serverOpts{Args: []string{"--dial-timeout", "1s"}}) // default allow-list: loopback
	cl := startClient(t, srv, clientOpts{Token: tokens, Args: []string{"--token-source-plugin", "File"}})

	type outcome struct {
		err error
		dur time.Duration
	}
	attempt := func(src string) outcome {
		start := time.Now()
		c, err := dialFrom(t, src, cl.Addr)
		if err != nil {
			return outcome{err, time.Since(start)}
		}
		_ = c.SetDeadline(time.Now().Add(ioTimeout))
		if _, err := c.Write([]byte("hello")); err != nil {
			return outcome{err, time.Since(start)}
		}
		_, err = io.ReadFull(c, make([]byte, 5))
		return outcome{err, time.Since(start)}
	}

	// Five connections to the slow destination, then, while their dials hang,
	// tunnels to the echo destination must work.
	const nSlow = 5
	slowOut := make([]outcome, nSlow)
	slowDone := make(chan struct{})
	var wg sync.WaitGroup
	for i := range slowOut {
		wg.Go(func() { slowOut[i] = attempt("127.0.0.2") })
	}
	go func() { wg.Wait(); close(slowDone) }()
	waitMetric(t, cl, 5*time.Second, ge(nSlow), "quictun_client_active_streams")
	echoStart := time.Now()
	for range 3 {
		require.NoError(t, echoVia(t, cl.Addr, "fast lane"))
	}
	echoDur := time.Since(echoStart)
	select {
	case <-slowDone:
		t.Errorf("the slow destination's dials ended before the echo tunnels were served (echo took %v)", echoDur)
	default:
	}
	select {
	case <-slowDone:
	case <-time.After(ioTimeout):
		t.Fatal("dials to the slow destination were not bounded")
	}
	var slowest time.Duration
	for i, o := range slowOut {
		assert.True(t, isReset(o.err), "slow destination conn %d: want a reset, got %v", i, o.err)
		assert.Less(t, o.dur, 5*time.Second, "slow destination conn %d failed only after %v with --dial-timeout 1s", i, o.dur)
		slowest = max(slowest, o.dur)
	}

	downOut := attempt("127.0.0.3")
	assert.True(t, isReset(downOut.err), "destination down: want a reset, got %v", downOut.err)
	resetOut := attempt("127.0.0.4")
	assert.True(t, isReset(resetOut.err), "resetting destination: want a reset, got %v", resetOut.err)

	for _, d := range []*daemon{cl, srv} {
		prefix := "quictun_server_"
		if d == cl {
			prefix = "quictun_client_"
		}
		waitMetric(t, d, 5*time.Second, eq(nSlow), prefix+"streams_total", "result", "timeout")
		waitMetric(t, d, 5*time.Second, eq(1), prefix+"streams_total", "result", "dial_failed")
		waitMetric(t, d, 5*time.Second, eq(1), prefix+"streams_total", "result", "reset")
		waitMetric(t, d, 5*time.Second, eq(3), prefix+"streams_total", "result", "ok")
	}
	t.Logf("--dial-timeout 1s: %d tunnels to a never-accepting destination failed after at most %v (reset, result=timeout); "+
		"meanwhile 3 echo tunnels took %v; destination down failed in %v (dial_failed); resetting destination in %v (reset)",
		nSlow, slowest, echoDur, downOut.dur, resetOut.dur)
}

// TestDialTimeoutResult: a dial that runs into --dial-timeout is reported to
// the client as "timeout", every time.
func TestDialTimeoutResult(t *testing.T) {
	checkLeaks(t)
	slow := unacceptedListener(t)
	srv := startServer(t, serverOpts{Args: []string{"--dial-timeout", "1s"}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + slow})
	const n = 5
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", cl.Addr, 5*time.Second)
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
			_ = c.SetDeadline(time.Now().Add(ioTimeout))
			_, _ = io.ReadAll(c)
		})
	}
	wg.Wait()
	waitMetric(t, srv, 5*time.Second, ge(n), "quictun_server_dial_duration_seconds")
	m := scrape(t, srv)
	assert.Equal(t, float64(n), m.val("quictun_server_streams_total", "result", "timeout"))
	assert.Equal(t, 0.0, m.val("quictun_server_streams_total", "result", "dial_failed"))
}

// TestSlowDestinationDialSlots: dials to a destination that never answers must
// not use up the server's dial slots for everyone. With --max-concurrent-dials
// 4 and 4 such dials pending, a tunnel to a healthy destination must still be
// served at once.
func TestSlowDestinationDialSlots(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	slow := unacceptedListener(t)
	tokens := writeFile(t, "tokens", fmt.Sprintf("127.0.0.2 tcp:%s\n* tcp:%s\n", slow, echo))
	srv := startServer(t, serverOpts{Args: []string{"--dial-timeout", "3s", "--max-concurrent-dials", "4"}})
	cl := startClient(t, srv, clientOpts{Token: tokens, Args: []string{"--token-source-plugin", "File"}})
	var wg sync.WaitGroup
	defer wg.Wait()
	for range 4 {
		wg.Go(func() {
			c, err := dialFrom(t, "127.0.0.2", cl.Addr)
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(ioTimeout))
			_, _ = io.ReadAll(c)
		})
	}
	waitMetric(t, cl, 5*time.Second, ge(4), "quictun_client_active_streams")
	time.Sleep(100 * time.Millisecond) // let the server start the 4 dials
	start := time.Now()
	err := echoVia(t, cl.Addr, "healthy")
	took := time.Since(start)
	t.Logf("echo with the dial pool full of blackholed dials: err %v after %v", err, took)
	require.NoError(t, err)
	assert.Less(t, took, time.Second, "a healthy destination waited for a slow one's dial slot")
}
