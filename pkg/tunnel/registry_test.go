package tunnel_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/tunnel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is an Aborter that remembers the codes it got.
type recorder struct {
	mu    sync.Mutex
	codes []proto.Code
}

func (r *recorder) Abort(c proto.Code) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.codes = append(r.codes, c)
}

func (r *recorder) got() []proto.Code {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]proto.Code(nil), r.codes...)
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newTunnel(dest string) *tunnel.Tunnel {
	return &tunnel.Tunnel{
		StreamID: 4, ConnID: 7, Endpoint: "tcp:127.0.0.1:6500", Source: "127.0.0.1:40000",
		Destination: dest, CreatedAt: t0, Upstream: new(atomic.Int64), Downstream: new(atomic.Int64),
	}
}

func TestRegistryAddRemoveList(t *testing.T) {
	t.Parallel()
	r := tunnel.NewRegistry()
	assert.Zero(t, r.Len())
	assert.Empty(t, r.List(t0))

	var removes []func()
	var tuns []*tunnel.Tunnel
	for i := range 20 {
		tn := newTunnel("tcp:127.0.0.1:" + strconv.Itoa(1000+i))
		removes = append(removes, r.Add(tn, nil))
		tuns = append(tuns, tn)
	}
	assert.Equal(t, 20, r.Len())
	for i := 1; i < len(tuns); i++ {
		assert.Greater(t, tuns[i].ID, tuns[i-1].ID, "IDs increase")
	}

	removes[3]()
	removes[3]() // idempotent
	removes[11]()
	assert.Equal(t, 18, r.Len())

	list := r.List(t0)
	require.Len(t, list, 18)
	prev := uint64(0)
	for _, in := range list {
		id, err := strconv.ParseUint(in.UUID, 10, 64)
		require.NoError(t, err)
		assert.Greater(t, id, prev, "sorted by ID")
		prev = id
		assert.NotEqual(t, strconv.FormatUint(tuns[3].ID, 10), in.UUID, "removed tunnel not listed")
		assert.NotEqual(t, strconv.FormatUint(tuns[11].ID, 10), in.UUID)
	}

	first := list[0]
	assert.Equal(t, strconv.FormatUint(tuns[0].ID, 10), first.UUID)
	assert.Equal(t, int64(4), first.StreamID)
	assert.Equal(t, uint64(7), first.ConnID)
	assert.Equal(t, "tcp:127.0.0.1:6500", first.Endpoint)
	assert.Equal(t, "127.0.0.1:40000", first.ClientAppAddr)
	assert.Equal(t, "tcp:127.0.0.1:1000", first.ServerAppAddr)
	assert.Equal(t, t0, first.CreatedAt)
}

func TestRegistryRates(t *testing.T) {
	t.Parallel()
	r := tunnel.NewRegistry()
	tn := newTunnel("tcp:127.0.0.1:22")
	r.Add(tn, nil)

	type step struct {
		at         time.Duration // since t0
		up, down   int64         // counters at that time
		wantUpRate float64
		wantDnRate float64
	}
	for i, s := range []step{
		{at: 0, up: 0, down: 0, wantUpRate: 0, wantDnRate: 0},
		{at: time.Second, up: 1000, down: 4000, wantUpRate: 1000, wantDnRate: 4000},
		// Less than 0.5 s since the last sample: the previous rate is kept.
		{at: 1200 * time.Millisecond, up: 9000, down: 4000, wantUpRate: 1000, wantDnRate: 4000},
		// 2 s since the last sample (at 1 s): (5000-1000)/2 and (4000-4000)/2.
		{at: 3 * time.Second, up: 5000, down: 4000, wantUpRate: 2000, wantDnRate: 0},
		// A clock going backwards does not produce a rate.
		{at: 2 * time.Second, up: 7000, down: 7000, wantUpRate: 2000, wantDnRate: 0},
	} {
		tn.Upstream.Store(s.up)
		tn.Downstream.Store(s.down)
		list := r.List(t0.Add(s.at))
		require.Len(t, list, 1)
		assert.Equal(t, s.up, list[0].UpstreamBytes, "step %d", i)
		assert.Equal(t, s.down, list[0].DownstreamBytes, "step %d", i)
		assert.InDelta(t, s.wantUpRate, list[0].UpstreamBytesPerSec, 0.001, "step %d up rate", i)
		assert.InDelta(t, s.wantDnRate, list[0].DownstreamBytesPerSec, 0.001, "step %d down rate", i)
	}
}

func TestRegistryAbort(t *testing.T) {
	t.Parallel()
	r := tunnel.NewRegistry()
	a, b := &recorder{}, &recorder{}
	ta, tb := newTunnel("a"), newTunnel("b")
	r.Add(ta, a)
	removeB := r.Add(tb, b)
	noAborter := newTunnel("c")
	r.Add(noAborter, nil)

	assert.True(t, r.Abort(ta.ID, proto.CodeShutdown))
	assert.Equal(t, []proto.Code{proto.CodeShutdown}, a.got())
	assert.Empty(t, b.got(), "only the named tunnel")
	assert.Equal(t, 3, r.Len(), "Abort does not remove: the tunnel removes itself when it ends")

	assert.True(t, r.Abort(noAborter.ID, proto.CodeShutdown), "exists even without an aborter")
	assert.False(t, r.Abort(12345, proto.CodeShutdown))

	removeB()
	assert.False(t, r.Abort(tb.ID, proto.CodeShutdown), "removed tunnels are gone")
	assert.Empty(t, b.got())

	r.AbortAll(proto.CodeTimeout)
	assert.Equal(t, []proto.Code{proto.CodeShutdown, proto.CodeTimeout}, a.got())
	assert.Empty(t, b.got())
}

