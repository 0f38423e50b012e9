package e2e

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// TestAuthHookCertificatesThroughBinaries (issue 35 item 7, mTLS
// subjects) on the built server with --client-ca-file and --auth-hook: the
// hook is asked about each client certificate by subject; the one it
// admits gets in, the one it refuses (403) is refused although the CA
// issued it and the client holds the server's secret
// (auth_failures_total{reason="hook_refused"}). With
// --auth-hook-certificates=false the CA alone admits them: the refused one
// gets in and the hook is never asked about a certificate.
func TestAuthHookCertificatesThroughBinaries(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	caFile, issue := testutil.ClientCAFiles(t)
	var mu sync.Mutex
	asked := map[string]int{}
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q struct{ Subject, SHA256 string }
		_ = json.NewDecoder(r.Body).Decode(&q)
		mu.Lock()
		asked[q.Subject]++
		mu.Unlock()
		if q.Subject != "CN=ci-runner" || len(q.SHA256) != 64 {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		_, _ = w.Write([]byte("{}"))
	}))
	defer hook.Close()
	calls := func(subject string) int { mu.Lock(); defer mu.Unlock(); return asked[subject] }
	client := func(srv *daemon, cn string, wait bool) *daemon {
		cert, key := issue(cn)
		return startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: []string{"--cert-file", cert, "--key-file", key}, NoWait: !wait})
	}

	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: []string{"--client-ca-file", caFile, "--auth-hook", hook.URL + "/auth"}})
	ci := client(srv, "ci-runner", true)
	for i := range 3 {
		require.NoError(t, echoVia(t, ci.Addr, "ci-runner's tunnel"), "tunnel %d", i)
	}
	assert.Equal(t, 1, calls("CN=ci-runner"), "asked once, then the cache answers")
	revoked := client(srv, "revoked", false)
	require.Error(t, echoVia(t, revoked.Addr, "revoked is refused"))
	waitMetric(t, srv, ioTimeout, ge(1), "quictun_server_auth_failures_total", "reason", "hook_refused")
	waitMetric(t, srv, ioTimeout, ge(1), "quictun_server_auth_hook_calls_total", "result", "refused")
	srv.signal(t, syscall.SIGTERM)

	before := calls("CN=revoked")
	off := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: []string{"--client-ca-file", caFile, "--auth-hook", hook.URL + "/auth",
		"--auth-hook-certificates=false"}})
	require.NoError(t, echoVia(t, client(off, "revoked", true).Addr, "the CA alone admits it"))
	assert.Equal(t, before, calls("CN=revoked"), "the hook is not asked about certificates")
	off.signal(t, syscall.SIGTERM)
}
