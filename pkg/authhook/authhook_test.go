package authhook

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/ratecap"
	"github.com/quictun/quictun/pkg/usage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hookServer answers for the secrets it holds, counting calls and the most
// in flight at once; delay holds each answer.
type hookServer struct {
	secrets  map[proto.KeyID][]byte
	names    map[proto.KeyID]string
	delay    time.Duration
	calls    atomic.Int64
	inFlight atomic.Int64
	maxSeen  atomic.Int64
	wrongID  bool
}

func newHookServer(n int) *hookServer {
	h := &hookServer{secrets: map[proto.KeyID][]byte{}, names: map[proto.KeyID]string{}}
	for i := range n {
		s := fmt.Appendf(nil, "hook secret of user %d, long", i)
		id := proto.KeyIDOf(s)
		h.secrets[id], h.names[id] = s, fmt.Sprintf("user-%d", i)
	}
	return h
}

func (h *hookServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	n := h.inFlight.Add(1)
	defer h.inFlight.Add(-1)
	for m := h.maxSeen.Load(); n > m && !h.maxSeen.CompareAndSwap(m, n); m = h.maxSeen.Load() {
	}
	if h.delay > 0 {
		select {
		case <-time.After(h.delay):
		case <-r.Context().Done():
			return
		}
	}
	var q struct{ KeyID string }
	_ = json.NewDecoder(r.Body).Decode(&q)
	for id, s := range h.secrets {
		if id.String() == q.KeyID {
			if h.wrongID {
				s = []byte("another secret entirely, long enough")
			}
			_ = json.NewEncoder(w).Encode(map[string]string{"name": h.names[id], "secret": base64.StdEncoding.EncodeToString(s)})
			return
		}
	}
	http.NotFound(w, r)
}

func newHook(t *testing.T, hs *hookServer, mutate func(*Config)) *Hook {
	t.Helper()
	srv := httptest.NewServer(hs)
	t.Cleanup(srv.Close)
	cfg := Config{URL: srv.URL}
	if mutate != nil {
		mutate(&cfg)
	}
	h, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(h.Close)
	return h
}

// TestLookupCaches: a known key is answered and cached (one call for many
// lookups); an unknown one is refused and cached too.
func TestLookupCaches(t *testing.T) {
	t.Parallel()
	hs := newHookServer(3)
	h := newHook(t, hs, nil)
	var known proto.KeyID
	for id := range hs.secrets {
		known = id
		break
	}
	for range 10 {
		k, err := h.Lookup(context.Background(), known)
		require.NoError(t, err)
		assert.Equal(t, hs.names[known], k.Name)
		assert.Equal(t, known, k.ID)
	}
	assert.Equal(t, int64(1), hs.calls.Load(), "cached")
	unknown := proto.KeyIDOf([]byte("nobody's secret, long enough"))
	for range 10 {
		_, err := h.Lookup(context.Background(), unknown)
		require.ErrorIs(t, err, proto.ErrUnknownKey)
	}
	assert.Equal(t, int64(2), hs.calls.Load(), "negative answers cached")
}

// TestLookupBoundsInFlight: a flood of distinct unknown key IDs makes at
// most MaxInFlight calls at once; the others fail at once with ErrBusy; one
// ID asked many times at once makes one call.
func TestLookupBoundsInFlight(t *testing.T) {
	t.Parallel()
	hs := newHookServer(0)
	hs.delay = 2 * time.Second
	h := newHook(t, hs, func(c *Config) { c.MaxInFlight, c.Timeout = 4, 5*time.Second })
	var wg sync.WaitGroup
	var busy atomic.Int64
	for i := range 1000 {
		wg.Go(func() {
			_, err := h.Lookup(context.Background(), proto.KeyIDOf(fmt.Appendf(nil, "random %d", i%500)))
			if err == ErrBusy {
				busy.Add(1)
			}
		})
	}
	wg.Wait()
	assert.GreaterOrEqual(t, busy.Load(), int64(1000-4*2), "all but the first four IDs (asked twice each) refused at once")
	assert.LessOrEqual(t, hs.maxSeen.Load(), int64(4))
	assert.LessOrEqual(t, hs.calls.Load(), int64(4))
}

