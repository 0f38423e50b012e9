package integration

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
)

// killableProxy relays TCP connections to target until kill, which closes
// its listener and resets every connection at once: to the client, the
// server behind it died (kill -9: its port refuses, its connections end).
type killableProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newKillableProxy(t *testing.T, target string) *killableProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &killableProxy{ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(s, c); _ = s.Close() })
			p.wg.Go(func() { _, _ = io.Copy(c, s); _ = c.Close() })
		}
	})
	t.Cleanup(p.kill)
	return p
}

func (p *killableProxy) addr() string { return p.ln.Addr().String() }

func (p *killableProxy) kill() {
	_ = p.ln.Close()
	p.cut()
	p.wg.Wait()
}

// cut resets the connections relayed now; new ones are still accepted.
func (p *killableProxy) cut() {
	p.mu.Lock()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
}

// TestTCPFailoverAcrossServers (issue 33): two servers, UDP blocked from
// the start: tunnels go over TCP to the first; when it dies (its TCP port
// refuses, its connection is reset) a new tunnel succeeds over TCP to the
// second, within 3 s.
func TestTCPFailoverAcrossServers(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	state := t.TempDir()
	var srv [2]*testutil.Server
	var proxy [2]*killableProxy
	tcpAddrs := map[string]string{}
	var addrs []string
	for i := range srv {
		srv[i] = testutil.StartServer(t, testutil.ServerOptions{StateDir: state, TCP: true, Allow: []string{"tcp:" + echo}})
		proxy[i] = newKillableProxy(t, srv[i].TCPAddr)
		addrs = append(addrs, srv[i].Addr)
		tcpAddrs[srv[i].Addr] = proxy[i].addr()
	}
	gate := &udpGate{}
	gate.blocked.Store(true)
	cl := testutil.StartClient(t, srv[0], testutil.ClientOptions{Token: "tcp:" + echo, WrapConn: gate.wrap,
		Mutate: func(c *client.Config) {
			c.Servers, c.TCPServers = addrs, tcpAddrs
			c.DrainTimeout = 500 * time.Millisecond
		}})
	require.NoError(t, tcpEcho(cl.Addr, "first", 20*time.Second), "the first tunnel, over TCP")
	assert.Equal(t, 1.0, promtest.ToFloat64(srv[0].Metrics.ActiveTCPConnections), "to the first server")
	assert.Equal(t, 1.0, promtest.ToFloat64(cl.Metrics.Transport.WithLabelValues("tcp")))

	proxy[0].kill()
	killed := time.Now()
	// A tunnel opened before the client has read the reset goes on the
	// dead connection and is reset too: try until one gets through.
	require.Eventually(t, func() bool { return tcpEcho(cl.Addr, "after", 2*time.Second) == nil }, 10*time.Second, 10*time.Millisecond,
		"a new tunnel after the first server died")
	took := time.Since(killed)
	t.Logf("a new tunnel over TCP to the second server %v after the first died", took.Round(time.Millisecond))
	assert.Less(t, took, 3*time.Second)
	assert.Equal(t, 1.0, promtest.ToFloat64(srv[1].Metrics.ActiveTCPConnections), "over TCP to the second server")
	for _, tn := range cl.Client.Registry().List(time.Now()) {
		assert.Equal(t, "tcp", tn.Transport)
	}
}

// TestTCPModeSeveralServers (issue 33): --transport tcp with two servers
// carries tunnels over TCP and fails over to the second when the first
// dies.
func TestTCPModeSeveralServers(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	state := t.TempDir()
	var srv [2]*testutil.Server
	var proxy [2]*killableProxy
	tcpAddrs := map[string]string{}
	var addrs []string
	for i := range srv {
		srv[i] = testutil.StartServer(t, testutil.ServerOptions{StateDir: state, TCP: true, Allow: []string{"tcp:" + echo}})
		proxy[i] = newKillableProxy(t, srv[i].TCPAddr)
		addrs = append(addrs, srv[i].Addr)
		tcpAddrs[srv[i].Addr] = proxy[i].addr()
	}
	cl := testutil.StartClient(t, srv[0], testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true,
		Mutate: func(c *client.Config) {
			c.Servers, c.TCPServers, c.Transport = addrs, tcpAddrs, client.TransportTCP
		}})
	// A TCP link per server, as QUIC's: the second one is a warm standby.
	for i := range srv {
		require.Eventually(t, func() bool { return promtest.ToFloat64(srv[i].Metrics.ActiveTCPConnections) == 1 }, 10*time.Second,
			10*time.Millisecond, "server %d's TCP connection", i)
	}
	long := dial(t, cl.Addr)
	echoOnce(t, long, "held open")
	require.Eventually(t, func() bool { return active(srv[0]) == 1 && active(srv[1]) == 0 }, 10*time.Second, 10*time.Millisecond,
		"failover: tunnels on the first server")
	proxy[0].kill()
	require.Eventually(t, func() bool { return tcpEcho(cl.Addr, "after", 2*time.Second) == nil }, 10*time.Second, 10*time.Millisecond,
		"a new tunnel after the first server died")
	assert.Equal(t, 1.0, promtest.ToFloat64(srv[1].Metrics.ActiveTCPConnections))
	assert.Zero(t, promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("ok")), "no QUIC with --transport tcp")
}

