package integration

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/authhook"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/server"
)

// scaleHook is a local auth hook (issue 35's targets) that knows n keys,
// user-0000 and on. It counts calls, per key ID too, and the most in flight
// at once; delay holds each answer; hang makes it answer nothing until the
// caller gives up.
type scaleHook struct {
	secrets  map[string][]byte // by key ID (hex)
	names    map[string]string
	delay    time.Duration
	hang     atomic.Bool
	stop     chan struct{} // closed by release
	stopOnce sync.Once
	calls    atomic.Int64
	inFlight atomic.Int64
	maxSeen  atomic.Int64

	mu    sync.Mutex
	perID map[string]int
}

// hookUserSecret is the secret of hook user i.
func hookUserSecret(i int) []byte {
	return fmt.Appendf(nil, "secret of hook user %04d, long enough", i)
}

func newScaleHook(n int) *scaleHook {
	h := &scaleHook{secrets: map[string][]byte{}, names: map[string]string{}, perID: map[string]int{}, stop: make(chan struct{})}
	for i := range n {
		id := proto.KeyIDOf(hookUserSecret(i)).String()
		h.secrets[id], h.names[id] = hookUserSecret(i), fmt.Sprintf("user-%04d", i)
	}
	return h
}

func (h *scaleHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	n := h.inFlight.Add(1)
	defer h.inFlight.Add(-1)
	for m := h.maxSeen.Load(); n > m && !h.maxSeen.CompareAndSwap(m, n); m = h.maxSeen.Load() {
	}
	var q struct{ KeyID string }
	_ = json.NewDecoder(r.Body).Decode(&q)
	h.mu.Lock()
	h.perID[q.KeyID]++
	h.mu.Unlock()
	wait := h.delay
	if h.hang.Load() {
		wait = time.Hour
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		case <-h.stop:
			return
		}
	}
	s, ok := h.secrets[q.KeyID]
	if !ok {
		http.NotFound(w, r)
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"name": h.names[q.KeyID], "secret": base64.StdEncoding.EncodeToString(s)})
}

// release ends the calls it holds, and makes it hold none from now on.
func (h *scaleHook) release() { h.stopOnce.Do(func() { close(h.stop) }) }

// callsOf returns the calls for the key ID of secret, and the most for any
// one key ID.
func (h *scaleHook) callsOf(secret []byte) (calls, most int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range h.perID {
		most = max(most, n)
	}
	return h.perID[proto.KeyIDOf(secret).String()], most
}

// hookFixture is a server (alice's key its only one) asking a scaleHook
// for other key IDs, and a peer that dials it.
type hookFixture struct {
	hs    *scaleHook
	http  *httptest.Server
	hook  *authhook.Hook
	calls *prometheus.Registry // quictun_server_auth_hook_calls_total, as the daemon registers it
	srv   *testutil.Server
	echo  string
	tls   *tls.Config
}

func newHookFixture(t *testing.T, hs *scaleHook, mutate func(*authhook.Config)) *hookFixture {
	t.Helper()
	f := &hookFixture{hs: hs, echo: testutil.EchoServer(t), calls: prometheus.NewRegistry()}
	f.http = httptest.NewServer(hs)
	t.Cleanup(f.http.Close)
	t.Cleanup(hs.release) // before f.http.Close, which waits for the calls
	cfg := authhook.Config{URL: f.http.URL, Timeout: 2 * time.Second, MaxInFlight: 4, Calls: metrics.NewAuthHookCalls(f.calls)}
	if mutate != nil {
		mutate(&cfg)
	}
	hook, err := authhook.New(cfg)
	require.NoError(t, err)
	t.Cleanup(hook.Close)
	f.hook = hook
	keys, err := proto.NewKeyring(proto.Key{Name: "alice", Secret: aliceSecret})
	require.NoError(t, err)
	f.srv = testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + f.echo}, Mutate: func(c *server.Config) {
		c.Keys, c.KeyHook = keys, hook
		// A peer without credentials keeps its connection for the whole
		// flood: every header reaches the hook path, none is cut by the
		// pre-authentication deadline.
		c.AuthTimeout, c.IdleAuthTimeout = 10*time.Minute, 10*time.Minute
	}})
	pin, err := transport.ParseFingerprint(f.srv.State.Fingerprint())
	require.NoError(t, err)
	f.tls, err = transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}})
	require.NoError(t, err)
	return f
}

