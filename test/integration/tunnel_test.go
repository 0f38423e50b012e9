package integration

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/server"
)

// tunnel starts an echo server, a server allowing it and a connected client.
func tunnel(t *testing.T) (*testutil.Server, *testutil.Client) {
	t.Helper()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})
	return srv, cl
}

func dial(t testing.TB, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(60*time.Second)))
	return c.(*net.TCPConn)
}

// echoCheck sends n random bytes on c while reading the echo back, and checks both SHA-256 sums.
// It fails when either direction makes no progress for a minute, not when a slow (loaded, -race)
// machine needs longer than that for all of it.
func echoCheck(t *testing.T, c net.Conn, n int64) {
	t.Helper()
	sent := sha256.New()
	errc := make(chan error, 1)
	pc := progressConn{Conn: c, stall: time.Minute}
	go func() {
		_, err := io.Copy(pc, io.TeeReader(io.LimitReader(rand.Reader, n), sent))
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
		}
		errc <- err
	}()
	got := sha256.New()
	m, err := io.Copy(got, pc)
	require.NoError(t, err)
	require.NoError(t, <-errc)
	require.Equal(t, n, m, "echoed byte count")
	require.Equal(t, sent.Sum(nil), got.Sum(nil), "echo differs from what was sent")
}

// progressConn gives each read and write its own deadline, stall from its start: a bound on
// a stall, where a deadline on the whole transfer would be a bound on the machine's speed.
type progressConn struct {
	net.Conn
	stall time.Duration
}

func (p progressConn) Read(b []byte) (int, error) {
	_ = p.SetReadDeadline(time.Now().Add(p.stall))
	return p.Conn.Read(b)
}

func (p progressConn) Write(b []byte) (int, error) {
	_ = p.SetWriteDeadline(time.Now().Add(p.stall))
	return p.Conn.Write(b)
}

func TestEchoIntegrityLarge(t *testing.T) {
	_, cl := tunnel(t)
	n := int64(64 << 20)
	if testing.Short() {
		n = 8 << 20
	}
	echoCheck(t, dial(t, cl.Addr), n)
	// The counters are updated when the tunnel ends, just after the application saw EOF.
	assert.Eventually(t, func() bool {
		return promtest.ToFloat64(cl.Metrics.StreamsTotal.WithLabelValues("ok")) == 1 &&
			promtest.ToFloat64(cl.Metrics.StreamBytesTotal.WithLabelValues("upstream")) == float64(n)
	}, 5*time.Second, 10*time.Millisecond)
}

func TestManyConcurrentConnections(t *testing.T) {
	srv, cl := tunnel(t)
	n := 500
	if testing.Short() {
		n = 100
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", cl.Addr, 10*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer func() { _ = c.Close() }()
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			msg := make([]byte, 16<<10)
			_, _ = rand.Read(msg)
			copy(msg, fmt.Sprintf("conn %d ", i))
			if _, err := c.Write(msg); err != nil {
				errs <- fmt.Errorf("conn %d write: %w", i, err)
				return
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil {
				errs <- fmt.Errorf("conn %d read: %w", i, err)
				return
			}
			if !bytes.Equal(msg, got) {
				errs <- fmt.Errorf("conn %d got another connection's bytes", i)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return srv.Server.Registry().Len() == 0 && cl.Client.Registry().Len() == 0 },
		10*time.Second, 10*time.Millisecond, "tunnels not released")
}

// TestHalfClose: the application shuts down its write side before reading the
// response, as nc -N and HTTP/1.0 clients do; the destination answers after EOF.
func TestHalfClose(t *testing.T) {
	dest := testutil.ServeTCP(t, func(c net.Conn) {
		h := sha256.New()
		n, err := io.Copy(h, c)
		if err != nil {
			return
		}
		_, _ = fmt.Fprintf(c, "got %d bytes %x", n, h.Sum(nil))
		_ = c.(*net.TCPConn).CloseWrite()
	})
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + dest}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + dest, WaitReady: true})
	c := dial(t, cl.Addr)
	req := make([]byte, 300<<10)
	_, _ = rand.Read(req)
	_, err := c.Write(req)
	require.NoError(t, err)
	require.NoError(t, c.CloseWrite())
	resp, err := io.ReadAll(c)
	require.NoError(t, err, "the response must arrive after our FIN, then a clean EOF")
	sum := sha256.Sum256(req)
	assert.Equal(t, fmt.Sprintf("got %d bytes %x", len(req), sum), string(resp))
}

