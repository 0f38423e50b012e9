package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quictun/quictun/pkg/admin"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/tunnel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type recorder struct {
	mu    sync.Mutex
	codes []proto.Code
}

func (r *recorder) Abort(c proto.Code) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.codes = append(r.codes, c)
}

func (r *recorder) got() []proto.Code {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]proto.Code(nil), r.codes...)
}

type env struct {
	h       http.Handler
	ready   *atomic.Bool
	reg     *tunnel.Registry
	tunnels []*tunnel.Tunnel
	aborter *recorder
	remove  []func()
}

// testHost is the Host the tests send: the loopback address the admin API
// listens on by default.
const testHost = "127.0.0.1:8086"

func newEnv(t *testing.T, token string, pprof bool, opts ...func(*admin.Options)) *env {
	t.Helper()
	preg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "quictun_test_total", Help: "Test counter."})
	c.Add(42)
	preg.MustRegister(c)
	e := &env{ready: new(atomic.Bool), reg: tunnel.NewRegistry(), aborter: &recorder{}}
	e.ready.Store(true)
	for i, d := range []string{"tcp:127.0.0.1:22", "tcp:127.0.0.1:80"} {
		tn := &tunnel.Tunnel{Destination: d, Source: "127.0.0.1:5000", CreatedAt: time.Now(),
			UUID:     fmt.Sprintf("0123abcd-0000-0000-0000-00000000000%d", i),
			Upstream: new(atomic.Int64), Downstream: new(atomic.Int64)}
		tn.Upstream.Store(int64(len(d)))
		e.remove = append(e.remove, e.reg.Add(tn, e.aborter))
		e.tunnels = append(e.tunnels, tn)
	}
	o := admin.Options{
		Gatherer: preg, Ready: e.ready.Load, Registry: e.reg,
		Conns: func() []transport.ConnStats {
			return []transport.ConnStats{{Label: "0", Transport: transport.TransportQUIC, RemoteAddress: "198.51.100.7:52100", LocalAddress: "0.0.0.0:7500", ClientIdentity: "key=ops", Stats: quic.ConnectionStats{
				SmoothedRTT: 20 * time.Millisecond, BytesSent: 1234, PacketsLost: 3, CongestionWindow: 9000,
			}}, transport.TCPConnStats("1", &net.TCPAddr{IP: net.IPv4(198, 51, 100, 8), Port: 40000}, &net.TCPAddr{Port: 7500})}
		},
		EnablePprof: pprof, BearerToken: token,
	}
	for _, f := range opts {
		f(&o)
	}
	e.h = admin.Handler(o)
	return e
}

func (e *env) do(t *testing.T, method, path, auth string) *httptest.ResponseRecorder {
	t.Helper()
	return e.doHost(t, method, path, testHost, "", auth)
}

// doHost sends a request with Host host and, when not empty, Origin origin.
func (e *env) doHost(t *testing.T, method, path, host, origin, auth string) *httptest.ResponseRecorder {
	t.Helper()
	req := get(method, path)
	req.Host = host
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rr := httptest.NewRecorder()
	e.h.ServeHTTP(rr, req)
	return rr
}

// get is httptest.NewRequest with the loopback Host the admin API accepts
// without a token (httptest's default, example.com, is refused).
func get(method, path string) *http.Request {
	req := httptest.NewRequest(method, path, nil)
	req.Host = testHost
	return req
}

func TestHealthAndReady(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", false)
	rr := e.do(t, http.MethodGet, "/healthz", "")
	assert.Equal(t, http.StatusOK, rr.Code)
	assert.Equal(t, "ok\n", rr.Body.String())

	assert.Equal(t, http.StatusOK, e.do(t, http.MethodGet, "/readyz", "").Code)
	e.ready.Store(false)
	assert.Equal(t, http.StatusServiceUnavailable, e.do(t, http.MethodGet, "/readyz", "").Code)
	assert.Equal(t, http.StatusOK, e.do(t, http.MethodGet, "/healthz", "").Code, "liveness does not follow readiness")
	e.ready.Store(true)
	assert.Equal(t, http.StatusOK, e.do(t, http.MethodGet, "/readyz", "").Code)

	// Without a Ready func the endpoint is always ready.
	h := admin.Handler(admin.Options{Gatherer: prometheus.NewRegistry()})
	rr = httptest.NewRecorder()
	h.ServeHTTP(rr, get(http.MethodGet, "/readyz"))
	assert.Equal(t, http.StatusOK, rr.Code)
}