// hookCalls reads quictun_server_auth_hook_calls_total{result}.
func (f *hookFixture) hookCalls(t *testing.T, result string) float64 {
	t.Helper()
	mfs, err := f.calls.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no auth_hook_calls_total{result=%q}", result)
	return 0
}

func (f *hookFixture) authFailures(reason string) float64 {
	return promtest.ToFloat64(f.srv.Metrics.AuthFailuresTotal.WithLabelValues(reason))
}

// dial opens a connection to the server as a peer that pins its
// certificate; safe from any goroutine.
func (f *hookFixture) dial(ctx context.Context) (*quic.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return quic.DialAddr(ctx, f.srv.Addr, f.tls, transport.QUICConfig(transport.DefaultQUICOptions()))
}

// header sends one tunnel header to the echo server signed with secret on
// a new stream of c and returns the server's answer: CodeOK for a reply OK,
// or the code it refused with. An error is a stream that ended without a
// code (or did not answer within 20 s). Safe from any goroutine.
func (f *hookFixture) header(ctx context.Context, c *quic.Conn, secret []byte) (proto.Code, error) {
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	str, err := c.OpenStreamSync(sctx)
	if err != nil {
		return 0, err
	}
	defer func() { str.CancelRead(0); str.CancelWrite(0) }()
	h, err := proto.NewHeader("tcp:"+f.echo, time.Now())
	if err != nil {
		return 0, err
	}
	b, err := h.Append(nil, secret)
	if err != nil {
		return 0, err
	}
	if _, err := str.Write(b); err != nil {
		return 0, err
	}
	_ = str.SetReadDeadline(time.Now().Add(20 * time.Second))
	err = proto.ReadReply(str)
	if err == nil {
		return proto.CodeOK, nil
	}
	if code, ok := proto.FromError(err); ok {
		return code, nil
	}
	return 0, err
}

// identityOnline reports whether a connection of the server is identified
// as identity (its /tunnels view).
func (f *hookFixture) identityOnline(identity string) bool {
	for _, c := range f.srv.ConnStats() {
		if c.ClientIdentity == identity {
			return true
		}
	}
	return false
}

// forEach runs job(0..n-1) on workers goroutines and waits for them.
func forEach(n, workers int, job func(i int)) {
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				job(i)
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
}

