package integration

import (
	"encoding/base64"
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
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/ratecap"
	"github.com/quictun/quictun/pkg/usage"
	"github.com/quictun/quictun/server"
)

// hookAnswers is a local auth hook: for each secret it knows, the name and
// the extra fields (rateLimit, quota) of its answer.
func hookAnswers(t *testing.T, known map[string]map[string]string, secrets map[string][]byte) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q struct{ KeyID string }
		_ = json.NewDecoder(r.Body).Decode(&q)
		for name, secret := range secrets {
			if proto.KeyIDOf(secret).String() != q.KeyID {
				continue
			}
			a := map[string]string{"name": name, "secret": base64.StdEncoding.EncodeToString(secret)}
			for k, v := range known[name] {
				a[k] = v
			}
			_ = json.NewEncoder(w).Encode(a)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// startHookedServer runs a server that holds alice's key, keeps accounts,
// has no cap or quota configured, and asks hookURL about other keys.
func startHookedServer(t *testing.T, hookURL string, allow string) (*testutil.Server, *usage.Ledger) {
	t.Helper()
	hook, err := authhook.New(authhook.Config{URL: hookURL, Timeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(hook.Close)
	ledger, err := usage.New(usage.Config{Path: filepath.Join(t.TempDir(), "usage.json")})
	require.NoError(t, err)
	keys, err := proto.NewKeyring(proto.Key{Name: "alice", Secret: aliceSecret})
	require.NoError(t, err)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{allow}, Mutate: func(c *server.Config) {
		c.Keys, c.KeyHook, c.Usage = keys, hook, ledger
	}})
	return srv, ledger
}

// TestAuthHookCaps (issue 35 item 7): a key the hook answers with
// "rateLimit": "20Mbit" is capped at 20 Mbit/s down, as with --rate-limit
// key=carol=20Mbit, on a server started without any cap; a key answered
// without one (dave) is not capped.
func TestAuthHookCaps(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a rate for seconds")
	}
	const capBytes = 20e6 / 8
	carol, dave := []byte("carol's secret, known to the hook"), []byte("dave's secret, known to the hook too")
	hook := hookAnswers(t, map[string]map[string]string{"carol": {"rateLimit": "20Mbit"}},
		map[string][]byte{"carol": carol, "dave": dave})
	source := testutil.ServeTCP(t, func(c net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	srv, _ := startHookedServer(t, hook.URL, "tcp:"+source)
	require.NotNil(t, srv.RateLimits(), "a hook that can answer caps gets the cap machinery without --rate-limit")

	download := func(secret []byte, n int, warm, window time.Duration) float64 {
		var got atomic.Int64
		cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + source, Secret: secret, WaitReady: true})
		var wg sync.WaitGroup
		var conns []net.Conn
		for range n {
			c := dial(t, cl.Addr)
			conns = append(conns, c)
			wg.Go(func() { _, _ = io.Copy(counterWriter{&got}, c) })
		}
		rate := measure(&got, warm, window)
		for _, c := range conns {
			_ = c.Close()
		}
		wg.Wait()
		return rate
	}
	rate := download(carol, 2, 1500*time.Millisecond, 3*time.Second)
	t.Logf("carol, capped by the hook's answer: %.2f Mbit/s (cap 20)", rate*8/1e6)
	capHolds(t, capBytes, rate, "carol")
	assert.Equal(t, ratecap.Rate{Down: capBytes, Up: capBytes}, srv.RateLimits().Rate("key=carol"))

	daveRate := download(dave, 1, 500*time.Millisecond, time.Second)
	t.Logf("dave, answered without a cap: %.2f Mbit/s", daveRate*8/1e6)
	assert.Greater(t, daveRate, 1.15*capBytes, "dave is not capped")
	assert.Equal(t, ratecap.Rate{}, srv.RateLimits().Rate("key=dave"))
}

// TestAuthHookQuota (issue 35 item 7): a key the hook answers with
// "quota": "100kB/1h" has its new tunnels refused with quota once its
// window holds that, as with --quota key=erin=100kB/1h.
func TestAuthHookQuota(t *testing.T) {
	echo := testutil.EchoServer(t)
	erin := []byte("erin's secret, known to the hook")
	hook := hookAnswers(t, map[string]map[string]string{"erin": {"quota": "100kB/1h"}}, map[string][]byte{"erin": erin})
	srv, ledger := startHookedServer(t, hook.URL, "tcp:"+echo)
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: erin, WaitReady: true})
	open := dial(t, cl.Addr)
	echoMsg(t, open, "erin's long tunnel")
	echoCheck(t, dial(t, cl.Addr), 60_000) // 120,000 bytes up and down
	require.Eventually(t, func() bool { u, _ := ledger.Identity("key=erin"); return u.OverQuota }, 10*time.Second, 20*time.Millisecond,
		"the hook's quota is counted")
	refusedRead(t, cl.Addr)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("quota")) == 1
	}, 5*time.Second, 10*time.Millisecond, "refused with its own code")
	echoMsg(t, open, "her open tunnel runs on")
}
