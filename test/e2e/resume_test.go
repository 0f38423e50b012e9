package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	quicproxy "github.com/quic-go/quic-go/integrationtests/tools/proxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// darkProxy is a UDP proxy in front of addr that drops every packet while
// dark is true: a blackout of the link between the binaries.
func darkProxy(t *testing.T, addr string, dark *atomic.Bool) string {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	sa, err := net.ResolveUDPAddr("udp", addr)
	require.NoError(t, err)
	p := &quicproxy.Proxy{Conn: pc, ServerAddr: sa,
		DropPacket: func(quicproxy.Direction, net.Addr, net.Addr, []byte) bool { return dark.Load() }}
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Close(); _ = pc.Close() })
	return pc.LocalAddr().String()
}

// TestResumeBlackoutPastIdleTimeout (issue 34 part 1), through the built
// binaries: with --resume-window on both, a tunnel to an echo survives a
// blackout longer than --idle-timeout (both QUIC connections time out; the
// applications keep writing meanwhile): every byte comes back once and in
// order (SHA-256), and both daemons count the tunnel parked and resumed.
func TestResumeBlackoutPastIdleTimeout(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	args := []string{"--resume-window", "1m", "--idle-timeout", "2s", "--keepalive-period", "500ms"}
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: args})
	var dark atomic.Bool
	proxied := *srv
	proxied.Addr = darkProxy(t, srv.Addr, &dark)
	cl := startClient(t, &proxied, clientOpts{Token: "tcp:" + echo, Args: args})

	c := dialApp(t, cl.Addr)
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	const part = 4 << 20
	sentH, gotH := sha256.New(), sha256.New()
	var got atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(io.MultiWriter(gotH, counter{&got}), c) })
	send := func() error {
		_, err := io.CopyN(io.MultiWriter(c, sentH), rand.Reader, part)
		return err
	}
	require.NoError(t, send())
	waitFor(t, time.Minute, "the first part echoed", func() bool { return got.Load() == part })

	dark.Store(true)
	blackoutStart := time.Now()
	sent2 := make(chan error, 1)
	go func() { sent2 <- send() }() // written while the link is dark: held by the client's tunnel
	for _, d := range []*daemon{srv, cl} {
		waitMetric(t, d, time.Minute, eq(1), metricPrefix(d, srv)+"_tunnels_parked_total")
	}
	dark.Store(false)
	t.Logf("blackout %s (idle timeout 2s)", time.Since(blackoutStart).Round(100*time.Millisecond))
	require.NoError(t, <-sent2)
	require.NoError(t, c.CloseWrite())
	wg.Wait()
	assert.Equal(t, int64(2*part), got.Load())
	assert.Equal(t, sentH.Sum(nil), gotH.Sum(nil), "echoed bytes, once and in order")
	for _, d := range []*daemon{srv, cl} {
		m := scrape(t, d)
		p := metricPrefix(d, srv)
		assert.Equal(t, 1.0, m.val(p+"_tunnels_resumed_total"), p)
		assert.Zero(t, m.val(p+"_tunnels_resume_gaveup_total", "reason", "window"), p)
	}
	// The client resent what the application wrote in the dark (the server
	// had nothing to send then: the echo's bytes were all confirmed).
	assert.Positive(t, scrape(t, cl).val("quictun_client_tunnels_resume_resent_bytes_total"))
}

func metricPrefix(d, srv *daemon) string {
	if d == srv {
		return "quictun_server"
	}
	return "quictun_client"
}

type counter struct{ n *atomic.Int64 }

func (c counter) Write(p []byte) (int, error) { c.n.Add(int64(len(p))); return len(p), nil }

// TestResumeWindowReload: --resume-window is reloadable (SIGHUP, YAML key
// resume-window) for the tunnels opened afterwards: after a blackout past
// --idle-timeout, a tunnel opened before the reload is reset, one opened
// after it is resumed.
func TestResumeWindowReload(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	args := []string{"--idle-timeout", "2s", "--keepalive-period", "500ms"}
	srvCfg := writeFile(t, "server.yaml", "allow: [tcp:"+echo+"]\n")
	cliCfg := writeFile(t, "client.yaml", "heartbeat-interval: 200ms\n")
	srv := startServer(t, serverOpts{Args: append([]string{"--config", srvCfg}, args...)})
	var dark atomic.Bool
	proxied := *srv
	proxied.Addr = darkProxy(t, srv.Addr, &dark)
	cl := startClient(t, &proxied, clientOpts{Token: "tcp:" + echo, Args: append([]string{"--config", cliCfg}, args...)})

	before := dialApp(t, cl.Addr)
	require.NoError(t, roundTrip(before, "before the reload"))
	require.NoError(t, os.WriteFile(srvCfg, []byte("allow: [tcp:"+echo+"]\nresume-window: 1m\n"), 0o600))
	require.NoError(t, os.WriteFile(cliCfg, []byte("heartbeat-interval: 200ms\nresume-window: 1m\n"), 0o600))
	for _, d := range []*daemon{srv, cl} {
		d.signal(t, syscall.SIGHUP)
		waitMetric(t, d, ioTimeout, eq(1), metricPrefix(d, srv)+"_config_reloads_total", "result", "success")
		waitFor(t, ioTimeout, "the new window logged", func() bool { return strings.Contains(d.log(), `resumeWindow="1m0s"`) })
	}
	after := dialApp(t, cl.Addr)
	require.NoError(t, roundTrip(after, "after the reload"))

	dark.Store(true)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("client log:\n%s", cl.log())
		}
	})
	for _, d := range []*daemon{srv, cl} {
		waitMetric(t, d, time.Minute, eq(1), metricPrefix(d, srv)+"_tunnels_parked_total")
	}
	dark.Store(false)
	require.NoError(t, roundTrip(after, "the tunnel opened after the reload survived"))
	_ = before.SetReadDeadline(time.Now().Add(ioTimeout))
	_, err := before.Read(make([]byte, 1))
	require.True(t, isReset(err), "the tunnel opened before the reload is reset as without resumption, got %v", err)
	for _, d := range []*daemon{srv, cl} {
		assert.Equal(t, 1.0, scrape(t, d).val(metricPrefix(d, srv)+"_tunnels_resumed_total"))
	}
}
