package integration

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/authhook"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/ratecap"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/usage"
	"github.com/quictun/quictun/server"
)

// certHookServer is a local auth hook answering about client certificates
// by subject: answers[subject] is the 200 body, a subject not there is
// refused (403). It counts the questions by subject.
type certHookServer struct {
	*httptest.Server
	mu    sync.Mutex
	asked map[string]int
}

func newCertHookServer(t *testing.T, answers map[string]map[string]any) *certHookServer {
	t.Helper()
	h := &certHookServer{asked: map[string]int{}}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q struct{ Subject, SHA256, Serial string }
		_ = json.NewDecoder(r.Body).Decode(&q)
		h.mu.Lock()
		h.asked[q.Subject]++
		h.mu.Unlock()
		a, ok := answers[q.Subject]
		if !ok || len(q.SHA256) != 64 || q.Serial == "" {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		_ = json.NewEncoder(w).Encode(a)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *certHookServer) calls(subject string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.asked[subject]
}

// startCertHookedServer runs a mutual-TLS server (keys: shared secrets as
// well, nil: none) that keeps accounts, has no cap or quota configured, and
// asks hookURL about each client certificate (--auth-hook with
// --client-ca-file).
func startCertHookedServer(t *testing.T, pool *x509.CertPool, hookURL string, keys *proto.Keyring, allow ...string) (*testutil.Server, *usage.Ledger) {
	t.Helper()
	hook, err := authhook.New(authhook.Config{URL: hookURL, Timeout: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(hook.Close)
	ledger, err := usage.New(usage.Config{Path: filepath.Join(t.TempDir(), "usage.json")})
	require.NoError(t, err)
	srv := testutil.StartServer(t, testutil.ServerOptions{NoAuth: keys == nil, Allow: allow, Mutate: func(c *server.Config) {
		c.TLS.ClientAuth, c.TLS.ClientCAs = tls.RequireAndVerifyClientCert, pool
		c.CertAuthHook, c.Usage = hook, ledger
		if keys != nil {
			c.Keys, c.KeyHook = keys, hook
		}
	}})
	return srv, ledger
}

// certClient starts a client presenting a certificate of cn (and secret's
// key, if not nil) for token.
func certClient(t *testing.T, srv *testutil.Server, issue func(string) tls.Certificate, cn, token string, secret []byte, ready bool) *testutil.Client {
	t.Helper()
	cert := issue(cn)
	return testutil.StartClient(t, srv, testutil.ClientOptions{Token: token, NoAuth: secret == nil, Secret: secret, WaitReady: ready,
		TLS: func(o *transport.ClientTLSOptions) { o.ClientCert = &cert }})
}

// TestAuthHookCertificates (issue 35 item 7, mTLS subjects): with
// --client-ca-file and --auth-hook, the hook is asked about each client
// certificate as {"subject": "CN=NAME", ...}: a certificate it answers 200
// is let in, with the answer's rules (a destination --allow does not
// name), cap and quota for CN=NAME; its repeated tunnels hit the cache; one
// it refuses (403) is refused with auth_failed (auth_failures_total
// reason hook_refused) although the CA issued it; with the hook down, a
// certificate not cached is refused with overloaded (hook_unavailable),
// while a cached one keeps working.
func TestAuthHookCertificates(t *testing.T) {
	common, private := testutil.EchoServer(t), testutil.EchoServer(t)
	pool, issue := testutil.ClientCA(t)
	hook := newCertHookServer(t, map[string]map[string]any{
		"CN=ci-runner": {"allow": []string{"tcp:" + private}, "rateLimit": "20Mbit", "quota": "100kB/1h"},
		"CN=someone":   {},
		"CN=late":      {},
	})
	srv, ledger := startCertHookedServer(t, pool, hook.URL, nil, "tcp:"+common)
	failures := func(reason string) float64 {
		return promtest.ToFloat64(srv.Metrics.AuthFailuresTotal.WithLabelValues(reason))
	}
	streams := func(code string) float64 { return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues(code)) }

	ci := certClient(t, srv, issue, "ci-runner", "tcp:"+private, nil, true)
	open := dial(t, ci.Addr)
	echoMsg(t, open, "ci-runner reaches what the hook's answer allows")
	echoMsg(t, dial(t, ci.Addr), "again, from the cache")
	assert.Equal(t, 1, hook.calls("CN=ci-runner"), "asked once, then the cache answers")
	require.NotNil(t, srv.RateLimits(), "the hook's caps get the cap machinery without --rate-limit")
	assert.Equal(t, ratecap.Rate{Down: 20e6 / 8, Up: 20e6 / 8}, srv.RateLimits().Rate("CN=ci-runner"), "the answer's cap is CN=ci-runner's")

	someone := certClient(t, srv, issue, "someone", "tcp:"+private, nil, true)
	expectRefusedBy(t, srv, someone, "not_allowed") // the rules are ci-runner's alone
	someoneCommon := certClient(t, srv, issue, "someone", "tcp:"+common, nil, true)
	echoCheck(t, dial(t, someoneCommon.Addr), 1000)

	before := streams("auth_failed")
	refusedRead(t, certClient(t, srv, issue, "revoked", "tcp:"+common, nil, false).Addr)
	require.Eventually(t, func() bool { return failures(egress.AuthHookRefused) >= 1 }, 10*time.Second, 10*time.Millisecond,
		"a certificate the hook refuses fails authentication")
	assert.Greater(t, streams("auth_failed"), before, "refused with auth_failed")
	assert.Positive(t, hook.calls("CN=revoked"))

	echoCheck(t, dial(t, ci.Addr), 60_000) // 120,000 bytes: over the answer's quota of 100 kB
	require.Eventually(t, func() bool { u, _ := ledger.Identity("CN=ci-runner"); return u.OverQuota }, 10*time.Second, 20*time.Millisecond,
		"the hook's quota is counted for CN=ci-runner")
	quota := streams("quota")
	refusedRead(t, ci.Addr)
	require.Eventually(t, func() bool { return streams("quota") == quota+1 }, 5*time.Second, 10*time.Millisecond, "refused with quota")

	hook.Close() // the hook is down
	start := time.Now()
	refusedRead(t, certClient(t, srv, issue, "late", "tcp:"+common, nil, false).Addr)
	require.Eventually(t, func() bool { return failures(egress.AuthHookUnavailable) >= 1 }, 10*time.Second, 10*time.Millisecond,
		"refused, fail closed, when the hook is down")
	t.Logf("a certificate not cached refused %v after its client started, the hook down", time.Since(start))
	assert.Positive(t, streams("overloaded"), "refused with overloaded: the client tries again")
	echoMsg(t, open, "ci-runner's open tunnel runs on")
	echoCheck(t, dial(t, someoneCommon.Addr), 1000) // its certificate's yes is cached (by the certificate: a new one would be asked about)
}

// TestClientCertificateAccountedByCN: on a mutual-TLS server without
// shared secrets, a connection is counted among its certificate's
// identity's (CN=NAME), and not as anonymous. Before, it was accounted as
// soon as it was accepted, before its handshake had shown the certificate
// (an early connection, for 0-RTT): as anonymous, and its downloads paced
// by anonymous's cap (TestAuthHookCertificateCap got 115 Mbit/s through a
// 20 Mbit/s cap).
func TestClientCertificateAccountedByCN(t *testing.T) {
	echo := testutil.EchoServer(t)
	pool, issue := testutil.ClientCA(t)
	hook := newCertHookServer(t, map[string]map[string]any{"CN=ci-runner": {}})
	srv, ledger := startCertHookedServer(t, pool, hook.URL, nil, "tcp:"+echo)
	cl := certClient(t, srv, issue, "ci-runner", "tcp:"+echo, nil, true)
	echoCheck(t, dial(t, cl.Addr), 1000)
	require.Eventually(t, func() bool { u, _ := ledger.Identity("CN=ci-runner"); return u.ActiveConnections == 1 }, 5*time.Second, 10*time.Millisecond,
		"the connection is CN=ci-runner's")
	_, anonymous := ledger.Identity(usage.Anonymous)
	assert.False(t, anonymous, "nothing accounted as anonymous")
}

// TestAuthHookCertificateCap: a certificate the hook answers with
// "rateLimit": "20Mbit" is held to 20 Mbit/s down on a server started
// without caps, as a key is (TestAuthHookCaps).
func TestAuthHookCertificateCap(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a rate for seconds")
	}
	const capBytes = 20e6 / 8
	source := testutil.ServeTCP(t, func(c net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	pool, issue := testutil.ClientCA(t)
	hook := newCertHookServer(t, map[string]map[string]any{"CN=ci-runner": {"rateLimit": "20Mbit"}})
	srv, _ := startCertHookedServer(t, pool, hook.URL, nil, "tcp:"+source)
	cl := certClient(t, srv, issue, "ci-runner", "tcp:"+source, nil, true)
	var got atomic.Int64
	var wg sync.WaitGroup
	var conns []net.Conn
	for range 2 {
		c := dial(t, cl.Addr)
		conns = append(conns, c)
		wg.Go(func() { _, _ = io.Copy(counterWriter{&got}, c) })
	}
	rate := measure(&got, 1500*time.Millisecond, 3*time.Second)
	for _, c := range conns {
		_ = c.Close()
	}
	wg.Wait()
	t.Logf("CN=ci-runner, capped by the hook's answer: %.2f Mbit/s (cap 20)", rate*8/1e6)
	capHolds(t, capBytes, rate, "CN=ci-runner")
}

// TestAuthHookCertificateWithKey: a client with a certificate and a key the
// server holds is asked about by its certificate too (the key alone would
// not ask the hook): both must pass. A certificate the hook refuses is
// refused whatever the key; one it admits is CN=NAME,key=NAME.
func TestAuthHookCertificateWithKey(t *testing.T) {
	echo := testutil.EchoServer(t)
	pool, issue := testutil.ClientCA(t)
	hook := newCertHookServer(t, map[string]map[string]any{"CN=ci-runner": {}})
	keys, err := proto.NewKeyring(proto.Key{Name: "alice", Secret: aliceSecret})
	require.NoError(t, err)
	srv, _ := startCertHookedServer(t, pool, hook.URL, keys, "tcp:"+echo)
	cl := certClient(t, srv, issue, "ci-runner", "tcp:"+echo, aliceSecret, true)
	echoCheck(t, dial(t, cl.Addr), 1000)
	require.Eventually(t, func() bool {
		for _, c := range srv.ConnStats() {
			if c.ClientIdentity == "CN=ci-runner,key=alice" {
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond, "both identities")
	assert.Equal(t, 1, hook.calls("CN=ci-runner"))

	refusedRead(t, certClient(t, srv, issue, "revoked", "tcp:"+echo, aliceSecret, false).Addr)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.AuthFailuresTotal.WithLabelValues(egress.AuthHookRefused)) >= 1
	}, 10*time.Second, 10*time.Millisecond, "the certificate is refused although the key is held")
	assert.Zero(t, promtest.ToFloat64(srv.Metrics.AuthFailuresTotal.WithLabelValues(egress.AuthUnknownKey)))
}