// TestHalfCloseFromDestination: the destination speaks first and closes its
// write side; the application still sends afterwards and the destination reads it.
func TestHalfCloseFromDestination(t *testing.T) {
	received := make(chan string, 1)
	dest := testutil.ServeTCP(t, func(c net.Conn) {
		_, _ = io.WriteString(c, "banner")
		_ = c.(*net.TCPConn).CloseWrite()
		b, _ := io.ReadAll(c)
		received <- string(b)
	})
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + dest}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + dest, WaitReady: true})
	c := dial(t, cl.Addr)
	banner, err := io.ReadAll(c) // the destination's FIN arrives as EOF
	require.NoError(t, err)
	assert.Equal(t, "banner", string(banner))
	_, err = io.WriteString(c, "still talking after your FIN")
	require.NoError(t, err)
	require.NoError(t, c.CloseWrite())
	select {
	case got := <-received:
		assert.Equal(t, "still talking after your FIN", got)
	case <-time.After(10 * time.Second):
		t.Fatal("destination never got the bytes sent after its FIN")
	}
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// TestResetFromDestination: a destination RST reaches the application as a reset, not as EOF.
func TestResetFromDestination(t *testing.T) {
	dest := testutil.ServeTCP(t, func(c net.Conn) {
		buf := make([]byte, 5)
		_, _ = io.ReadFull(c, buf)
		_, _ = c.Write([]byte("partial"))
		time.Sleep(50 * time.Millisecond)
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.Close()
	})
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + dest}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + dest, WaitReady: true})
	c := dial(t, cl.Addr)
	_, err := c.Write([]byte("hello"))
	require.NoError(t, err)
	b, err := io.ReadAll(c)
	require.Error(t, err, "a reset must not look like a clean EOF")
	assert.True(t, isReset(err), "want ECONNRESET, got %v", err)
	assert.LessOrEqual(t, len(b), len("partial"))
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("reset")) == 1
	}, 5*time.Second, 10*time.Millisecond)
}

// TestResetFromApplication: an application RST reaches the destination as a reset.
func TestResetFromApplication(t *testing.T) {
	destErr := make(chan error, 1)
	dest := testutil.ServeTCP(t, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		_, err := io.Copy(io.Discard, c)
		destErr <- err
	})
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + dest}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + dest, WaitReady: true})
	c := dial(t, cl.Addr)
	_, err := c.Write([]byte("some bytes"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return srv.Server.Registry().Len() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, c.SetLinger(0))
	require.NoError(t, c.Close())
	select {
	case err := <-destErr:
		require.Error(t, err)
		assert.True(t, isReset(err), "want ECONNRESET at the destination, got %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("destination never saw the reset")
	}
}

func TestUnixSocketsBothEnds(t *testing.T) {
	dir, err := os.MkdirTemp("", "qt") // short path: UNIX socket paths are limited to 108 bytes
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	destPath := filepath.Join(dir, "dest.sock")
	dln, err := net.Listen("unix", destPath)
	require.NoError(t, err)
	testutil.ServeListener(t, dln, func(c net.Conn) {
		_, _ = io.Copy(c, c)
		_ = c.(*net.UnixConn).CloseWrite()
	})
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"unix:" + destPath}})
	lln, err := net.Listen("unix", filepath.Join(dir, "client.sock"))
	require.NoError(t, err)
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "unix:" + destPath, Listeners: []net.Listener{lln}, WaitReady: true})
	c, err := net.Dial("unix", cl.Addr)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	echoCheck(t, c, 1<<20)
}

// refusedRead checks that the application sees its connection reset without any data.
func refusedRead(t *testing.T, addr string) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		// The reset can beat connect() returning on loopback; that is what the application sees too.
		require.True(t, isReset(err), "want a reset, got %v", err)
		return
	}
	t.Cleanup(func() { _ = nc.Close() })
	c := nc.(*net.TCPConn)
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	_, werr := c.Write([]byte("x"))
	b, err := io.ReadAll(c)
	assert.Empty(t, b)
	if werr != nil {
		// The refusal is sent as soon as the header (written at accept)
		// reaches the server, so its reset can beat this write: Linux then
		// reports it once, to the write, and reads see EOF afterwards.
		assert.True(t, isReset(werr), "want a reset, got %v on write", werr)
		return
	}
	require.Error(t, err)
	assert.True(t, isReset(err), "want a reset, got %v", err)
}

func TestRefusedDestination(t *testing.T) {
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:127.0.0.1:1"}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})
	refusedRead(t, cl.Addr)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("refused")) == 1 &&
			promtest.ToFloat64(srv.Metrics.RefusedTotal.WithLabelValues("tcp", "not_allowed")) == 1 &&
			promtest.ToFloat64(cl.Metrics.StreamsTotal.WithLabelValues("refused")) == 1
	}, 5*time.Second, 10*time.Millisecond)
}

