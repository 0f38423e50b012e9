package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
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
	"go.uber.org/goleak"

	"github.com/quictun/quictun/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// daemon is run(ctx, mode, args) in a goroutine, stopped when the test ends.
type daemon struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before done is closed
}

func startDaemon(t *testing.T, mode string, args ...string) *daemon {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	d := &daemon{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		d.err = run(ctx, mode, args)
	}()
	t.Cleanup(func() { _ = d.stop(t) })
	return d
}

// wait returns run's error once it has returned, failing the test if that
// takes longer than bound.
func (d *daemon) wait(t *testing.T, bound time.Duration) error {
	t.Helper()
	select {
	case <-d.done:
		return d.err
	case <-time.After(bound):
		require.FailNow(t, "run did not return", "within %v", bound)
		return nil
	}
}

// stop cancels the daemon's context and returns run's error.
func (d *daemon) stop(t *testing.T) error {
	t.Helper()
	d.cancel()
	return d.wait(t, 3*time.Second)
}

// tun is a floortun server and client running in the test.
type tun struct {
	srv, cl *daemon
	udp     string   // the server's --listen-on
	locals  []string // the local address of each forward
}

// tunnel starts a floortun server that allows allow and a client with one
// forward per destination in dests, in that order.
func tunnel(t *testing.T, allow string, dests ...string) tun {
	t.Helper()
	udp := testutil.FreeAddr(t, "udp")
	srv := startDaemon(t, "quictun-server", "--listen-on", "udp:"+udp, "--allow", allow,
		"--state-dir", t.TempDir(), "--audit-log") // flags of quictun's that floortun ignores
	args := []string{"--server-endpoint", "udp:" + udp}
	var locals []string
	for _, dest := range dests {
		local := testutil.FreeAddr(t, "tcp")
		locals = append(locals, local)
		args = append(args, "--forward", "tcp:"+local+"=tcp:"+dest)
	}
	cl := startDaemon(t, "quictun-client", args...)
	return tun{srv: srv, cl: cl, udp: udp, locals: locals}
}

// dial connects to addr, retrying while nothing listens there yet (the
// client listens once its QUIC connection is up).
func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	var c net.Conn
	require.Eventually(t, func() bool {
		var err error
		c, err = net.Dial("tcp", addr)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "nothing listens on %s", addr)
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn)
}

// echo sends size random bytes on c, half-closes, reads until EOF and
// compares the SHA-256 of what came back with that of what was sent.
func echo(c *net.TCPConn, size int) error {
	data := make([]byte, size)
	_, _ = rand.Read(data)
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.CloseWrite()
		}
		werr <- err
	}()
	h := sha256.New()
	n, rerr := io.Copy(h, c)
	if err := errors.Join(<-werr, rerr); err != nil {
		return fmt.Errorf("after %d of %d bytes back: %w", n, size, err)
	}
	if got, want := h.Sum(nil), sha256.Sum256(data); string(got) != string(want[:]) {
		return fmt.Errorf("echo of %d bytes differs: %d bytes back, sha256 %x, want %x", size, n, got, want)
	}
	return nil
}

func TestEchoThroughTunnel(t *testing.T) {
	dest := testutil.EchoServer(t)
	locals := tunnel(t, "tcp:"+dest, dest).locals

	sizes := []int{1 << 20, 300<<10 + 7} // two connections at once, on two streams
	errs := make([]error, len(sizes))
	var wg sync.WaitGroup
	for i, size := range sizes {
		c := dial(t, locals[0])
		wg.Go(func() { errs[i] = echo(c, size) })
	}
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "connection %d (%d bytes)", i, sizes[i])
	}
}

func TestDestinationNotAllowed(t *testing.T) {
	allowed := testutil.EchoServer(t)
	// denied listens but is never served: a dial by the server would sit in
	// its accept queue, where the Accept below finds it.
	denied, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer denied.Close()
	locals := tunnel(t, "tcp:"+allowed, denied.Addr().String(), allowed).locals

	c := dial(t, locals[0])
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	_, _ = c.Write([]byte("not to be delivered"))
	got, err := io.ReadAll(c)
	if err != nil { // the refusal may come as a reset, but not as a timeout
		require.ErrorIs(t, err, syscall.ECONNRESET)
	}
	assert.Empty(t, got, "bytes came back from a destination not in --allow")

	// The server refuses before it would dial, and the client saw the refusal.
	require.NoError(t, denied.SetDeadline(time.Now().Add(100*time.Millisecond)))
	dc, err := denied.Accept()
	if err == nil {
		_ = dc.Close()
	}
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "the server dialled a destination not in --allow")

	// The refused stream leaves the tunnel usable.
	require.NoError(t, echo(dial(t, locals[1]), 64<<10))
}