// TestAuthHookThousandIdentities (issue 35's target): 1,000 distinct
// identities the server does not hold, known to a local hook, each open
// tunnels on a connection of their own and then on a second one: each is
// let in as key=NAME (the identity /tunnels shows), and the hook is asked
// once per identity, its repeated tunnels answered from the cache (counted
// at the hook and in quictun_server_auth_hook_calls_total).
func TestAuthHookThousandIdentities(t *testing.T) {
	t.Parallel()
	const users, tunnels = 1000, 3
	f := newHookFixture(t, newScaleHook(users), func(c *authhook.Config) { c.MaxInFlight = authhook.DefaultMaxInFlight })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var ok, identified, failed, retries atomic.Int64
	var firstErr sync.Once
	var errSeen error
	run := func(i int) {
		c, err := f.dial(ctx)
		if err != nil {
			failed.Add(1)
			firstErr.Do(func() { errSeen = err })
			return
		}
		defer func() { _ = c.CloseWithError(0, "") }()
		for range tunnels {
			code, err := f.header(ctx, c, hookUserSecret(i))
			for try := 0; err == nil && code == proto.CodeOverloaded && try < 50; try++ { // as a client does
				retries.Add(1)
				time.Sleep(10 * time.Millisecond)
				code, err = f.header(ctx, c, hookUserSecret(i))
			}
			if err != nil || code != proto.CodeOK {
				failed.Add(1)
				firstErr.Do(func() { errSeen = fmt.Errorf("user %d: code %v, err %v", i, code, err) })
				return
			}
			ok.Add(1)
		}
		if f.identityOnline(fmt.Sprintf("key=user-%04d", i)) {
			identified.Add(1)
		}
	}
	start := time.Now()
	forEach(users, 8, run)
	first := time.Since(start)
	require.Zero(t, failed.Load(), "first failure: %v", errSeen)
	// A second connection per identity, all cached: no new calls.
	forEach(users, 8, run)
	require.Zero(t, failed.Load(), "first failure: %v", errSeen)
	t.Logf("%d identities x %d tunnels x 2 connections: %v for the first round, %v in all; hook calls %d, most in flight %d; %d retries after overloaded",
		users, tunnels, first.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), f.hs.calls.Load(), f.hs.maxSeen.Load(), retries.Load())

	assert.Equal(t, int64(2*users*tunnels), ok.Load(), "every tunnel opened")
	assert.Equal(t, int64(2*users), identified.Load(), "every connection identified as key=NAME")
	assert.Equal(t, int64(users), f.hs.calls.Load(), "the hook is asked once per identity, then the cache answers")
	_, most := f.hs.callsOf(nil)
	assert.Equal(t, 1, most, "no identity asked twice")
	assert.Equal(t, float64(users), f.hookCalls(t, "ok"), "quictun_server_auth_hook_calls_total{result=ok}")
	assert.Zero(t, f.hookCalls(t, "unknown")+f.hookCalls(t, "error"))
	for _, r := range []string{egress.AuthNoMAC, egress.AuthUnknownKey, egress.AuthBadMAC} {
		assert.Zero(t, f.authFailures(r), "auth failure %s", r)
	}
	assert.Equal(t, float64(retries.Load()), f.authFailures(egress.AuthHookUnavailable), "busy lookups refused (overloaded) and retried")
	cached, running := f.hook.Len()
	assert.Equal(t, users, cached)
	assert.Zero(t, running)
}

// floodTally counts the answers of a flood by kind of header (repeated or
// random key ID) and code.
type floodTally struct {
	mu     sync.Mutex
	codes  map[string]map[proto.Code]int
	errors int
	first  error
}

func (ft *floodTally) add(kind string, code proto.Code, err error) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	if err != nil {
		ft.errors++
		ft.first = cmp.Or(ft.first, err)
		return
	}
	if ft.codes[kind] == nil {
		ft.codes[kind] = map[proto.Code]int{}
	}
	ft.codes[kind][code]++
}

// flood sends n headers from workers peers without credentials: every
// tenth with one of repeated's secrets, the rest with a random one; a
// peer whose connection the server closed (auth_failed) dials again.
func (f *hookFixture) flood(ctx context.Context, n, workers int, repeated [][]byte) *floodTally {
	ft := &floodTally{codes: map[string]map[proto.Code]int{}}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			var c *quic.Conn
			defer func() {
				if c != nil {
					_ = c.CloseWithError(0, "")
				}
			}()
			for j := range jobs {
				kind, secret := "random", make([]byte, 32)
				_, _ = rand.Read(secret)
				if j%10 == 0 {
					kind, secret = "repeated", repeated[j/10%len(repeated)]
				}
				var err error
				if c == nil || c.Context().Err() != nil {
					if c, err = f.dial(ctx); err != nil {
						c = nil
						ft.add(kind, 0, err)
						continue
					}
				}
				code, err := f.header(ctx, c, secret)
				ft.add(kind, code, err)
				if code == proto.CodeAuthFailed { // the server closes the connection
					_ = c.CloseWithError(0, "")
					c = nil
				}
			}
		})
	}
	for j := range n {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	return ft
}

