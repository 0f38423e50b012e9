package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// probeResult is the part of `latency-client --json` the tests read.
type probeResult struct {
	Target        string   `json:"target"`
	FirstPacketMS float64  `json:"first_packet_ms"`
	P50MS         float64  `json:"p50_ms"`
	P99MS         float64  `json:"p99_ms"`
	MaxMS         float64  `json:"max_ms"`
	RoundTrips    int      `json:"round_trips"`
	Errors        int      `json:"errors"`
	ErrorMessages []string `json:"error_messages"`
}

// probe runs the latency-client probe against addr and parses its JSON output.
func probe(t *testing.T, addr string, number int) (probeResult, result) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	r := run(t, nil, bins.latency, "--server-host", host, "--server-port", port,
		"--number", fmt.Sprint(number), "--json", "--timeout", "2m") // bounds the whole run: 3000 round trips under -race on a loaded 2-core machine took over 25 s
	var pr probeResult
	if r.stdout != "" {
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &pr), "latency-client output: %q", r.stdout)
	}
	return pr, r
}

// TestEchoThroughBinaries: 10 MiB of random bytes each way through
// quictun-client → quictun-server → latency-client serve arrive intact, and
// the latency probe through the tunnel succeeds.
func TestEchoThroughBinaries(t *testing.T) {
	checkLeaks(t)
	echo := startLatencyServe(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo})

	const n = 10 << 20
	start := time.Now()
	sent, got, gotN, err := transfer(dialApp(t, cl.Addr), n)
	require.NoError(t, err)
	assert.Equal(t, int64(n), gotN)
	assert.Equal(t, sent, got, "SHA-256 of the echo differs from what was sent")
	t.Logf("10 MiB each way through the tunnel in %v (race=%v)", time.Since(start), raceEnabled)

	direct, r := probe(t, echo, 500)
	require.Equal(t, 0, r.code, r.stderr)
	tun, r := probe(t, cl.Addr, 500)
	require.Equal(t, 0, r.code, "probe through the tunnel: %s", r.stderr)
	assert.Zero(t, tun.Errors, tun.ErrorMessages)
	assert.Equal(t, 500, tun.RoundTrips)
	assert.Equal(t, "tcp:"+cl.Addr, tun.Target)
	assert.Positive(t, tun.P50MS)
	assert.GreaterOrEqual(t, tun.MaxMS, tun.P99MS)
	t.Logf("latency probe 500 x 1000 B: direct p50 %.3f ms p99 %.3f ms; tunnel p50 %.3f ms p99 %.3f ms first %.3f ms (p50 ratio %.1f)",
		direct.P50MS, direct.P99MS, tun.P50MS, tun.P99MS, tun.FirstPacketMS, tun.P50MS/direct.P50MS)
}

// lint runs promlint over an exposition and fails on every problem.
func lint(t *testing.T, who string, m metrics) {
	t.Helper()
	problems, err := promlint.New(strings.NewReader(m.raw)).Lint()
	require.NoError(t, err)
	for _, p := range problems {
		t.Errorf("%s /metrics: promlint: %s: %s", who, p.Metric, p.Text)
	}
}