// TestLookupFailsClosed: a slow hook fails the lookup within Timeout, a
// down one at once; an answer whose secret is not the asked ID's is
// refused.
func TestLookupFailsClosed(t *testing.T) {
	t.Parallel()
	hs := newHookServer(1)
	hs.delay = 3 * time.Second // slower than the timeout
	h := newHook(t, hs, func(c *Config) { c.Timeout = 100 * time.Millisecond })
	var id proto.KeyID
	for k := range hs.secrets {
		id = k
	}
	start := time.Now()
	_, err := h.Lookup(context.Background(), id)
	require.Error(t, err)
	assert.NotErrorIs(t, err, proto.ErrUnknownKey)
	assert.Less(t, time.Since(start), 5*time.Second)

	down, err := New(Config{URL: "http://127.0.0.1:1/hook"})
	require.NoError(t, err)
	defer down.Close()
	_, err = down.Lookup(context.Background(), id)
	require.Error(t, err)

	wrong := newHookServer(1)
	wrong.wrongID = true
	hw := newHook(t, wrong, nil)
	for k := range wrong.secrets {
		_, err = hw.Lookup(context.Background(), k)
	}
	require.ErrorContains(t, err, "the secret's key ID is not the one asked about")
}

// TestLookupAtScale (issue 35's hook targets, at the package level): 1,000
// distinct keys answered by a local hook, each asked twice (the second from
// the cache: 1,000 calls); then 10,000 random unknown key IDs with at most
// MaxInFlight calls at the hook at once and the cache within MaxEntries.
func TestLookupAtScale(t *testing.T) {
	t.Parallel()
	hs := newHookServer(1000)
	h := newHook(t, hs, func(c *Config) { c.MaxInFlight, c.MaxEntries = 16, 2000 })
	for range 2 {
		for id, name := range hs.names {
			k, err := h.Lookup(context.Background(), id)
			require.NoError(t, err)
			require.Equal(t, name, k.Name)
		}
	}
	assert.Equal(t, int64(1000), hs.calls.Load(), "the second round from the cache")

	var wg sync.WaitGroup
	var busy, unknown atomic.Int64
	for w := range 64 {
		wg.Go(func() {
			for i := range 10_000 / 64 {
				_, err := h.Lookup(context.Background(), proto.KeyIDOf(fmt.Appendf(nil, "random %d/%d", w, i)))
				switch {
				case errors.Is(err, ErrBusy):
					busy.Add(1)
				case errors.Is(err, proto.ErrUnknownKey):
					unknown.Add(1)
				default:
					t.Errorf("lookup: %v", err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("10,000 unknown key IDs: %d refused by the hook, %d refused at once (busy); at most %d calls in flight",
		unknown.Load(), busy.Load(), hs.maxSeen.Load())
	assert.LessOrEqual(t, hs.maxSeen.Load(), int64(16))
	h.mu.Lock()
	n := len(h.cache)
	h.mu.Unlock()
	assert.LessOrEqual(t, n, 2000, "the cache stays within MaxEntries")
}

// TestEvictionAmortized: with the cache full and its entries expiring one
// by one as new ones come (a flood of unknown key IDs at a steady rate), a
// scan of the whole cache is followed by at least a tenth of MaxEntries
// new entries before the next, and the cache stays within MaxEntries.
// Before, evict freed a single entry once the cache was full (its loop
// over "an arbitrary tenth" stopped as soon as the cache was under
// MaxEntries), so every answer past a full cache scanned the whole cache
// under the Hook's lock: 2 scans by entry 1,001 here, one per entry after.
func TestEvictionAmortized(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	h, err := New(Config{URL: "http://127.0.0.1:1/", MaxEntries: 1000, Now: func() time.Time { return now }})
	require.NoError(t, err)
	const ttl = 1000 * time.Millisecond
	for i := range 2000 {
		if i >= 1000 {
			now = now.Add(time.Millisecond) // one entry expires per new one
		}
		h.mu.Lock()
		h.store(query{keyID: proto.KeyIDOf(fmt.Appendf(nil, "unknown key %d", i))}, entry{err: proto.ErrUnknownKey, expires: now.Add(ttl)})
		n, scans := len(h.cache), h.scans
		h.mu.Unlock()
		require.LessOrEqual(t, n, 1000, "entry %d", i)
		allowed := 0
		if i >= 1000 {
			allowed = 1 + (i-1000)/100
		}
		require.LessOrEqual(t, scans, allowed, "entry %d: scans of the whole cache", i)
	}
	t.Logf("1,000 entries past a full cache of 1,000: %d scans", h.scans)
}

// TestLookupFreesItsSlotBeforeAnswering: one caller looking key IDs up one
// after the other never finds the lookups all taken, even with one: a
// lookup's slot is free once its answer is. Before, the slot was freed
// after the waiters were woken, so the next lookup could be refused busy.
func TestLookupFreesItsSlotBeforeAnswering(t *testing.T) {
	t.Parallel()
	hs := newHookServer(0)
	h := newHook(t, hs, func(c *Config) { c.MaxInFlight = 1 })
	busy := 0
	for i := range 500 {
		_, err := h.Lookup(context.Background(), proto.KeyIDOf(fmt.Appendf(nil, "unknown %d", i)))
		if errors.Is(err, ErrBusy) {
			busy++
			continue
		}
		require.ErrorIs(t, err, proto.ErrUnknownKey)
	}
	assert.Zero(t, busy, "sequential lookups refused busy")
}

// carolHook is a Hook asking a local hook that answers every key ID with
// "carol" and secret, plus extra's fields; calls counts its answers.
func carolHook(t *testing.T, secret []byte, extra map[string]any) (*Hook, *atomic.Int64) {
	t.Helper()
	calls := new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		a := map[string]any{"name": "carol", "secret": base64.StdEncoding.EncodeToString(secret)}
		maps.Copy(a, extra)
		_ = json.NewEncoder(w).Encode(a)
	}))
	t.Cleanup(srv.Close)
	h, err := New(Config{URL: srv.URL})
	require.NoError(t, err)
	t.Cleanup(h.Close)
	return h, calls
}

// TestAnswerCarriesLimits: an answer's optional rateLimit and quota are
// parsed with --rate-limit's and --quota's syntax and bounds and cached
// with the key; a bad one fails the lookup (fail closed), as a bad secret.
func TestAnswerCarriesLimits(t *testing.T) {
	t.Parallel()
	secret := []byte("carol's secret, known to the hook")
	id := proto.KeyIDOf(secret)
	for _, tc := range []struct {
		name      string
		extra     map[string]any
		want      Limits
		wantError string
	}{
		{name: "none", want: Limits{}},
		{name: "rate", extra: map[string]any{"rateLimit": "20Mbit/5Mbit"},
			want: Limits{Rate: ratecap.Rate{Down: 20e6 / 8, Up: 5e6 / 8}, HasRate: true}},
		{name: "rate both ways", extra: map[string]any{"rateLimit": "1MiB"},
			want: Limits{Rate: ratecap.Rate{Down: 1 << 20, Up: 1 << 20}, HasRate: true}},
		{name: "no cap", extra: map[string]any{"rateLimit": "0"}, want: Limits{HasRate: true}},
		{name: "quota", extra: map[string]any{"quota": "100GiB/30d"},
			want: Limits{Quota: usage.Quota{Bytes: 100 << 30, Window: 30 * 24 * time.Hour}, HasQuota: true}},
		{name: "both", extra: map[string]any{"rateLimit": "40Mbit", "quota": "1GB/1h"},
			want: Limits{Rate: ratecap.Rate{Down: 5e6, Up: 5e6}, HasRate: true, Quota: usage.Quota{Bytes: 1e9, Window: time.Hour}, HasQuota: true}},
		{name: "rate without a unit", extra: map[string]any{"rateLimit": "20"}, wantError: "rateLimit"},
		{name: "rate under the floor", extra: map[string]any{"rateLimit": "4bit"}, wantError: "at least 8kbit"},
		{name: "quota without a window", extra: map[string]any{"quota": "10GiB"}, wantError: "quota"},
		{name: "quota window too long", extra: map[string]any{"quota": "10GiB/400d"}, wantError: "quota"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, calls := carolHook(t, secret, tc.extra)
			for range 3 {
				k, l, err := h.Answer(context.Background(), id)
				if tc.wantError != "" {
					require.ErrorContains(t, err, tc.wantError)
					assert.NotErrorIs(t, err, proto.ErrUnknownKey, "a bad answer is a failure, not an unknown key")
					continue
				}
				require.NoError(t, err)
				assert.Equal(t, "carol", k.Name)
				assert.Equal(t, tc.want, l)
			}
			if tc.wantError == "" {
				assert.Equal(t, int64(1), calls.Load(), "the limits are cached with the key")
			}
			_, err := h.Lookup(context.Background(), id)
			assert.Equal(t, tc.wantError == "", err == nil, "Lookup agrees with Answer")
		})
	}
}

// TestAnswerCarriesAllowRules: an answer's optional "allow" rules are
// parsed as --allow-for RULEs, within MaxAllowRules rules of at most
// MaxAllowRuleLen bytes, and cached with the key; too many, too long or
// invalid ones fail the lookup (fail closed), as a bad secret.
func TestAnswerCarriesAllowRules(t *testing.T) {
	t.Parallel()
	secret := []byte("carol's secret, known to the hook")
	id := proto.KeyIDOf(secret)
	many, named := make([]string, MaxAllowRules+1), make([]string, MaxAllowRules+1)
	for i := range many {
		many[i] = fmt.Sprintf("tcp:10.0.0.%d:5432", i)
		named[i] = fmt.Sprintf("rule%d=%s", i, many[i])
	}
	for _, tc := range []struct {
		name      string
		allow     any // the answer's "allow" (absent: nil)
		want      []string
		wantError string
	}{
		{name: "absent"},
		{name: "empty", allow: []string{}},
		{name: "one", allow: []string{"tcp:10.0.0.5:5432"}, want: []string{"rule0=tcp:10.0.0.5:5432"}},
		{name: "named and udp", allow: []string{"db=tcp:db.internal:5432", "udp:10.0.0.53:53", "unix:/run/app.sock"},
			want: []string{"db=tcp:db.internal:5432", "rule1=udp:10.0.0.53:53", "rule2=unix:/run/app.sock"}},
		{name: "at the bound", allow: many[:MaxAllowRules], want: named[:MaxAllowRules]},
		{name: "too many", allow: many, wantError: "65 rules, at most 64"},
		{name: "too long", allow: []string{"tcp:" + strings.Repeat("a", MaxAllowRuleLen) + ":22"}, wantError: "at most 512"},
		{name: "invalid", allow: []string{"tcp:10.0.0.5:5432", "tcp:10.0.0.0/8"}, wantError: "allow rule 1"},
		{name: "empty rule", allow: []string{""}, wantError: "allow"},
		{name: "not a list", allow: "tcp:10.0.0.5:5432", wantError: "answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var extra map[string]any
			if tc.allow != nil {
				extra = map[string]any{"allow": tc.allow}
			}
			h, calls := carolHook(t, secret, extra)
			for range 3 {
				k, l, err := h.Answer(context.Background(), id)
				if tc.wantError != "" {
					require.ErrorContains(t, err, tc.wantError)
					assert.NotErrorIs(t, err, proto.ErrUnknownKey, "a bad answer is a failure, not an unknown key")
					assert.Empty(t, k.Secret, "no key from a refused answer")
					continue
				}
				require.NoError(t, err)
				assert.Equal(t, "carol", k.Name)
				if tc.want == nil {
					assert.Nil(t, l.Allow, "no rules given")
					continue
				}
				require.NotNil(t, l.Allow)
				assert.Equal(t, tc.want, l.Allow.Rules())
				assert.Empty(t, l.Allow.DenyRules(), "the server adds its --deny")
			}
			if tc.wantError == "" {
				assert.Equal(t, int64(1), calls.Load(), "the rules are cached with the key")
			}
		})
	}
}
