package e2e

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// TestTCPFailoverUDPBlocked (issue 33) through the built binaries in two
// namespaces, UDP dropped on the link from the start: a client of two
// servers (each on TCP at its QUIC port) carries tunnels over TCP to the
// first; kill -9 the first: a new tunnel succeeds over TCP to the second
// within 3 s.
func TestTCPFailoverUDPBlocked(t *testing.T) {
	requireNetns(t)
	checkLeaks(t)
	ns := newNSPair(t)
	for _, n := range []string{ns.client, ns.server} {
		moveLocalRule(t, n)
		blockUDP(t, n)
	}
	echo := serveInNS(t, ns.server, echoConn)
	secret := newSecretFile(t)
	state := filepath.Join(t.TempDir(), "state")
	fp := strings.TrimSpace(run(t, nil, bins.server, "fingerprint", "--state-dir", state).stdout)
	var servers []*proc
	var endpoints []string
	for i, port := range []string{"7500", "7501"} {
		ep := serverNSIP + ":" + port
		admin := "127.0.0.1:" + []string{"8086", "8088"}[i]
		p := startInNS(t, ns.server, "quictun-server-"+port, bins.server, "--listen-on", ep, "--state-dir", state,
			"--secret-file", secret, "--httpd-listen-on", admin, "--allow", "tcp:"+echo, "-v", "2")
		waitNSReady(t, p, ns.server, "http://"+admin)
		servers = append(servers, p)
		endpoints = append(endpoints, ep)
	}
	const listen, clientURL = "127.0.0.1:6500", "http://127.0.0.1:8087"
	client := startInNS(t, ns.client, "quictun-client", bins.client, "--listen-on", "tcp:"+listen,
		"--server-endpoint", endpoints[0], "--server-endpoint", endpoints[1], "--server-fingerprint", fp,
		"--token-source", "tcp:"+echo, "--secret-file", secret, "--httpd-listen-on", strings.TrimPrefix(clientURL, "http://"), "-v", "2")
	waitFor(t, 30*time.Second, "the first tunnel over TCP", func() bool {
		if client.exited() {
			t.Fatalf("client exited:\n%s", client.log())
		}
		return nsEcho(ns.client, listen, "first", 2*time.Second) == nil
	})
	first := nsScrape(t, ns.server, "http://127.0.0.1:8086")
	assert.Equal(t, 1.0, first.val("quictun_server_active_tcp_connections"), "over TCP to the first server")
	assert.Equal(t, 1.0, nsScrape(t, ns.client, clientURL).val("quictun_client_transport", "transport", "tcp"))

	servers[0].kill(t)
	killed := time.Now()
	waitFor(t, 15*time.Second, "a new tunnel after the first server died", func() bool {
		return nsEcho(ns.client, listen, "after", 2*time.Second) == nil
	})
	took := time.Since(killed)
	t.Logf("a new tunnel over TCP to the second server %v after kill -9 of the first", took.Round(time.Millisecond))
	assert.Less(t, took, 3*time.Second, "target: within 3 s")
	assert.Equal(t, 1.0, nsScrape(t, ns.server, "http://127.0.0.1:8088").val("quictun_server_active_tcp_connections"),
		"over TCP to the second server")
}

// TestReverseForwardTransportTCP (issue 33): with --transport tcp the
// server listens for the client's --remote-forward over the TCP
// connection, and connections to it ping-pong through it.
func TestReverseForwardTransportTCP(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	listen := testutil.FreeAddr(t, "tcp")
	srv := startServer(t, serverOpts{Args: []string{"--allow-remote-listen", "tcp:" + listen}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: []string{"--transport", "tcp",
		"--remote-forward", "tcp:" + listen + "=tcp:" + echo}})
	var c net.Conn
	waitFor(t, 15*time.Second, "the server listens at "+listen, func() bool {
		var err error
		c, err = net.DialTimeout("tcp", listen, time.Second)
		return err == nil
	})
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	for i := range 100 {
		msg := []byte("ping " + strings.Repeat("x", i))
		_, err := c.Write(msg)
		require.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = io.ReadFull(c, got)
		require.NoError(t, err)
		require.Equal(t, msg, got)
	}
	assert.Equal(t, 1.0, scrape(t, srv).val("quictun_server_active_tcp_connections"), "the client came over TCP")
	assert.Zero(t, scrape(t, srv).val("quictun_server_refused_remote_listens_total", "reason", "needs_quic"))
	assert.Zero(t, scrape(t, cl).val("quictun_client_dials_total", "result", "ok"), "no QUIC")
}

// TestWrongSecretAttemptsAndLines (issue 33): a client with a wrong secret
// for 60 s: at most 10 connection attempts (QUIC and TCP together) and at
// most 5 lines at -v 0 (after the 4 start-up lines every client logs), the
// first naming the fix, and no "Connected to server" (that line waits for
// the server to accept our hello).
func TestWrongSecretAttemptsAndLines(t *testing.T) {
	if testing.Short() {
		t.Skip("60 s")
	}
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, SecretFile: newSecretFile(t), NoWait: true, Args: defaultLevel})
	time.Sleep(time.Minute) // what happens in one minute of wall time is what is counted
	m := scrape(t, cl)
	var attempts float64
	for _, r := range []string{"ok", "ok_0rtt", "error", "auth_failed", "cert_rejected"} {
		attempts += m.val("quictun_client_dials_total", "result", r)
	}
	for _, r := range []string{"ok", "error", "cert_rejected"} {
		attempts += m.val("quictun_client_tcp_dials_total", "result", r)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(cl.log()), "\n") {
		switch {
		case strings.Contains(l, `"Starting quictun-client"`), strings.Contains(l, `"Tunnel configured"`),
			strings.Contains(l, `"Admin server listening"`), strings.Contains(l, `"Listening for local connections"`):
			continue // the start-up lines, the same for every client
		}
		lines = append(lines, l)
	}
	t.Logf("one minute with a wrong secret: %v connection attempts; %d lines at -v 0 after the 4 start-up lines:\n%s",
		attempts, len(lines), strings.Join(lines, "\n"))
	assert.LessOrEqual(t, attempts, 10.0)
	assert.LessOrEqual(t, len(lines), 5)
	require.NotEmpty(t, lines)
	t.Logf("first line: %s", lines[0])
	assert.Contains(t, lines[0], `fix="`, "the first line names the fix")
	assert.Zero(t, count(cl.log(), "Connected to server"), "not connected while the server refuses our hello")
	for _, l := range lines {
		if strings.Contains(l, "rejected") || strings.Contains(l, "Could not") || strings.Contains(l, "Lost") {
			assert.Contains(t, l, `fix="`, "the first line about the failure names the fix")
			break
		}
	}
	assert.Equal(t, 1, count(cl.log(), "Server rejected our credentials", "--secret-file"), cl.log())
}
