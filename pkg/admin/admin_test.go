package admin_test

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
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

func newEnv(t *testing.T, token string, pprof bool) *env {
	t.Helper()
	preg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "quictun_test_total", Help: "Test counter."})
	c.Add(42)
	preg.MustRegister(c)
	e := &env{ready: new(atomic.Bool), reg: tunnel.NewRegistry(), aborter: &recorder{}}
	e.ready.Store(true)
	for _, d := range []string{"tcp:127.0.0.1:22", "tcp:127.0.0.1:80"} {
		tn := &tunnel.Tunnel{Destination: d, Source: "127.0.0.1:5000", CreatedAt: time.Now(),
			Upstream: new(atomic.Int64), Downstream: new(atomic.Int64)}
		tn.Upstream.Store(int64(len(d)))
		e.remove = append(e.remove, e.reg.Add(tn, e.aborter))
		e.tunnels = append(e.tunnels, tn)
	}
	e.h = admin.Handler(admin.Options{
		Gatherer: preg, Ready: e.ready.Load, Registry: e.reg,
		Conns: func() []metrics.ConnStats {
			return []metrics.ConnStats{{Label: "0", Stats: quic.ConnectionStats{
				SmoothedRTT: 20 * time.Millisecond, BytesSent: 1234, PacketsLost: 3, CongestionWindow: 9000,
			}}}
		},
		EnablePprof: pprof, BearerToken: token,
	})
	return e
}

func (e *env) do(t *testing.T, method, path, auth string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rr := httptest.NewRecorder()
	e.h.ServeHTTP(rr, req)
	return rr
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
	h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	assert.Equal(t, http.StatusOK, rr.Code)
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
	rr = e.do(t, http.MethodDelete, "/tunnels/"+id, "")
	assert.Equal(t, http.StatusNoContent, rr.Code)
	assert.Equal(t, []proto.Code{proto.CodeShutdown}, e.aborter.got())

	e.remove[1]() // the aborted tunnel ends and removes itself
	assert.Equal(t, http.StatusNotFound, e.do(t, http.MethodDelete, "/tunnels/"+id, "").Code)
	assert.Len(t, e.aborter.got(), 1)

	for _, bad := range []string{"abc", "-1", "1.5", "99999999999999999999999"} {
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
	require.Len(t, out, 1)
	assert.Equal(t, "0", out[0]["id"])
	assert.InDelta(t, 0.02, out[0]["smoothedRttSeconds"], 1e-9)
	assert.InDelta(t, 1234, out[0]["bytesSent"], 0)
	assert.InDelta(t, 3, out[0]["packetsLost"], 0)
	assert.InDelta(t, 9000, out[0]["congestionWindowBytes"], 0)

	// Without Registry/Conns the endpoints do not exist.
	h := admin.Handler(admin.Options{Gatherer: prometheus.NewRegistry()})
	for _, p := range []string{"/tunnels", "/connections"} {
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, p, nil))
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
	h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	assert.Equal(t, http.StatusOK, rr.Code, "one failing collector does not hide the others")
	assert.Contains(t, rr.Body.String(), "quictun_test_up 1")
}