// heapInUse returns HeapInuse after a collection, and the goroutines.
func heapInUse() (heap uint64, goroutines int) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, runtime.NumGoroutine()
}

// TestAuthHookUnknownKeyFlood (issue 35's target): 10,000 stream headers
// with key IDs neither the server nor the hook knows, from peers without
// credentials (9,000 random, 1,000 repeating 10 IDs), against a hook that
// takes 100 ms an answer: the hook never has more than
// --auth-hook-max-in-flight (4) calls at once, no key ID is asked twice
// (the negative cache answers the repeated ones, ahead of the in-flight
// bound), every header is refused with a code (auth_failed for a 404,
// overloaded when the lookups are all taken) and counted in
// quictun_server_auth_failures_total, and the server's state stays bounded:
// the hook's cache holds one entry per call, none running afterwards, the
// goroutines come back and the heap grows by less than 64 MiB.
//
// Not parallel: the heap and the goroutines are the process's, so other
// tests running beside it would move them.
func TestAuthHookUnknownKeyFlood(t *testing.T) {
	const headers, maxInFlight = 10_000, 4
	hs := newScaleHook(0)
	hs.delay = 100 * time.Millisecond
	f := newHookFixture(t, hs, func(c *authhook.Config) {
		c.MaxInFlight, c.NegativeTTL = maxInFlight, 10*time.Minute
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	repeated := make([][]byte, 10)
	for i := range repeated { // each learnt unknown once, before the flood
		repeated[i] = fmt.Appendf(nil, "a secret nobody holds, number %d", i)
		c, err := f.dial(ctx)
		require.NoError(t, err)
		code, err := f.header(ctx, c, repeated[i])
		require.NoError(t, err)
		require.Equal(t, proto.CodeAuthFailed, code)
		_ = c.CloseWithError(0, "")
	}
	heap0, g0 := heapInUse()

	start := time.Now()
	ft := f.flood(ctx, headers, 16, repeated)
	took := time.Since(start)
	cached, running := f.hook.Len()
	require.Eventually(t, func() bool { _, running = f.hook.Len(); return running == 0 }, 10*time.Second, 10*time.Millisecond)
	heap1, g1 := heapInUse()
	t.Logf("%d headers in %v: %v, %d errors; hook calls %d, most in flight %d; cache %d entries; heap in use %d -> %d KiB, goroutines %d -> %d",
		headers, took.Round(time.Millisecond), ft.codes, ft.errors, hs.calls.Load(), hs.maxSeen.Load(), cached, heap0>>10, heap1>>10, g0, g1)

	require.Zero(t, ft.errors, "every header answered with a code; first error: %v", ft.first)
	assert.LessOrEqual(t, hs.maxSeen.Load(), int64(maxInFlight), "calls in flight at the hook")
	for _, s := range repeated {
		calls, _ := hs.callsOf(s)
		assert.Equal(t, 1, calls, "a repeated key ID is asked once")
	}
	_, most := hs.callsOf(nil)
	assert.Equal(t, 1, most, "no key ID is asked twice")
	assert.Equal(t, map[proto.Code]int{proto.CodeAuthFailed: headers / 10}, ft.codes["repeated"], "the negative cache refuses the repeated IDs, even with the lookups all taken")
	random := ft.codes["random"]
	assert.Equal(t, headers-headers/10, random[proto.CodeAuthFailed]+random[proto.CodeOverloaded], "random IDs: auth_failed or overloaded, nothing else: %v", random)
	assert.Positive(t, random[proto.CodeOverloaded], "the in-flight bound refused some at once")
	assert.Equal(t, float64(10+headers/10+random[proto.CodeAuthFailed]), f.authFailures(egress.AuthUnknownKey), "auth_failures_total{reason=unknown_key}")
	assert.Equal(t, float64(random[proto.CodeOverloaded]), f.authFailures(egress.AuthHookUnavailable), "auth_failures_total{reason=hook_unavailable}")
	assert.Equal(t, float64(hs.calls.Load()), f.hookCalls(t, "unknown"), "auth_hook_calls_total{result=unknown}")
	assert.LessOrEqual(t, cached, int(hs.calls.Load()), "one cache entry per call at most")
	assert.Less(t, heap1, heap0+64<<20, "heap in use grows by less than 64 MiB")
	// The server keeps up to 32 goroutines waiting for its next stream
	// (IdleStreamWorkers): beyond those, the headers left none.
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= g0+16+f.srv.IdleStreamWorkers() }, 20*time.Second, 50*time.Millisecond,
		"goroutines back to %d (+16, +%d stream workers waiting), at %d", g0, f.srv.IdleStreamWorkers(), runtime.NumGoroutine())
}