// TestMetricsAfterTraffic: after known traffic, both ends' /metrics count the
// streams and the exact bytes, expose build info and QUIC state, and pass promlint.
func TestMetricsAfterTraffic(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo})

	sizes := []int64{1, 1000, 64 << 10, 1 << 20, 3<<20 + 7}
	var total int64
	for _, n := range sizes {
		sent, got, gotN, err := transfer(dialApp(t, cl.Addr), n)
		require.NoError(t, err)
		require.Equal(t, n, gotN)
		require.Equal(t, sent, got)
		total += n
	}
	streams := float64(len(sizes))
	// Counters are updated when a stream ends, a moment after the application sees EOF.
	waitMetric(t, cl, 10*time.Second, eq(streams), "quictun_client_streams_total", "result", "ok")
	waitMetric(t, srv, 10*time.Second, eq(streams), "quictun_server_streams_total", "result", "ok")

	cm, sm := scrape(t, cl), scrape(t, srv)
	for _, c := range []struct {
		m      metrics
		name   string
		labels []string
		want   float64
	}{
		{cm, "quictun_client_session_up", nil, 1},
		{cm, "quictun_client_accepted_connections_total", nil, streams},
		{cm, "quictun_client_streams_total", []string{"result", "ok"}, streams},
		{cm, "quictun_client_active_streams", nil, 0},
		{cm, "quictun_client_stream_bytes_total", []string{"direction", "upstream"}, float64(total)},
		{cm, "quictun_client_stream_bytes_total", []string{"direction", "downstream"}, float64(total)},
		{cm, "quictun_client_stream_open_duration_seconds", nil, streams},
		{cm, "quictun_client_dials_total", []string{"result", "ok"}, 1},
		{cm, "quictun_client_reconnects_total", nil, 0},
		{cm, "quictun_build_info", []string{"version", testVersion}, 1},
		{cm, "quictun_quic_connections", []string{"side", "client"}, 1},
		{sm, "quictun_server_streams_total", []string{"result", "ok"}, streams},
		{sm, "quictun_server_active_streams", nil, 0},
		{sm, "quictun_server_active_connections", nil, 1},
		{sm, "quictun_server_stream_bytes_total", []string{"direction", "upstream"}, float64(total)},
		{sm, "quictun_server_stream_bytes_total", []string{"direction", "downstream"}, float64(total)},
		{sm, "quictun_server_dial_duration_seconds", nil, streams},
		{sm, "quictun_server_draining", nil, 0},
		{sm, "quictun_build_info", []string{"version", testVersion}, 1},
		{sm, "quictun_quic_connections", []string{"side", "server"}, 1},
	} {
		v, ok := c.m.get(c.name, c.labels...)
		if assert.True(t, ok, "%s%v missing", c.name, c.labels) {
			assert.Equal(t, c.want, v, "%s%v", c.name, c.labels)
		}
	}
	// Each end sent and received total application bytes, plus QUIC overhead,
	// in packets of at most ~1450 bytes.
	for _, name := range []string{"quictun_quic_sent_bytes_total", "quictun_quic_received_bytes_total"} {
		assert.Greater(t, cm.val(name), float64(total), "client %s", name)
		assert.Greater(t, sm.val(name), float64(total), "server %s", name)
	}
	for _, name := range []string{"quictun_quic_packets_sent_total", "quictun_quic_packets_received_total"} {
		assert.Greater(t, cm.val(name), float64(total/1500), "client %s", name)
		assert.Greater(t, sm.val(name), float64(total/1500), "server %s", name)
	}
	for _, name := range []string{"quictun_quic_smoothed_rtt_seconds", "quictun_quic_min_rtt_seconds", "quictun_quic_congestion_window_bytes"} {
		v, ok := cm.get(name, "side", "client", "conn", "0")
		assert.True(t, ok && v > 0, "client %s = %v (present %v)", name, v, ok)
	}
	for _, m := range []metrics{cm, sm} {
		for _, name := range []string{"quictun_quic_packets_lost_total", "quictun_quic_connection_smoothed_rtt_seconds", "go_goroutines", "process_open_fds"} {
			_, ok := m.get(name)
			assert.True(t, ok, "%s missing", name)
		}
	}
	lint(t, "client", cm)
	lint(t, "server", sm)

	for _, d := range []*daemon{cl, srv} {
		for _, path := range []string{"/readyz", "/healthz"} {
			code, body := httpDo(http.MethodGet, d.AdminURL+path)
			assert.Equal(t, http.StatusOK, code, "%s %s: %s", d.name, path, body)
		}
	}
	var conns []struct {
		ID          string  `json:"id"`
		SmoothedRTT float64 `json:"smoothedRttSeconds"`
		BytesSent   uint64  `json:"bytesSent"`
	}
	code, body := httpDo(http.MethodGet, cl.AdminURL+"/connections")
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, json.Unmarshal([]byte(body), &conns), body)
	if assert.Len(t, conns, 1) {
		assert.Positive(t, conns[0].SmoothedRTT)
		assert.Greater(t, conns[0].BytesSent, uint64(total))
	}
}

// tunnelInfo is the part of GET /tunnels the tests read.
type tunnelInfo struct {
	UUID            string `json:"uuid"`
	ClientAppAddr   string `json:"clientAppAddr"`
	ServerAppAddr   string `json:"serverAppAddr"`
	UpstreamBytes   int64  `json:"upstreamBytes"`
	DownstreamBytes int64  `json:"downstreamBytes"`
}

func listTunnels(t *testing.T, d *daemon) []tunnelInfo {
	t.Helper()
	code, body := httpDo(http.MethodGet, d.AdminURL+"/tunnels")
	require.Equal(t, http.StatusOK, code, body)
	var out []tunnelInfo
	require.NoError(t, json.Unmarshal([]byte(body), &out), body)
	return out
}