func TestDefaultAllowListRefusesNonLoopback(t *testing.T) {
	srv := testutil.StartServer(t, testutil.ServerOptions{})
	for _, tok := range []string{"tcp:169.254.169.254:80", "tcp:198.18.0.1:22", "unix:/run/docker.sock"} {
		cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: tok, WaitReady: true})
		refusedRead(t, cl.Addr)
	}
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("refused")) == 3
	}, 5*time.Second, 10*time.Millisecond)
}

func TestDialFailed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + closed}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + closed, WaitReady: true})
	refusedRead(t, cl.Addr)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(cl.Metrics.StreamsTotal.WithLabelValues("dial_failed")) == 1
	}, 5*time.Second, 10*time.Millisecond)
}

func TestWrongSecretRejected(t *testing.T) {
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	// Never ready: its hello is refused (TestConnectedLoggedOnceAndRefusedCredentialsNotReady).
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: []byte("not-the-right-secret-at-all")})
	refusedRead(t, cl.Addr)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("auth_failed")) >= 1 &&
			promtest.ToFloat64(srv.Metrics.ConnectionsTotal.WithLabelValues("auth_failed")) >= 1
	}, 5*time.Second, 10*time.Millisecond)
	assert.Zero(t, promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("ok")))
}

func TestMissingSecretRejected(t *testing.T) {
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, NoAuth: true, WaitReady: true})
	refusedRead(t, cl.Addr)
}

func TestWrongCertificateRejected(t *testing.T) {
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	other := testutil.StartServer(t, testutil.ServerOptions{}) // a different identity
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{
		Token: "tcp:" + echo, Fingerprint: other.State.Fingerprint(),
		Mutate: func(c *client.Config) { c.SessionWait = 300 * time.Millisecond },
	})
	refusedRead(t, cl.Addr)
	assert.False(t, cl.Client.Ready())
	assert.Positive(t, promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("cert_rejected")))
	assert.Equal(t, 1.0, promtest.ToFloat64(cl.Metrics.StreamsTotal.WithLabelValues("no_session")))
	assert.Zero(t, promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("ok")))
}

// TestServerRestart: a server restart fails open tunnels cleanly (a reset, not a
// hang), and the client reconnects by itself so new connections succeed.
func TestServerRestart(t *testing.T) {
	echo := testutil.EchoServer(t)
	state := t.TempDir()
	noDrain := func(c *server.Config) { c.DrainTimeout = 0 }
	srv := testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Allow: []string{"tcp:" + echo}, Mutate: noDrain})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})
	old := dial(t, cl.Addr)
	_, err := old.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(old, buf)
	require.NoError(t, err)

	srv.Stop(t)
	_, err = io.ReadAll(old)
	require.Error(t, err, "an open tunnel must fail loudly when the server goes away")

	srv2 := testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Addr: srv.Addr, Allow: []string{"tcp:" + echo}})
	require.Equal(t, srv.Addr, srv2.Addr)
	start := time.Now()
	require.Eventually(t, cl.Client.Ready, 10*time.Second, 5*time.Millisecond)
	echoCheck(t, dial(t, cl.Addr), 64<<10)
	t.Logf("new connection succeeded %v after the server was back", time.Since(start))
	assert.GreaterOrEqual(t, promtest.ToFloat64(cl.Metrics.ReconnectsTotal), 1.0)
}

// TestGracefulDrain: cancelling the server lets a running transfer finish.
func TestGracefulDrain(t *testing.T) {
	release := make(chan struct{})
	dest := testutil.ServeTCP(t, func(c net.Conn) {
		_, _ = io.CopyN(io.Discard, c, 4)
		<-release
		_, _ = io.WriteString(c, "finished")
		_ = c.(*net.TCPConn).CloseWrite()
	})
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + dest}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + dest, WaitReady: true})
	c := dial(t, cl.Addr)
	_, err := c.Write([]byte("work"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return srv.Server.Registry().Len() == 1 }, 5*time.Second, 5*time.Millisecond)
	stopped := make(chan struct{})
	go func() { srv.Stop(t); close(stopped) }()
	require.Eventually(t, func() bool { return !srv.Server.Ready() }, 5*time.Second, 5*time.Millisecond, "readiness must go false first")
	close(release)
	require.NoError(t, c.CloseWrite())
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	assert.Equal(t, "finished", string(got))
	<-stopped
}

func TestNoSessionFailsCleanly(t *testing.T) {
	srv := testutil.StartServer(t, testutil.ServerOptions{})
	srv.Stop(t) // nothing listens at srv.Addr any more
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:9",
		Mutate: func(c *client.Config) { c.SessionWait = 200 * time.Millisecond }})
	refusedRead(t, cl.Addr)
	assert.Equal(t, 1.0, promtest.ToFloat64(cl.Metrics.StreamsTotal.WithLabelValues("no_session")))
}
