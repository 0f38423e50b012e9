package integration

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
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
	"github.com/quictun/quictun/server"
)

// TestAuthHook (issue 35 item 7): a client whose key the server does not
// hold is let in with the key the hook answers, as key=NAME; its repeated
// tunnels hit the cache; with the hook down, a client of an unknown key is
// refused (overloaded) within the hook's timeout, never hung.
func TestAuthHook(t *testing.T) {
	echo := testutil.EchoServer(t)
	carol := []byte("carol's secret, known to the hook")
	var calls atomic.Int64
	hookSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var q struct{ KeyID string }
		_ = json.NewDecoder(r.Body).Decode(&q)
		if q.KeyID != proto.KeyIDOf(carol).String() {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"name": "carol", "secret": base64.StdEncoding.EncodeToString(carol)})
	}))
	hook, err := authhook.New(authhook.Config{URL: hookSrv.URL, Timeout: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(hook.Close)
	keys, err := proto.NewKeyring(proto.Key{Name: "alice", Secret: aliceSecret})
	require.NoError(t, err)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.Keys, c.KeyHook = keys, hook
		c.AuditLog = true
	}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: carol, WaitReady: true})
	for range 5 {
		echoCheck(t, dial(t, cl.Addr), 1000)
	}
	assert.Equal(t, int64(1), calls.Load(), "the hook is asked once, then the cache answers")
	require.Eventually(t, func() bool {
		for _, c := range srv.ConnStats() {
			if c.ClientIdentity == "key=carol" {
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond, "the hook's name is the identity")

	hookSrv.Close() // the hook is down
	dave := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: []byte("dave's secret, unknown anywhere")})
	start := time.Now()
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.AuthFailuresTotal.WithLabelValues(egress.AuthHookUnavailable)) >= 1
	}, 10*time.Second, 10*time.Millisecond, "refused: hook unavailable")
	t.Logf("refused %v after the client started", time.Since(start))
	echoCheck(t, dial(t, cl.Addr), 1000) // carol's cached key still works
	_ = dave
}