// TestIndex: / on the admin port lists the endpoints it serves (issue 33: it
// was a bare 404); other unknown paths stay 404.
func TestIndex(t *testing.T) {
	t.Parallel()
	rr := newEnv(t, "", false).do(t, http.MethodGet, "/", "")
	require.Equal(t, http.StatusOK, rr.Code)
	for _, p := range []string{"GET /metrics", "GET /healthz", "GET /readyz", "GET /tunnels", "DELETE /tunnels/{id}", "GET /connections", "docs/operations.md"} {
		assert.Contains(t, rr.Body.String(), p)
	}
	assert.NotContains(t, rr.Body.String(), "pprof", "pprof is off")
	assert.NotContains(t, rr.Body.String(), "bearer token")
	assert.Contains(t, newEnv(t, "secret-token", true).do(t, http.MethodGet, "/", "").Body.String(), "GET /debug/pprof/         Go profiles (bearer token)")
	assert.Equal(t, http.StatusNotFound, newEnv(t, "", false).do(t, http.MethodGet, "/nothing", "").Code)
}

func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", false)
	rr := e.do(t, http.MethodGet, "/metrics", "")
	require.Equal(t, http.StatusOK, rr.Code)
	assert.Contains(t, rr.Body.String(), "quictun_test_total 42")
	assert.Contains(t, rr.Header().Get("Content-Type"), "text/plain")
}

func TestTunnelsListAndDelete(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", false)
	rr := e.do(t, http.MethodGet, "/tunnels", "")
	require.Equal(t, http.StatusOK, rr.Code)
	assert.Equal(t, "application/json", rr.Header().Get("Content-Type"))
	var list []map[string]any
	require.NoError(t, json.Unmarshal(rr.Body.Bytes(), &list))
	require.Len(t, list, 2)
	assert.Equal(t, "tcp:127.0.0.1:22", list[0]["serverAppAddr"])
	assert.Equal(t, "tcp:127.0.0.1:80", list[1]["serverAppAddr"])
	assert.InDelta(t, float64(len("tcp:127.0.0.1:22")), list[0]["upstreamBytes"], 0)
	for _, k := range []string{"uuid", "streamId", "connId", "endpoint", "clientAppAddr", "createdAt", "downstreamBytes", "upstreamBytesPerSec", "downstreamBytesPerSec"} {
		assert.Contains(t, list[0], k)
	}

	id := list[1]["uuid"].(string)
	assert.Equal(t, "0123abcd-0000-0000-0000-000000000001", id, "the tunnel's UUID, the same on both ends")
	rr = e.do(t, http.MethodDelete, "/tunnels/"+id, "")
	assert.Equal(t, http.StatusNoContent, rr.Code)
	assert.Equal(t, []proto.Code{proto.CodeShutdown}, e.aborter.got())

	e.remove[1]() // the aborted tunnel ends and removes itself
	assert.Equal(t, http.StatusNotFound, e.do(t, http.MethodDelete, "/tunnels/"+id, "").Code)
	assert.Len(t, e.aborter.got(), 1)

	assert.Equal(t, http.StatusNoContent, e.do(t, http.MethodDelete, fmt.Sprint("/tunnels/", e.tunnels[0].ID), "").Code,
		"the registry's ID in decimal still works")
	assert.Equal(t, http.StatusNotFound, e.do(t, http.MethodDelete, "/tunnels/0123abcd-0000-0000-0000-00000000000f", "").Code)
	for _, bad := range []string{"abc", "-1", "1.5", "99999999999999999999999", "0123ABCD-0000-0000-0000-000000000001"} {
		assert.Equal(t, http.StatusBadRequest, e.do(t, http.MethodDelete, "/tunnels/"+bad, "").Code, bad)
	}
	assert.Equal(t, http.StatusNotFound, e.do(t, http.MethodDelete, "/tunnels/12345", "").Code)
	assert.Equal(t, http.StatusMethodNotAllowed, e.do(t, http.MethodPost, "/tunnels", "").Code)

	// Empty registry: an empty JSON list, not null.
	e.remove[0]()
	rr = e.do(t, http.MethodGet, "/tunnels", "")
	assert.JSONEq(t, "[]", rr.Body.String())
}

