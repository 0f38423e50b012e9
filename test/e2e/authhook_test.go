package e2e

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/proto"
)

// TestAuthHookThroughBinaries (issue 35 item 7) on the built server with a
// local hook (plain http on loopback, as the flag allows): a client whose
// key only the hook knows gets in as key=carol, with the cap the answer
// carries; its repeated tunnels hit the cache (one call); an unknown key is
// refused and its 404 cached; the cache and in-flight gauges show it; with
// the hook stopped, carol's cached key keeps working.
func TestAuthHookThroughBinaries(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	aliceKey, carolKey := randomSecret(), randomSecret()
	// The daemons take a secret file's trimmed text as the secret; the
	// hook answers those bytes in base64.
	carolID := proto.KeyIDOf([]byte(carolKey)).String()
	var calls, unknown atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var q struct{ KeyID string }
		if err := json.NewDecoder(r.Body).Decode(&q); err != nil || r.Header.Get("Authorization") != "Bearer hook-token" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		if q.KeyID != carolID {
			unknown.Add(1)
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"name": "carol",
			"secret": base64.StdEncoding.EncodeToString([]byte(carolKey)), "rateLimit": "8Mbit"})
	}))
	defer hook.Close()
	keys := writeFile(t, "keys", "alice "+aliceKey+"\n")
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: []string{"--keys-file", keys,
		"--auth-hook", hook.URL + "/keys", "--auth-hook-token-file", writeFile(t, "hook-token", "hook-token\n")}})
	carol := startClient(t, srv, clientOpts{Token: "tcp:" + echo, SecretFile: writeFile(t, "carol", carolKey+"\n")})

	for i := range 3 {
		require.NoError(t, echoVia(t, carol.Addr, "carol's tunnel"), "tunnel %d", i)
	}
	assert.Equal(t, int64(1), calls.Load(), "the hook is asked once, then the cache answers")
	assert.Contains(t, identities(t, srv), "key=carol", "the hook's name is the identity")
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_auth_hook_calls_total", "result", "ok")
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_auth_hook_cache_entries")
	waitMetric(t, srv, ioTimeout, eq(0), "quictun_server_auth_hook_lookups_in_flight")

	// The answer's cap, 8 Mbit/s each way, holds: 1 MiB up and back
	// cannot take less than about a second (a loaded machine only makes
	// it slower).
	const n = 1 << 20
	start := time.Now()
	_, _, got, err := transfer(dialApp(t, carol.Addr), n)
	took := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, int64(n), got)
	t.Logf("1 MiB up and back under the hook's 8 Mbit/s cap: %v (%.2f Mbit/s)", took, float64(n)*8/took.Seconds()/1e6)
	floor := 800 * time.Millisecond // 0.8 x 1 MiB at 8 Mbit/s (1.05 s)
	assert.Greater(t, took, floor, "the hook's cap holds")

	dave := startClient(t, srv, clientOpts{Token: "tcp:" + echo, SecretFile: writeFile(t, "dave", randomSecret()+"\n"), NoWait: true})
	require.Error(t, echoVia(t, dave.Addr, "dave is refused"))
	waitMetric(t, srv, ioTimeout, ge(1), "quictun_server_auth_hook_calls_total", "result", "unknown")
	waitMetric(t, srv, ioTimeout, eq(2), "quictun_server_auth_hook_cache_entries")
	assert.GreaterOrEqual(t, unknown.Load(), int64(1))

	hook.Close() // the hook is down: the cached key keeps working
	require.NoError(t, echoVia(t, carol.Addr, "carol with the hook down"))
	srv.signal(t, syscall.SIGTERM)
}