func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		name, mode string
		args       []string
		want       []string
	}{
		{"server without --allow", "quictun-server", []string{"--listen-on", "udp:127.0.0.1:0"}, []string{"--allow"}},
		{"server with empty --allow", "quictun-server", []string{"--listen-on", "127.0.0.1:0", "--allow", ","}, []string{"--allow"}},
		{"server on TEST-NET", "quictun-server", []string{"--listen-on", "udp:192.0.2.1:1", "--allow", "tcp:127.0.0.1:1"}, []string{"192.0.2.1:1", "not a loopback"}},
		{"server on any address", "quictun-server", []string{"--listen-on", "0.0.0.0:0", "--allow", "tcp:127.0.0.1:1"}, []string{"0.0.0.0:0", "not a loopback"}},
		{"client without --forward", "quictun-client", []string{"--server-endpoint", "udp:127.0.0.1:1"}, []string{"no --forward"}},
		{"unknown mode", "floortun", nil, []string{"run as quictun-server or quictun-client"}},
		{"unknown subcommand", "quictun-server", []string{"serve"}, []string{"unknown subcommand"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			err := run(ctx, tc.mode, tc.args)
			testutil.RequireErrorContains(t, err, tc.want)
		})
	}
}

func TestOnLoopback(t *testing.T) {
	for _, addr := range []string{
		"127.0.0.1:1", "127.255.255.254:65535", "[::1]:1", "localhost:1",
		"198.18.0.1:4433", "198.19.255.255:1", // 198.18.0.0/15 (RFC 2544)
	} {
		assert.NoError(t, onLoopback(addr), addr)
	}
	for _, addr := range []string{
		"192.0.2.1:1", "0.0.0.0:0", "[::]:0", "10.0.0.1:1",
		"198.17.255.255:1", "198.20.0.0:1", // just outside 198.18.0.0/15
		"example.com:1", "127.0.0.1", // a name, no port
	} {
		assert.Error(t, onLoopback(addr), addr)
	}
}

// TestCancelStopsEverything cancels server and client with a connection in
// flight: both runs return nil, and no goroutine of theirs is left even
// though the application still holds its end open; the application sees its
// connection end, and the ports are free again.
func TestCancelStopsEverything(t *testing.T) {
	dest := testutil.EchoServer(t)
	ignore := goleak.IgnoreCurrent() // the echo server's accept loop
	tu := tunnel(t, "tcp:"+dest, dest)
	c := dial(t, tu.locals[0])
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	_, err := c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	require.Equal(t, "ping", string(buf))

	require.NoError(t, tu.cl.stop(t))
	require.NoError(t, tu.srv.stop(t))
	goleak.VerifyNone(t, ignore)
	_, err = c.Read(buf)
	require.Error(t, err, "the connection through the tunnel outlived it")
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the connection through the tunnel outlived it")
	testutil.RequireFree(t, "tcp", tu.locals...)
	// quic-go closes a Listener's socket once its closed connections have
	// spent their 3 PTOs of closing state, a little after serve returns.
	require.Eventually(t, func() bool {
		pc, err := net.ListenPacket("udp", tu.udp)
		if err == nil {
			_ = pc.Close()
		}
		return err == nil
	}, 2*time.Second, 5*time.Millisecond, "udp %s leaked", tu.udp)
}

// TestServerGoneEndsClient stops only the server: the client does not
// reconnect, its run returns an error, and live connections end.
func TestServerGoneEndsClient(t *testing.T) {
	dest := testutil.EchoServer(t)
	tu := tunnel(t, "tcp:"+dest, dest)
	c := dial(t, tu.locals[0])
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	require.NoError(t, echo(dial(t, tu.locals[0]), 1024)) // the tunnel works

	require.NoError(t, tu.srv.stop(t))
	testutil.RequireErrorContains(t, tu.cl.wait(t, 3*time.Second), []string{"QUIC connection ended"})
	_, err := c.Read(make([]byte, 1))
	require.Error(t, err)
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the connection outlived the tunnel")
}
