package authhook

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/ratecap"
)

// testCert returns a self-signed certificate of cn with serial.
func testCert(t *testing.T, cn string, serial int64) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return c
}

// certQuestion is what the hook is sent about a certificate.
type certQuestion struct {
	Subject, SHA256, Serial string
	KeyID                   string `json:"keyId"`
}

// certHook is a Hook asking a local hook that answers each question with
// answer(q) (status and body); it records the questions.
func certHook(t *testing.T, answer func(q certQuestion) (int, any), mutate func(*Config)) (*Hook, *[]certQuestion, *sync.Mutex) {
	t.Helper()
	var mu sync.Mutex
	var asked []certQuestion
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q certQuestion
		_ = json.NewDecoder(r.Body).Decode(&q)
		mu.Lock()
		asked = append(asked, q)
		mu.Unlock()
		status, body := answer(q)
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(body)
	}))
	t.Cleanup(srv.Close)
	cfg := Config{URL: srv.URL}
	if mutate != nil {
		mutate(&cfg)
	}
	h, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(h.Close)
	return h, &asked, &mu
}

// TestCertificateAnswers: the hook is asked about a certificate with its
// identity, SHA-256 and serial; 200 is a yes with the answer's optional
// caps, quota and rules (cached: one call), 403 and 404 a no (ErrRefused,
// cached too), anything else a failure (not a refusal); a yes that carries
// a name or a secret, or limits that do not parse, fails (fail closed).
func TestCertificateAnswers(t *testing.T) {
	t.Parallel()
	cert := testCert(t, "ci-runner", 0x1f2e)
	sum := sha256.Sum256(cert.Raw)
	for _, tc := range []struct {
		name        string
		status      int
		body        any
		want        Limits
		wantRules   []string
		wantRefused bool
		wantError   string
		wantResult  string
	}{
		{name: "yes", status: 200, body: map[string]any{}, wantResult: "ok"},
		{name: "yes with limits", status: 200, body: map[string]any{"rateLimit": "20Mbit", "quota": "1GB/1h", "allow": []string{"tcp:10.0.0.5:5432"}},
			want:      Limits{Rate: ratecap.Rate{Down: 20e6 / 8, Up: 20e6 / 8}, HasRate: true},
			wantRules: []string{"rule0=tcp:10.0.0.5:5432"}, wantResult: "ok"},
		{name: "forbidden", status: 403, body: map[string]any{}, wantRefused: true, wantResult: "refused"},
		{name: "not found", status: 404, body: map[string]any{}, wantRefused: true, wantResult: "refused"},
		{name: "server error", status: 500, body: map[string]any{}, wantError: "status 500", wantResult: "error"},
		{name: "unauthorized", status: 401, body: map[string]any{}, wantError: "status 401", wantResult: "error"},
		{name: "a name", status: 200, body: map[string]any{"name": "carol"}, wantError: "no name or secret", wantResult: "error"},
		{name: "a secret", status: 200, body: map[string]any{"secret": "c2VjcmV0IHNlY3JldCBzZWNyZXQ="}, wantError: "no name or secret", wantResult: "error"},
		{name: "bad cap", status: 200, body: map[string]any{"rateLimit": "fast"}, wantError: "rateLimit", wantResult: "error"},
		{name: "bad rule", status: 200, body: map[string]any{"allow": []string{"tcp:10.0.0.0/8"}}, wantError: "allow", wantResult: "error"},
		{name: "not json", status: 200, body: "yes", wantError: "answer", wantResult: "error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var results sync.Map
			h, asked, mu := certHook(t, func(certQuestion) (int, any) { return tc.status, tc.body },
				func(c *Config) { c.Calls = func(r string) { results.Store(r, true) } })
			for range 3 {
				l, err := h.AnswerCertificate(context.Background(), "CN=ci-runner", cert)
				switch {
				case tc.wantRefused:
					require.ErrorIs(t, err, ErrRefused)
				case tc.wantError != "":
					require.ErrorContains(t, err, tc.wantError)
					assert.NotErrorIs(t, err, ErrRefused, "a failure is no refusal (overloaded, not auth_failed)")
				default:
					require.NoError(t, err)
					if tc.wantRules != nil {
						require.NotNil(t, l.Allow)
						assert.Equal(t, tc.wantRules, l.Allow.Rules())
						l.Allow = nil
					}
					assert.Equal(t, tc.want.Rate, l.Rate)
					assert.Equal(t, tc.want.HasRate, l.HasRate)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, *asked, 1, "cached (a failure for a second)")
			assert.Equal(t, certQuestion{Subject: "CN=ci-runner", SHA256: hex.EncodeToString(sum[:]), Serial: "1f2e"}, (*asked)[0])
			_, ok := results.Load(tc.wantResult)
			assert.True(t, ok, "counted as %s", tc.wantResult)
		})
	}
}