// isReset reports whether err is a TCP reset as an application sees it.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// TestTunnelsAPI: an open tunnel is listed by both ends, under one uuid;
// DELETE on either end closes it and the application sees a reset, not a
// clean EOF. The server's /connections names each client's address and
// identity.
func TestTunnelsAPI(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo})

	var conns []struct {
		RemoteAddress  string `json:"remoteAddress"`
		LocalAddress   string `json:"localAddress"`
		ClientIdentity string `json:"clientIdentity"`
	}
	code, body := httpDo(http.MethodGet, srv.AdminURL+"/connections")
	require.Equal(t, http.StatusOK, code, body)
	require.NoError(t, json.Unmarshal([]byte(body), &conns), body)
	if assert.Len(t, conns, 1, body) {
		assert.Regexp(t, `^127\.0\.0\.1:\d+$`, conns[0].RemoteAddress, body)
		assert.Equal(t, srv.Addr, conns[0].LocalAddress, body)
		assert.Regexp(t, `^key=[0-9a-f]{8}$`, conns[0].ClientIdentity, "the key the client's hello proved: %s", body)
	}

	for i, end := range []*daemon{srv, cl} {
		c := dialApp(t, cl.Addr)
		_ = c.SetDeadline(time.Now().Add(ioTimeout))
		_, err := io.WriteString(c, "hello")
		require.NoError(t, err)
		buf := make([]byte, 5)
		_, err = io.ReadFull(c, buf)
		require.NoError(t, err)

		var st, ct []tunnelInfo
		waitFor(t, 5*time.Second, "both ends list the tunnel", func() bool {
			st, ct = listTunnels(t, srv), listTunnels(t, cl)
			return len(st) == 1 && len(ct) == 1 && st[0].UpstreamBytes == 5 && ct[0].DownstreamBytes == 5
		})
		assert.Equal(t, "tcp:"+echo, st[0].ServerAppAddr)
		assert.Equal(t, c.LocalAddr().String(), ct[0].ClientAppAddr)
		assert.Equal(t, "tcp:"+echo, ct[0].ServerAppAddr, "the client shows the destination it asked for, not the server (issue 12)")
		assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`, st[0].UUID)
		assert.Equal(t, st[0].UUID, ct[0].UUID, "one tunnel has one uuid on both ends (issue 20)")

		id := st[0].UUID
		if end == cl {
			id = ct[0].UUID
		}
		code, body := httpDo(http.MethodDelete, end.AdminURL+"/tunnels/"+id)
		require.Equal(t, http.StatusNoContent, code, body)
		_, err = io.ReadAll(c)
		assert.True(t, isReset(err), "DELETE on the %s: the application must see a reset, got %v", end.name, err)
		waitFor(t, 5*time.Second, "tunnel gone from both lists", func() bool {
			return len(listTunnels(t, srv)) == 0 && len(listTunnels(t, cl)) == 0
		})
		code, _ = httpDo(http.MethodDelete, end.AdminURL+"/tunnels/"+id)
		assert.Equal(t, http.StatusNotFound, code, "second DELETE")
		waitMetric(t, cl, 5*time.Second, eq(float64(i+1)), "quictun_client_streams_total", "result", "shutdown")
	}
	code, _ = httpDo(http.MethodDelete, srv.AdminURL+"/tunnels/abc")
	assert.Equal(t, http.StatusBadRequest, code)
	waitMetric(t, srv, 5*time.Second, eq(2), "quictun_server_streams_total", "result", "shutdown")
	assert.Equal(t, 0.0, scrape(t, srv).val("quictun_server_active_streams"))
}

// httpDoAuth is httpDo with an Authorization header.
func httpDoAuth(method, url, auth string) int {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return 0
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// TestAdminToken: the admin API refuses a non-loopback address without a
// token; with --httpd-token-file every endpoint but the probes needs it.
func TestAdminToken(t *testing.T) {
	checkLeaks(t)
	secret := newSecretFile(t)
	// 192.0.2.1 (TEST-NET-1) is not ours: the check must refuse it before any bind.
	r := run(t, nil, bins.server, "--secret-file", secret, "--state-dir", t.TempDir(), "--listen-on", "127.0.0.1:0",
		"--httpd-listen-on", "192.0.2.1:8086")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "--httpd-listen-on 192.0.2.1:8086 is not loopback: set --httpd-token-file")

	const token = "e2e-admin-token-0123456789"
	srv := startServer(t, serverOpts{Args: []string{"--httpd-token-file", writeFile(t, "admin-token", token+"\n"), "--enable-pprof"}})
	for _, path := range []string{"/metrics", "/tunnels", "/connections", "/debug/pprof/"} {
		assert.Equal(t, http.StatusUnauthorized, httpDoAuth(http.MethodGet, srv.AdminURL+path, ""), "%s without token", path)
		assert.Equal(t, http.StatusUnauthorized, httpDoAuth(http.MethodGet, srv.AdminURL+path, "Bearer wrong"), "%s wrong token", path)
		assert.Equal(t, http.StatusOK, httpDoAuth(http.MethodGet, srv.AdminURL+path, "Bearer "+token), "%s with token", path)
	}
	assert.Equal(t, http.StatusUnauthorized, httpDoAuth(http.MethodDelete, srv.AdminURL+"/tunnels/1", ""))
	for _, path := range []string{"/healthz", "/readyz"} {
		assert.Equal(t, http.StatusOK, httpDoAuth(http.MethodGet, srv.AdminURL+path, ""), "%s is for probes, no token", path)
	}
}

// httpDoHost is httpDo with the Host header set to host and, when not empty,
// an Origin header: what a browser sends for a page of that origin.
func httpDoHost(method, url, host, origin string) (int, string) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	req.Host = host
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// TestAdminHostOriginGuard: a web page cannot reach the token-less admin API
// of either end by DNS rebinding (Host: evil.example) nor with its Origin
// (issue 21): a DELETE /tunnels/{id} is refused with 403, the tunnel keeps
// working, and the refusals are counted by reason.
func TestAdminHostOriginGuard(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo})

	c := dialApp(t, cl.Addr)
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	roundTrip := func(msg string) {
		t.Helper()
		_, err := io.WriteString(c, msg)
		require.NoError(t, err)
		buf := make([]byte, len(msg))
		_, err = io.ReadFull(c, buf)
		require.NoError(t, err)
		require.Equal(t, msg, string(buf))
	}
	roundTrip("hello")
	var st, ct []tunnelInfo
	waitFor(t, 5*time.Second, "both ends list the tunnel", func() bool {
		st, ct = listTunnels(t, srv), listTunnels(t, cl)
		return len(st) == 1 && len(ct) == 1
	})

	for _, end := range []struct {
		d  *daemon
		id string
	}{{srv, st[0].UUID}, {cl, ct[0].UUID}} {
		evilHost := "evil.example:" + strconv.Itoa(end.d.adminPort)
		code, body := httpDoHost(http.MethodDelete, end.d.AdminURL+"/tunnels/"+end.id, evilHost, "")
		assert.Equal(t, http.StatusForbidden, code, "%s: DELETE with Host %s: %s", end.d.name, evilHost, body)
		assert.Contains(t, body, "--httpd-token-file", "the refusal names the fix")
		code, body = httpDoHost(http.MethodGet, end.d.AdminURL+"/tunnels", evilHost, "")
		assert.Equal(t, http.StatusForbidden, code, "%s: GET /tunnels with Host %s: %s", end.d.name, evilHost, body)
		code, body = httpDoHost(http.MethodDelete, end.d.AdminURL+"/tunnels/"+end.id, "127.0.0.1:"+strconv.Itoa(end.d.adminPort), "http://evil.example")
		assert.Equal(t, http.StatusForbidden, code, "%s: DELETE with an Origin: %s", end.d.name, body)
	}

	roundTrip("still here")
	assert.Len(t, listTunnels(t, srv), 1, "the server's tunnel survived")
	assert.Len(t, listTunnels(t, cl), 1, "the client's tunnel survived")
	assert.InDelta(t, 2, scrape(t, srv).val("quictun_server_admin_requests_refused_total", "reason", "host"), 0)
	assert.InDelta(t, 1, scrape(t, srv).val("quictun_server_admin_requests_refused_total", "reason", "origin"), 0)
	assert.InDelta(t, 2, scrape(t, cl).val("quictun_client_admin_requests_refused_total", "reason", "host"), 0)
	assert.InDelta(t, 1, scrape(t, cl).val("quictun_client_admin_requests_refused_total", "reason", "origin"), 0)
}