// TestTCPModeSpread (issue 33): --transport tcp with two servers in spread
// mode places tunnels on both servers' TCP connections, as QUIC's links.
func TestTCPModeSpread(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	state := t.TempDir()
	var srv [2]*testutil.Server
	var addrs []string
	tcpAddrs := map[string]string{}
	for i := range srv {
		srv[i] = testutil.StartServer(t, testutil.ServerOptions{StateDir: state, TCP: true, Allow: []string{"tcp:" + echo}})
		addrs = append(addrs, srv[i].Addr)
		tcpAddrs[srv[i].Addr] = srv[i].TCPAddr
	}
	cl := testutil.StartClient(t, srv[0], testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true,
		Mutate: func(c *client.Config) {
			c.Servers, c.TCPServers, c.Transport, c.Mode = addrs, tcpAddrs, client.TransportTCP, client.ModeSpread
		}})
	for i := range srv {
		require.Eventually(t, func() bool { return promtest.ToFloat64(srv[i].Metrics.ActiveTCPConnections) == 1 }, 10*time.Second,
			10*time.Millisecond, "server %d's TCP connection", i)
	}
	for i := range 10 {
		echoOnce(t, dial(t, cl.Addr), "held open "+string(rune('a'+i))) // held open until the test ends
	}
	require.Eventually(t, func() bool { return active(srv[0])+active(srv[1]) == 10 }, 10*time.Second, 10*time.Millisecond)
	a, b := active(srv[0]), active(srv[1])
	t.Logf("10 tunnels: %d on the first server, %d on the second", a, b)
	assert.InDelta(t, 5, a, 1, "spread by streams")
}

// TestWrongSecretAttempts (issue 33): a client with a wrong secret and
// UDP open backs off (a few attempts, QUIC and TCP together, not a
// reconnect loop), never falls back to TCP (the server answered over UDP),
// and says so once at -v 0, naming the fix.
func TestWrongSecretAttempts(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Allow: []string{"tcp:" + echo}})
	var logs logLines
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: []byte("not-the-right-secret-at-all"),
		Logger: logs.logger(), Mutate: func(c *client.Config) {
			c.TCPServerAddr = srv.TCPAddr
			c.Backoff = client.DefaultBackoff() // the binary's pacing, not the tests' quicker one
		}})
	const window = 6 * time.Second
	time.Sleep(window) // what happens in a fixed window of wall time is what is counted
	// Each attempt counts once (0rtt_rejected marks an attempt counted as
	// ok too).
	var quic, tcp float64
	for _, r := range []string{"ok", "ok_0rtt", "error", "auth_failed", "cert_rejected"} {
		n := promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues(r))
		t.Logf("QUIC attempts %s: %v", r, n)
		quic += n
	}
	for _, r := range []string{"ok", "error", "cert_rejected"} {
		tcp += promtest.ToFloat64(cl.Metrics.TCPDialsTotal.WithLabelValues(r))
	}
	t.Logf("in %v: %v QUIC attempts, %v TCP attempts; log:\n%s", window, quic, tcp, &logs)
	assert.LessOrEqual(t, quic+tcp, 5.0, "attempts in %v (2 s doubling, full jitter)", window)
	assert.GreaterOrEqual(t, quic, 1.0)
	assert.Zero(t, tcp, "no TCP fallback: the server answered over UDP")
	assert.Equal(t, 1, logs.count("Server rejected our credentials", "same secret as the server's --secret-file"), "logs: %s", &logs)
	lines := strings.Count(logs.String(), "\n")
	assert.LessOrEqual(t, lines, 5, "lines at -v 0: %s", &logs)
}

// TestTCPReconnectResumes (issue 33): a TCP connection that comes back
// after a loss resumes its TLS session (a ticket the client kept for that
// server): one round trip and no certificate chain less.
func TestTCPReconnectResumes(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Allow: []string{"tcp:" + echo}})
	proxy := newKillableProxy(t, srv.TCPAddr)
	logs := &logLines{verbosity: 2}
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true, Logger: logs.logger(),
		Mutate: func(c *client.Config) { c.Transport, c.TCPServerAddr = client.TransportTCP, proxy.addr() }})
	require.NoError(t, tcpEcho(cl.Addr, "first", 10*time.Second))
	assert.Equal(t, 1, logs.count("Connected to server over TCP", `"resumed"=false`), "the first handshake is a full one: %s", logs)
	proxy.cut()
	require.Eventually(t, func() bool { return logs.count("Connected to server over TCP") == 2 }, 10*time.Second, 10*time.Millisecond,
		"the client reconnects: %s", logs)
	assert.Equal(t, 1, logs.count("Connected to server over TCP", `"resumed"=true`), "the reconnect resumes: %s", logs)
	require.Eventually(t, func() bool { return tcpEcho(cl.Addr, "after", 2*time.Second) == nil }, 10*time.Second, 10*time.Millisecond)
}

// TestUDPBlockedSaidAtOnce (issue 33): with UDP blocked from the start the
// -v 0 log says tunnels go over TCP as soon as its connection is up, and
// the transport gauge says so, before any tunnel; the QUIC attempts that
// get no answer meanwhile are not errors at -v 0.
func TestUDPBlockedSaidAtOnce(t *testing.T) {
	t.Parallel()
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true})
	gate := &udpGate{}
	gate.blocked.Store(true)
	var logs logLines
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:1", WrapConn: gate.wrap, Logger: logs.logger(),
		Mutate: func(c *client.Config) { c.TCPServerAddr = srv.TCPAddr }})
	require.Eventually(t, func() bool { return logs.count("New tunnels go over TCP") == 1 }, 20*time.Second, 10*time.Millisecond,
		"said with no tunnel opened: %s", &logs)
	assert.Equal(t, 1.0, promtest.ToFloat64(cl.Metrics.Transport.WithLabelValues("tcp")))
	require.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("error")) >= 1 },
		20*time.Second, 10*time.Millisecond, "a QUIC attempt timed out")
	assert.Zero(t, logs.count("Could not connect to server"), "logs: %s", &logs)
}
