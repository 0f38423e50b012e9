package integration

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
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
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/server"
)

// rulesHook is a local auth hook answering carol (with the allow rules of
// the moment) and dave (with an invalid rule).
type rulesHook struct {
	carol, dave []byte
	mu          sync.Mutex
	allow       []string
	calls       atomic.Int64
}

func (h *rulesHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	var q struct{ KeyID string }
	_ = json.NewDecoder(r.Body).Decode(&q)
	h.mu.Lock()
	allow := h.allow
	h.mu.Unlock()
	switch q.KeyID {
	case proto.KeyIDOf(h.carol).String():
		_ = json.NewEncoder(w).Encode(map[string]any{"name": "carol", "secret": base64.StdEncoding.EncodeToString(h.carol), "allow": allow})
	case proto.KeyIDOf(h.dave).String():
		_ = json.NewEncoder(w).Encode(map[string]any{"name": "dave", "secret": base64.StdEncoding.EncodeToString(h.dave), "allow": []string{"tcp:10.0.0.0/8"}})
	default:
		http.NotFound(w, r)
	}
}

func (h *rulesHook) setAllow(rules ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.allow = rules
}

// TestAuthHookAllowRules (issue 35 item 7, "the rules"): a key the server
// does not hold reaches the destinations its hook answer's "allow" rules
// name, as with --allow-for key=carol=RULE: added to --allow and to the
// operator's own --allow-for key=carol, --deny still wins, and any other
// destination is refused (refused). A changed answer applies once the
// hook's TTL has passed. An answer with an invalid rule fails closed: the
// key is refused (overloaded, auth_failures_total{hook_unavailable}).
func TestAuthHookAllowRules(t *testing.T) {
	t.Parallel()
	a, b, denied, operators := testutil.EchoServer(t), testutil.EchoServer(t), testutil.EchoServer(t), testutil.EchoServer(t)
	hs := &rulesHook{carol: []byte("carol's secret, known to the hook"), dave: []byte("dave's secret, with a bad rule")}
	hs.setAllow("tcp:"+a, "tcp:"+denied)
	hookSrv := httptest.NewServer(hs)
	t.Cleanup(hookSrv.Close)
	const ttl = time.Minute
	var skew atomic.Int64 // the hook's clock runs this far ahead
	hook, err := authhook.New(authhook.Config{URL: hookSrv.URL, Timeout: 2 * time.Second, TTL: ttl,
		Now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }})
	require.NoError(t, err)
	t.Cleanup(hook.Close)
	keys, err := proto.NewKeyring(proto.Key{Name: "alice", Secret: aliceSecret})
	require.NoError(t, err)
	deny := []string{"tcp:" + denied}
	byID, err := endpoint.ParseRules([]string{"tcp:" + operators}, deny)
	require.NoError(t, err)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:192.0.2.1:9"}, Deny: deny, Mutate: func(c *server.Config) {
		c.Keys, c.KeyHook = keys, hook
		c.AllowFor = map[string]*endpoint.AllowList{"key=carol": byID}
	}})
	c := attackerConn(t, srv)
	open := func(secret []byte, dest string) proto.Code {
		return streamResult(t, c, signedHeaderKind(t, "tcp:"+dest, proto.KindTCP, secret))
	}

	assert.Equal(t, proto.CodeOK, open(hs.carol, a), "a destination the answer allows")
	assert.Equal(t, proto.CodeRefused, open(hs.carol, b), "one it does not")
	assert.Equal(t, proto.CodeRefused, open(hs.carol, denied), "--deny wins over the answer's rules")
	assert.Equal(t, proto.CodeOK, open(hs.carol, operators), "the operator's --allow-for key=carol adds up with the answer's")
	assert.Equal(t, proto.CodeRefused, open(aliceSecret, a), "the answer's rules are carol's only")
	assert.Equal(t, int64(1), hs.calls.Load(), "from the cache after the first")

	hs.setAllow("tcp:" + b)
	assert.Equal(t, proto.CodeOK, open(hs.carol, a), "the cached answer holds within the TTL")
	skew.Store(int64(ttl + time.Second))
	assert.Equal(t, proto.CodeOK, open(hs.carol, b), "the new answer, after the TTL, allows b")
	assert.Equal(t, proto.CodeRefused, open(hs.carol, a), "and no longer a")
	assert.Equal(t, int64(2), hs.calls.Load())

	unavailable := srv.Metrics.AuthFailuresTotal.WithLabelValues(egress.AuthHookUnavailable)
	before := promtest.ToFloat64(unavailable)
	assert.Equal(t, proto.CodeOverloaded, open(hs.dave, a), "an answer with an invalid rule fails closed")
	assert.InDelta(t, before+1, promtest.ToFloat64(unavailable), 0, "counted as a failed lookup")
	assert.Equal(t, proto.CodeOK, open(hs.carol, b), "the connection and carol are unaffected")
	require.NoError(t, c.Context().Err(), "a failed lookup keeps the connection")
}