func TestConnections(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", false)
	rr := e.do(t, http.MethodGet, "/connections", "")
	require.Equal(t, http.StatusOK, rr.Code)
	var out []map[string]any
	require.NoError(t, json.Unmarshal(rr.Body.Bytes(), &out))
	require.Len(t, out, 2)
	assert.Equal(t, "0", out[0]["id"])
	assert.Equal(t, "quic", out[0]["transport"])
	assert.Equal(t, "198.51.100.7:52100", out[0]["remoteAddress"])
	assert.Equal(t, "0.0.0.0:7500", out[0]["localAddress"])
	assert.Equal(t, "key=ops", out[0]["clientIdentity"])
	assert.InDelta(t, 0.02, out[0]["smoothedRttSeconds"], 1e-9)
	assert.InDelta(t, 1234, out[0]["bytesSent"], 0)
	assert.InDelta(t, 3, out[0]["packetsLost"], 0)
	assert.InDelta(t, 9000, out[0]["congestionWindowBytes"], 0)
	// A TCP fallback connection: its addresses, no QUIC figures.
	assert.Equal(t, "tcp", out[1]["transport"])
	assert.Equal(t, "198.51.100.8:40000", out[1]["remoteAddress"])
	assert.NotContains(t, out[1], "smoothedRttSeconds")
	assert.NotContains(t, out[1], "bytesSent")

	// Without Registry/Conns the endpoints do not exist.
	h := admin.Handler(admin.Options{Gatherer: prometheus.NewRegistry()})
	for _, p := range []string{"/tunnels", "/connections"} {
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, get(http.MethodGet, p))
		assert.Equal(t, http.StatusNotFound, rr.Code, p)
	}
}

