package report

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// events records what a Reporter reports.
type events struct {
	mu      sync.Mutex
	results map[string]int
}

func (e *events) Batch(r string) { e.mu.Lock(); defer e.mu.Unlock(); e.results[r]++ }
func (e *events) Queued(int)     {}
func (e *events) count(r string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.results[r]
}

// source is a settable Source.
type source struct {
	mu sync.Mutex
	t  map[string]Totals
}

func (s *source) add(id string, up, down int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.t[id]
	t.Identity = id
	t.BytesUpstream += up
	t.BytesDownstream += down
	s.t[id] = t
}

func (s *source) get() []Totals {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Totals
	for _, t := range s.t {
		out = append(out, t)
	}
	return out
}

// receiver is an endpoint that answers with status() and records batches.
type receiver struct {
	mu      sync.Mutex
	batches []Batch
	auth    []string
	status  atomic.Int32
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var b Batch
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if st := int(rc.status.Load()); st != 0 && st != http.StatusOK {
		w.WriteHeader(st)
		return
	}
	rc.mu.Lock()
	rc.batches = append(rc.batches, b)
	rc.auth = append(rc.auth, r.Header.Get("Authorization"))
	rc.mu.Unlock()
}

func (rc *receiver) sums() map[string]int64 {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := map[string]int64{}
	for _, b := range rc.batches {
		for _, i := range b.Identities {
			out[i.Identity] += i.BytesUpstream + i.BytesDownstream
		}
	}
	return out
}

func start(t *testing.T, cfg Config) (*Reporter, func()) {
	t.Helper()
	r, err := New(cfg)
	require.NoError(t, err)
	r.tick, r.retry = 10*time.Millisecond, 10*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	return r, func() { cancel(); <-done }
}

// TestReportsEachByteOnce: the bytes moved before the Reporter started are
// not sent; those after are sent once, early past the threshold, the rest
// at the interval or at the end; with the bearer token.
func TestReportsEachByteOnce(t *testing.T) {
	t.Parallel()
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	src := &source{t: map[string]Totals{}}
	src.add("key=alice", 1000, 1000) // before: not reported
	ev := &events{results: map[string]int{}}
	_, stop := start(t, Config{URL: srv.URL, BearerToken: "tok", Interval: time.Hour, Threshold: 500, Source: src.get, Events: ev})
	src.add("key=alice", 400, 200) // over the threshold: sent early
	require.Eventually(t, func() bool { return rc.sums()["key=alice"] == 600 }, 10*time.Second, 5*time.Millisecond)
	src.add("key=bob", 1, 2) // under it: waits for the interval, or the end
	src.add("key=alice", 3, 0)
	stop()
	assert.Equal(t, map[string]int64{"key=alice": 603, "key=bob": 3}, rc.sums())
	assert.Equal(t, "Bearer tok", rc.auth[0])
	assert.Equal(t, 2, ev.count(ResultSent))
}

// TestRetriesAndRejects: a 503 is retried (the batch keeps its ID), a 400
// dropped; the queue is bounded.
func TestRetriesAndRejects(t *testing.T) {
	t.Parallel()
	rc := &receiver{}
	rc.status.Store(http.StatusServiceUnavailable)
	srv := httptest.NewServer(rc)
	defer srv.Close()
	src := &source{t: map[string]Totals{}}
	ev := &events{results: map[string]int{}}
	_, stop := start(t, Config{URL: srv.URL, Interval: time.Hour, Threshold: 1, MaxQueued: 2, Source: src.get, Events: ev})
	for i := range 4 {
		src.add("key=alice", int64(i+1), 0)
		require.Eventually(t, func() bool { return ev.count(ResultRetried) > i }, 10*time.Second, time.Millisecond)
	}
	require.Eventually(t, func() bool { return ev.count(ResultDropped) >= 1 }, 10*time.Second, time.Millisecond, "bounded queue")
	rc.status.Store(http.StatusOK)
	require.Eventually(t, func() bool { return ev.count(ResultSent) >= 2 }, 10*time.Second, time.Millisecond, "retried until accepted")
	rc.status.Store(http.StatusBadRequest)
	src.add("key=alice", 100, 0)
	require.Eventually(t, func() bool { return ev.count(ResultRejected) == 1 }, 10*time.Second, time.Millisecond, "a 400 is not retried")
	stop()
	ids := map[string]bool{}
	for _, b := range rc.batches {
		assert.False(t, ids[b.ID], "each batch once")
		ids[b.ID] = true
	}
}

// TestEndpointDownDoesNotBlock: with the endpoint unreachable, Run still
// ends promptly at shutdown.
func TestEndpointDownDoesNotBlock(t *testing.T) {
	t.Parallel()
	src := &source{t: map[string]Totals{}}
	ev := &events{results: map[string]int{}}
	_, stop := start(t, Config{URL: "http://127.0.0.1:1/usage", Interval: time.Hour, Threshold: 1, Source: src.get, Events: ev})
	src.add("key=alice", 10, 0)
	require.Eventually(t, func() bool { return ev.count(ResultRetried) >= 1 }, 10*time.Second, time.Millisecond)
	start := time.Now()
	stop()
	assert.Less(t, time.Since(start), 30*time.Second)
}
