package integration

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/server"
)

// soakStats counts what the soak did.
type soakStats struct {
	ok, failed, corrupted atomic.Int64
	bytes                 atomic.Int64
}

// transferOnce opens a connection to addr, sends n random bytes while reading
// the echo, and checks count and SHA-256. A transfer that fails must fail with
// an error (counted as failed); one that ends "cleanly" with wrong data is
// corruption, which must never happen.
func transferOnce(addr string, n int64, st *soakStats) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		st.failed.Add(1)
		return
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	sent := sha256.New()
	werr := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, io.TeeReader(io.LimitReader(rand.Reader, n), sent))
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got := sha256.New()
	m, rerr := io.Copy(got, c)
	if err := <-werr; err != nil || rerr != nil {
		st.failed.Add(1)
		return
	}
	if m != n || string(sent.Sum(nil)) != string(got.Sum(nil)) {
		st.corrupted.Add(1)
		return
	}
	st.ok.Add(1)
	st.bytes.Add(2 * n)
}

// TestSoak runs mixed traffic (interactive, bulk, short-lived connections)
// through a lossy link with periodic blackouts and server restarts for
// QUICTUN_SOAK_DURATION (make soak sets it; skipped otherwise). No transfer
// may complete with wrong data, and goroutines, file descriptors and heap
// must come back to their baseline afterwards.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("QUICTUN_SOAK_DURATION"))
	if err != nil || d <= 0 {
		t.Skip("set QUICTUN_SOAK_DURATION (e.g. 1h) to run the soak; make soak does")
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseHeap, baseGoroutines, baseFDs := ms.HeapInuse, runtime.NumGoroutine(), fdSnapshot()

	st := &soakStats{}
	// A subtest, so that everything it started is cleaned up before the checks below.
	t.Run("traffic", func(t *testing.T) {
		echo := copyEchoServer(t) // no splice pipes: they would wait for the GC (fault_fd_test.go)
		state := t.TempDir()
		noDrain := func(c *server.Config) { c.DrainTimeout = 0 }
		srv := testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Allow: []string{"tcp:" + echo}, Mutate: noDrain})
		addr := srv.Addr
		var dark atomic.Bool
		var lossMu sync.Mutex
		rng := mrand.New(mrand.NewPCG(7, 8))
		proxy := lossyProxy(t, srv, 5*time.Millisecond, &dark, func() bool {
			lossMu.Lock()
			defer lossMu.Unlock()
			return rng.Float64() < 0.01
		})
		cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: proxy, WaitReady: true})

		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		var wg sync.WaitGroup
		worker := func(n int64, pause time.Duration) {
			for ctx.Err() == nil {
				transferOnce(cl.Addr, n, st)
				select {
				case <-ctx.Done():
				case <-time.After(pause):
				}
			}
		}
		for range 4 {
			wg.Go(func() { worker(2<<10, 50*time.Millisecond) }) // interactive
		}
		wg.Go(func() { worker(8<<20, time.Second) })       // bulk
		wg.Go(func() { worker(100, 10*time.Millisecond) }) // short-lived connections
		// Faults: a blackout every 45 s (2-8 s long), a server restart every 2 min.
		wg.Go(func() {
			tick := time.NewTicker(45 * time.Second)
			defer tick.Stop()
			restarts := 0
			for i := 1; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				if i%3 == 0 {
					srv.Stop(t)
					srv = testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Addr: addr, Allow: []string{"tcp:" + echo}, Mutate: noDrain})
					restarts++
					continue
				}
				dark.Store(true)
				select {
				case <-ctx.Done():
				case <-time.After(time.Duration(2+i%7) * time.Second):
				}
				dark.Store(false)
			}
		})
		wg.Wait()
		t.Logf("soak %s: %d transfers ok (%d MiB verified), %d failed loudly, %d corrupted",
			d, st.ok.Load(), st.bytes.Load()>>20, st.failed.Load(), st.corrupted.Load())
		cl.Stop(t)
		srv.Stop(t)
	})
	require.Zero(t, st.corrupted.Load(), "a transfer completed with wrong data")
	require.Positive(t, st.ok.Load())

	// Everything the soak started must be gone.
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= baseGoroutines+5 }, 30*time.Second, 100*time.Millisecond,
		"goroutines: %d, baseline %d", runtime.NumGoroutine(), baseGoroutines)
	// No GC first: every descriptor must have been closed by its owner, not
	// by a finalizer (TestFaultNoFDLeftForFinalizers checks the same, briefly).
	var left []string
	assert.True(t, pollFor(30*time.Second, func() bool { left = fdsAdded(baseFDs, fdSnapshot()); return len(left) == 0 }),
		"descriptors open after the soak that were not before:\n%s", strings.Join(left, "\n"))
	runtime.GC()
	runtime.ReadMemStats(&ms)
	t.Logf("heap in use: %d KiB after, %d KiB before; goroutines %d (%d); fds %d (%d)",
		ms.HeapInuse>>10, baseHeap>>10, runtime.NumGoroutine(), baseGoroutines, len(fdSnapshot()), len(baseFDs))
	assert.Less(t, ms.HeapInuse, baseHeap+64<<20, "heap did not come back near its baseline")
}