func TestBearerToken(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef-admin"
	e := newEnv(t, token, true)
	tid := e.tunnels[0].ID
	for _, tc := range []struct {
		method, path string
		protected    bool
		okCode       int
	}{
		{http.MethodGet, "/metrics", true, http.StatusOK},
		{http.MethodGet, "/tunnels", true, http.StatusOK},
		{http.MethodGet, "/connections", true, http.StatusOK},
		{http.MethodGet, "/debug/pprof/", true, http.StatusOK},
		{http.MethodGet, "/debug/pprof/cmdline", true, http.StatusOK},
		{http.MethodDelete, "/tunnels/" + itoa(tid), true, http.StatusNoContent},
		{http.MethodGet, "/healthz", false, http.StatusOK},
		{http.MethodGet, "/readyz", false, http.StatusOK},
	} {
		t.Run(tc.method+tc.path, func(t *testing.T) {
			for _, auth := range []string{"", "Bearer wrong", "Bearer " + token + "x", "bearer " + token, token, "Basic " + token} {
				rr := e.do(t, tc.method, tc.path, auth)
				if tc.protected {
					assert.Equal(t, http.StatusUnauthorized, rr.Code, "auth %q", auth)
					assert.Equal(t, "Bearer", rr.Header().Get("WWW-Authenticate"))
					assert.NotContains(t, rr.Body.String(), "quictun_test_total")
				} else {
					assert.Equal(t, tc.okCode, rr.Code, "auth %q", auth)
				}
			}
			assert.Equal(t, tc.okCode, e.do(t, tc.method, tc.path, "Bearer "+token).Code)
		})
	}
	assert.Equal(t, []proto.Code{proto.CodeShutdown}, e.aborter.got(), "only the authorised DELETE aborted")
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// TestHostAndOriginGuard: without a valid token (none configured, or none
// presented) the admin API answers only a loopback or listener Host, refuses
// a state-changing request with any Origin and a read whose Origin is another
// host (DNS rebinding, issue 21); a valid token, /healthz and /readyz pass.
func TestHostAndOriginGuard(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef-admin"
	listener := &net.TCPAddr{IP: net.ParseIP("192.0.2.10"), Port: 8086}
	const (
		ok      = http.StatusOK
		deleted = http.StatusNoContent
		unauth  = http.StatusUnauthorized
		refused = http.StatusForbidden
	)
	for _, tc := range []struct {
		name           string
		token          string // configured
		method, path   string // path "/tunnels/ID" is the first tunnel's
		host, origin   string
		auth           string
		want           int
		reason         string // refusal counted, "" for none
		bodyContains   string
		tunnelSurvives bool
	}{
		// Host, no token configured.
		{name: "localhost", host: "localhost:8086", want: ok},
		{name: "localhost without port", host: "localhost", want: ok},
		{name: "LOCALHOST", host: "LOCALHOST:8086", want: ok},
		{name: "localhost FQDN", host: "localhost.:8086", want: ok},
		{name: "127.0.0.1", host: "127.0.0.1:8086", want: ok},
		{name: "127.0.0.0/8", host: "127.1.2.3:9", want: ok},
		{name: "[::1]", host: "[::1]:8086", want: ok},
		{name: "[::1] without port", host: "[::1]", want: ok},
		{name: "v4-mapped loopback", host: "[::ffff:127.0.0.1]:8086", want: ok},
		{name: "listener IP", host: "192.0.2.10:8086", want: ok},
		{name: "listener IP other port", host: "192.0.2.10:80", want: ok},
		{name: "listener IP without port", host: "192.0.2.10", want: ok},
		{name: "other IP", host: "192.0.2.11:8086", want: refused, reason: "host"},
		{name: "evil name", host: "evil.example:8086", want: refused, reason: "host", bodyContains: "--httpd-token-file"},
		{name: "evil name without port", host: "evil.example", want: refused, reason: "host"},
		{name: "localhost subdomain of evil", host: "localhost.evil.example:8086", want: refused, reason: "host"},
		{name: "evil subdomain localhost", host: "evil.localhost:8086", want: refused, reason: "host"},
		{name: "0.0.0.0", host: "0.0.0.0:8086", want: refused, reason: "host"},
		{name: "[::]", host: "[::]:8086", want: refused, reason: "host"},
		{name: "empty", host: "", want: refused, reason: "host"},
		{name: "malformed", host: "[::1:8086", want: refused, reason: "host"},
		{name: "metrics evil", path: "/metrics", host: "evil.example:8086", want: refused, reason: "host"},
		{name: "connections evil", path: "/connections", host: "evil.example:8086", want: refused, reason: "host"},
		{name: "delete evil", method: http.MethodDelete, path: "/tunnels/ID", host: "evil.example:8086", want: refused, reason: "host", tunnelSurvives: true},
		{name: "delete loopback", method: http.MethodDelete, path: "/tunnels/ID", host: "127.0.0.1:8086", want: deleted},
		// Probes answer any Host and Origin, with or without a token.
		{name: "healthz evil", path: "/healthz", host: "evil.example:8086", origin: "http://evil.example", want: ok},
		{name: "readyz evil", path: "/readyz", host: "evil.example:8086", origin: "http://evil.example", want: ok},
		{name: "healthz pod IP with token", token: token, path: "/healthz", host: "10.1.2.3:8086", want: ok},
		{name: "readyz pod IP with token", token: token, path: "/readyz", host: "10.1.2.3:8086", want: ok},

		// Origin, no token configured.
		{name: "GET same origin", host: "127.0.0.1:8086", origin: "http://127.0.0.1:8086", want: ok},
		{name: "GET same origin localhost", host: "localhost:8086", origin: "http://LOCALHOST:8086", want: ok},
		{name: "GET same origin [::1]", host: "[::1]:8086", origin: "http://[::1]:8086", want: ok},
		{name: "GET origin evil", host: "127.0.0.1:8086", origin: "http://evil.example", want: refused, reason: "origin", bodyContains: "Origin"},
		{name: "GET origin evil same port", host: "127.0.0.1:8086", origin: "http://evil.example:8086", want: refused, reason: "origin"},
		{name: "GET origin other loopback name", host: "127.0.0.1:8086", origin: "http://localhost:8086", want: refused, reason: "origin"},
		{name: "GET origin null", host: "127.0.0.1:8086", origin: "null", want: refused, reason: "origin"},
		{name: "GET origin garbage", host: "127.0.0.1:8086", origin: "::", want: refused, reason: "origin"},
		{name: "DELETE same origin", method: http.MethodDelete, path: "/tunnels/ID", host: "127.0.0.1:8086", origin: "http://127.0.0.1:8086", want: refused, reason: "origin", tunnelSurvives: true},
		{name: "DELETE origin evil", method: http.MethodDelete, path: "/tunnels/ID", host: "127.0.0.1:8086", origin: "http://evil.example", want: refused, reason: "origin", tunnelSurvives: true},
		{name: "POST origin", method: http.MethodPost, path: "/tunnels", host: "localhost:8086", origin: "http://localhost:8086", want: refused, reason: "origin"},

		// Token configured: a valid token passes whatever Host and Origin say (a
		// Prometheus scrape by IP); without it the guard comes first, then 401.
		{name: "token scrape by IP", token: token, path: "/metrics", host: "10.1.2.3:8086", auth: "Bearer " + token, want: ok},
		{name: "token evil host", token: token, host: "evil.example:8086", auth: "Bearer " + token, want: ok},
		{name: "token delete evil origin", token: token, method: http.MethodDelete, path: "/tunnels/ID", host: "evil.example", origin: "http://evil.example", auth: "Bearer " + token, want: deleted},
		{name: "token missing scrape by IP", token: token, path: "/metrics", host: "10.1.2.3:8086", want: refused, reason: "host"},
		{name: "token wrong evil host", token: token, host: "evil.example:8086", auth: "Bearer wrong", want: refused, reason: "host"},
		{name: "token missing loopback", token: token, host: "127.0.0.1:8086", want: unauth},
		{name: "token wrong delete origin", token: token, method: http.MethodDelete, path: "/tunnels/ID", host: "127.0.0.1:8086", origin: "http://127.0.0.1:8086", auth: "Bearer wrong", want: refused, reason: "origin", tunnelSurvives: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var refusalsMu sync.Mutex
			refusals := map[string]int{}
			e := newEnv(t, tc.token, false, func(o *admin.Options) {
				o.ListenAddr = listener
				o.Refused = func(reason string) { refusalsMu.Lock(); refusals[reason]++; refusalsMu.Unlock() }
			})
			method, path := tc.method, tc.path
			if method == "" {
				method = http.MethodGet
			}
			if path == "" {
				path = "/tunnels"
			}
			path = strings.Replace(path, "/tunnels/ID", "/tunnels/"+itoa(e.tunnels[0].ID), 1)
			rr := e.doHost(t, method, path, tc.host, tc.origin, tc.auth)
			assert.Equal(t, tc.want, rr.Code, rr.Body.String())
			if tc.bodyContains != "" {
				assert.Contains(t, rr.Body.String(), tc.bodyContains)
			}
			if tc.want == refused {
				assert.NotContains(t, rr.Body.String(), "tcp:127.0.0.1:22", "no tunnel data in a refusal")
			}
			for _, r := range admin.RefusedReasons() {
				want := 0
				if r == tc.reason {
					want = 1
				}
				refusalsMu.Lock()
				assert.Equal(t, want, refusals[r], "refusals with reason %s", r)
				refusalsMu.Unlock()
			}
			if tc.tunnelSurvives {
				assert.Empty(t, e.aborter.got(), "the refused DELETE must not abort the tunnel")
			}
		})
	}
}