// AbortFlows ends UDP flows only: a drain does not wait for them.
func TestRegistryAbortFlows(t *testing.T) {
	t.Parallel()
	r := tunnel.NewRegistry()
	stream, flow := &recorder{}, &recorder{}
	ts, tf := newTunnel("tcp:a"), newTunnel("udp:b")
	tf.Datagram = true
	r.Add(ts, stream)
	r.Add(tf, flow)
	r.AbortFlows(proto.CodeShutdown)
	assert.Empty(t, stream.got())
	assert.Equal(t, []proto.Code{proto.CodeShutdown}, flow.got())
}

func TestRegistryWaitEmpty(t *testing.T) {
	t.Parallel()
	r := tunnel.NewRegistry()
	require.NoError(t, r.WaitEmpty(context.Background()), "empty at start")

	remove1 := r.Add(newTunnel("a"), nil)
	remove2 := r.Add(newTunnel("b"), nil)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, r.WaitEmpty(ctx), context.DeadlineExceeded)

	done := make(chan error, 1)
	go func() { done <- r.WaitEmpty(context.Background()) }()
	remove1()
	select {
	case err := <-done:
		t.Fatalf("WaitEmpty returned with a tunnel left: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	remove2()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("WaitEmpty did not return when the last tunnel was removed")
	}

	// Not empty again after a new Add.
	remove3 := r.Add(newTunnel("c"), nil)
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	assert.ErrorIs(t, r.WaitEmpty(ctx2), context.Canceled)
	remove3()
	assert.NoError(t, r.WaitEmpty(context.Background()))
}

func TestRegistryConcurrent(t *testing.T) {
	t.Parallel()
	r := tunnel.NewRegistry()
	const workers, per = 8, 200
	var wg sync.WaitGroup
	var aborted atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				tn := newTunnel("x")
				rec := &countingAborter{n: &aborted}
				remove := r.Add(tn, rec)
				tn.Upstream.Add(int64(i))
				_ = r.List(t0.Add(time.Duration(w*per+i) * time.Second))
				_ = r.Len()
				r.Abort(tn.ID, proto.CodeShutdown)
				if i%50 == 0 {
					r.AbortAll(proto.CodeShutdown)
				}
				remove()
			}
		})
	}
	waitDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		wg.Wait()
		waitDone <- r.WaitEmpty(ctx)
	}()
	require.NoError(t, <-waitDone)
	assert.Zero(t, r.Len())
	assert.GreaterOrEqual(t, aborted.Load(), int64(workers*per), "each tunnel aborted at least by ID")

	// IDs stay unique under concurrency.
	seen := map[uint64]bool{}
	var mu sync.Mutex
	var wg2 sync.WaitGroup
	for range workers {
		wg2.Go(func() {
			for range per {
				tn := newTunnel("y")
				r.Add(tn, nil)
				mu.Lock()
				assert.False(t, seen[tn.ID], "duplicate ID %d", tn.ID)
				seen[tn.ID] = true
				mu.Unlock()
			}
		})
	}
	wg2.Wait()
	assert.Equal(t, workers*per, r.Len())
	assert.Len(t, r.List(t0), workers*per)
}

type countingAborter struct{ n *atomic.Int64 }

func (c *countingAborter) Abort(proto.Code) { c.n.Add(1) }

func TestRegistryLookup(t *testing.T) {
	t.Parallel()
	r := tunnel.NewRegistry()
	ta := newTunnel("a")
	ta.UUID = "00112233-4455-6677-8899-aabbccddeeff"
	r.Add(ta, nil)
	tb := newTunnel("b") // no UUID: listed by its ID
	r.Add(tb, nil)
	list := r.List(t0)
	require.Len(t, list, 2)
	assert.Equal(t, ta.UUID, list[0].UUID)
	assert.Equal(t, fmt.Sprint(tb.ID), list[1].UUID)

	for _, tc := range []struct {
		in    string
		id    uint64
		found bool
		err   error
	}{
		{ta.UUID, ta.ID, true, nil},
		{fmt.Sprint(tb.ID), tb.ID, true, nil},
		{"00112233-4455-6677-8899-aabbccddeee0", 0, false, nil},
		{"not-a-uuid", 0, false, tunnel.ErrBadID},
		{"00112233-4455-6677-8899-AABBCCDDEEFF", 0, false, tunnel.ErrBadID},
	} {
		id, found, err := r.Lookup(tc.in)
		assert.Equal(t, tc.id, id, tc.in)
		assert.Equal(t, tc.found, found, tc.in)
		assert.ErrorIs(t, err, tc.err, tc.in)
	}
}