// TestCertificateCachedByFingerprint: answers are cached by certificate,
// not by subject, so that the hook can revoke one certificate of a name
// (by its SHA-256 or serial) and keep another; a refusal is cached for
// NegativeTTL, a yes for TTL, then the hook is asked again.
func TestCertificateCachedByFingerprint(t *testing.T) {
	t.Parallel()
	var now atomic.Pointer[time.Time]
	start := time.Unix(1_000_000, 0)
	now.Store(&start)
	advance := func(d time.Duration) { n := now.Load().Add(d); now.Store(&n) }
	old, renewed := testCert(t, "ci-runner", 1), testCert(t, "ci-runner", 2)
	var revoked atomic.Bool
	revoked.Store(true)
	h, asked, mu := certHook(t, func(q certQuestion) (int, any) {
		if q.Serial == "1" && revoked.Load() {
			return http.StatusForbidden, map[string]any{}
		}
		return http.StatusOK, map[string]any{}
	}, func(c *Config) {
		c.TTL, c.NegativeTTL = time.Minute, 10*time.Second
		c.Now = func() time.Time { return *now.Load() }
	})
	calls := func() int { mu.Lock(); defer mu.Unlock(); return len(*asked) }
	for range 3 {
		_, err := h.AnswerCertificate(context.Background(), "CN=ci-runner", old)
		require.ErrorIs(t, err, ErrRefused, "the revoked certificate")
		_, err = h.AnswerCertificate(context.Background(), "CN=ci-runner", renewed)
		require.NoError(t, err, "another certificate of the same name")
	}
	assert.Equal(t, 2, calls(), "one call per certificate")
	revoked.Store(false)
	advance(9 * time.Second)
	_, err := h.AnswerCertificate(context.Background(), "CN=ci-runner", old)
	require.ErrorIs(t, err, ErrRefused, "the refusal is cached for NegativeTTL")
	advance(2 * time.Second)
	_, err = h.AnswerCertificate(context.Background(), "CN=ci-runner", old)
	require.NoError(t, err, "asked again after NegativeTTL")
	assert.Equal(t, 3, calls())
	advance(50 * time.Second)
	_, err = h.AnswerCertificate(context.Background(), "CN=ci-runner", renewed)
	require.NoError(t, err)
	assert.Equal(t, 4, calls(), "the yes expired after TTL")
}

// TestCertificateFailsClosed: a slow hook fails the lookup within Timeout,
// a down one at once; neither is a refusal (the stream is refused with
// overloaded and the client tries again).
func TestCertificateFailsClosed(t *testing.T) {
	t.Parallel()
	cert := testCert(t, "ci-runner", 7)
	hang := make(chan struct{})
	h, _, _ := certHook(t, func(certQuestion) (int, any) { <-hang; return 200, map[string]any{} },
		func(c *Config) { c.Timeout = 100 * time.Millisecond })
	t.Cleanup(func() { close(hang) }) // before the hook server's Close, which waits for its handlers
	start := time.Now()
	_, err := h.AnswerCertificate(context.Background(), "CN=ci-runner", cert)
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrRefused)
	assert.Less(t, time.Since(start), 5*time.Second)

	down, err := New(Config{URL: "http://127.0.0.1:1/hook"})
	require.NoError(t, err)
	defer down.Close()
	_, err = down.AnswerCertificate(context.Background(), "CN=ci-runner", cert)
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrRefused)
}

// TestCertificatesShareTheBounds: certificates and key IDs share the
// lookups in flight: with MaxInFlight calls for certificates running, a
// further certificate and an unknown key ID are refused at once (ErrBusy),
// and the hook never sees more than MaxInFlight calls at once; one
// certificate asked many times at once makes one call.
func TestCertificatesShareTheBounds(t *testing.T) {
	t.Parallel()
	const slots = 4
	var inFlight, maxSeen atomic.Int64
	release := make(chan struct{})
	h, asked, mu := certHook(t, func(certQuestion) (int, any) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := maxSeen.Load(); n > m && !maxSeen.CompareAndSwap(m, n); m = maxSeen.Load() {
		}
		<-release
		return http.StatusOK, map[string]any{}
	}, func(c *Config) { c.MaxInFlight, c.Timeout = slots, 10*time.Second })
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the hook server's Close, which waits for its handlers
	certs := make([]*x509.Certificate, 40)
	for i := range certs {
		certs[i] = testCert(t, fmt.Sprintf("user-%d", i/2), int64(i+1))
	}
	var wg sync.WaitGroup
	var busy, ok atomic.Int64
	for i := range 200 { // each certificate 5 times
		wg.Go(func() {
			_, err := h.AnswerCertificate(context.Background(), "CN=x", certs[i%len(certs)])
			switch {
			case errors.Is(err, ErrBusy):
				busy.Add(1)
			case err == nil:
				ok.Add(1)
			default:
				t.Errorf("lookup: %v", err)
			}
		})
	}
	require.Eventually(t, func() bool { _, r := h.Len(); return r == slots }, 10*time.Second, 5*time.Millisecond)
	_, err := h.Lookup(context.Background(), proto.KeyIDOf([]byte("an unknown key's secret, long")))
	require.ErrorIs(t, err, ErrBusy, "key IDs and certificates share the slots")
	require.Eventually(t, func() bool { return busy.Load()+ok.Load() >= 200-slots*5 }, 10*time.Second, 5*time.Millisecond)
	unblock()
	wg.Wait()
	assert.LessOrEqual(t, maxSeen.Load(), int64(slots))
	mu.Lock()
	defer mu.Unlock()
	assert.LessOrEqual(t, len(*asked), slots, "one call per certificate, at most MaxInFlight")
	assert.GreaterOrEqual(t, busy.Load(), int64(200-slots*5), "the rest refused at once")
}