func TestPprofOnlyWhenEnabled(t *testing.T) {
	t.Parallel()
	off := newEnv(t, "", false)
	on := newEnv(t, "", true)
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/symbol", "/debug/pprof/goroutine"} {
		assert.Equal(t, http.StatusNotFound, off.do(t, http.MethodGet, p, "").Code, p)
		assert.Equal(t, http.StatusOK, on.do(t, http.MethodGet, p, "").Code, p)
	}
}

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:8086", true},
		{"127.1.2.3:80", true},
		{"[::1]:8086", true},
		{"localhost:8086", true},
		{"LOCALHOST:1", true},
		{"[::ffff:127.0.0.1]:80", true},
		{"0.0.0.0:8086", false},
		{":8086", false},
		{"[::]:8086", false},
		{"10.0.0.1:8086", false},
		{"example.com:80", false},
		{"localhost.example.com:80", false},
		{"127.0.0.1", false},
		{"", false},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, admin.IsLoopback(tc.addr))
		})
	}
}

func TestServeStopsOnCancel(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e := newEnv(t, "", false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- admin.Serve(ctx, ln, e.h) }()

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + ln.Addr().String() + "/healthz")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, "ok\n", string(body))

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	_, err = cl.Get("http://" + ln.Addr().String() + "/healthz")
	assert.Error(t, err, "listener closed")
}

func TestServeListenerError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	err = admin.Serve(context.Background(), ln, http.NotFoundHandler())
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "admin server:"), err.Error())
}

func TestServeForceClosesAfterShutdownTimeout(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	handlerDone := make(chan struct{})
	started := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(handlerDone)
		close(started)
		select {
		case <-r.Context().Done(): // the connection was closed
		case <-release:
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- admin.Serve(ctx, ln, h) }()

	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	go func() {
		resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("http://" + ln.Addr().String() + "/slow")
		if err == nil {
			_ = resp.Body.Close()
		}
	}()
	<-started
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	select {
	case <-handlerDone:
	case <-time.After(2 * time.Second):
		t.Fatal("the active request was not closed after the shutdown timeout")
	}
}

// failingCollector always fails, next to a healthy metric.
type failingCollector struct{ desc *prometheus.Desc }

func (c failingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c failingCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(c.desc, errors.New("stats unavailable"))
}

func TestMetricsContinueOnError(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ok := prometheus.NewGauge(prometheus.GaugeOpts{Name: "quictun_test_up", Help: "Test gauge."})
	ok.Set(1)
	reg.MustRegister(ok, failingCollector{prometheus.NewDesc("quictun_test_broken", "Broken.", nil, nil)})
	h := admin.Handler(admin.Options{Gatherer: reg})
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, get(http.MethodGet, "/metrics"))
	assert.Equal(t, http.StatusOK, rr.Code, "one failing collector does not hide the others")
	assert.Contains(t, rr.Body.String(), "quictun_test_up 1")
}