// TestAuthHookStoppedRefusesWithinBoundedWait (issue 35's target): with the
// hook hanging (it accepts the call and never answers) or stopped (its
// port closed), 16 peers each sending a header with a key ID the server
// does not hold, all at once, are all refused with overloaded: those that
// got one of the 4 lookups after --auth-hook-timeout (1 s), the rest at
// once; none hangs (each answer is timed, and must come within the timeout
// plus 5 s for a loaded machine, well before the 10 s header timeout, the
// wait a hook call without a deadline of its own would end at). A key cached before keeps working.
func TestAuthHookStoppedRefusesWithinBoundedWait(t *testing.T) {
	t.Parallel()
	const peers, timeout, slack = 16, time.Second, 5 * time.Second
	hs := newScaleHook(1)
	f := newHookFixture(t, hs, func(c *authhook.Config) { c.Timeout, c.MaxInFlight = timeout, 4 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	known, err := f.dial(ctx)
	require.NoError(t, err)
	code, err := f.header(ctx, known, hookUserSecret(0))
	require.NoError(t, err)
	require.Equal(t, proto.CodeOK, code, "user-0000 is let in (and cached)")

	refused := 0
	for _, tc := range []struct {
		name string
		stop func()
	}{
		{"hanging", func() { hs.hang.Store(true) }},
		{"stopped", func() { hs.release(); f.http.Close() }},
	} {
		tc.stop()
		codes := make([]proto.Code, peers)
		waits := make([]time.Duration, peers)
		errs := make([]error, peers)
		forEach(peers, peers, func(i int) {
			c, err := f.dial(ctx)
			if err != nil {
				errs[i] = err
				return
			}
			defer func() { _ = c.CloseWithError(0, "") }()
			start := time.Now()
			codes[i], errs[i] = f.header(ctx, c, fmt.Appendf(nil, "an unknown secret of peer %d, %s", i, tc.name))
			waits[i] = time.Since(start)
		})
		require.NoError(t, errors.Join(errs...), tc.name)
		slowest := time.Duration(0)
		for i := range peers {
			assert.Equal(t, proto.CodeOverloaded, codes[i], "%s: peer %d", tc.name, i)
			assert.Less(t, waits[i], timeout+slack, "%s: peer %d refused within the bounded wait", tc.name, i)
			slowest = max(slowest, waits[i])
		}
		refused += peers
		t.Logf("hook %s: %d peers refused with %v, the slowest after %v (timeout %v); hook calls so far %d",
			tc.name, peers, codes[0], slowest.Round(time.Millisecond), timeout, hs.calls.Load())
		code, err := f.header(ctx, known, hookUserSecret(0))
		require.NoError(t, err)
		assert.Equal(t, proto.CodeOK, code, "%s: a cached key keeps working", tc.name)
	}
	assert.Equal(t, float64(refused), f.authFailures(egress.AuthHookUnavailable), "auth_failures_total{reason=hook_unavailable}")
	assert.Positive(t, f.hookCalls(t, "error"), "auth_hook_calls_total{result=error}")
	assert.Zero(t, f.authFailures(egress.AuthUnknownKey), "a hook that did not answer is not a 404")
}
