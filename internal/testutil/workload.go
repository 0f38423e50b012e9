package testutil

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// HalfCloser is a connection whose write side can be closed alone.
type HalfCloser interface {
	net.Conn
	CloseWrite() error
}

// Workload is what applications do through a tunnel across a migration or
// a fault: ping-pong connections doing a 1000 B round trip every 5 ms, each
// timed, and one bulk echo transfer whose data is SHA-256-checked. Errors
// are collected and reported by Finish.
type Workload struct {
	stop     chan struct{}
	bulkDone chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	errs     []error
	// trips[i] holds the round trips of ping-pong connection i.
	trips     [][]RoundTrip
	bulkReads []time.Time
	bulkBytes atomic.Int64
	conns     []net.Conn
}

// RoundTrip is when one ping-pong round trip started and completed.
type RoundTrip struct{ Start, End time.Time }

func (w *Workload) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, err)
}

// StartWorkload opens pingPongs ping-pong connections and one bulk
// connection with dial (to an echo server through the tunnel). With bulk >= 0
// the bulk connection sends that many bytes and half-closes; with bulk < 0 it
// sends until Finish.
func StartWorkload(t testing.TB, dial func() HalfCloser, pingPongs int, bulk int64) *Workload {
	t.Helper()
	w := &Workload{stop: make(chan struct{}), bulkDone: make(chan struct{}), trips: make([][]RoundTrip, pingPongs)}
	for i := range pingPongs {
		c := dial()
		w.conns = append(w.conns, c)
		w.wg.Go(func() { w.pingPong(i, c) })
	}
	c := dial()
	w.conns = append(w.conns, c)
	sent := sha256.New()
	var sentN atomic.Int64
	werr := make(chan error, 1)
	w.wg.Go(func() {
		if bulk >= 0 {
			n, err := io.Copy(c, io.TeeReader(io.LimitReader(rand.Reader, bulk), sent))
			sentN.Store(n)
			if err == nil {
				err = c.CloseWrite()
			}
			werr <- err
			return
		}
		buf := make([]byte, 32<<10)
		var err error
		for err == nil {
			select {
			case <-w.stop:
				werr <- c.CloseWrite()
				return
			default:
			}
			_, _ = rand.Read(buf)
			sent.Write(buf)
			_, err = c.Write(buf)
			sentN.Add(int64(len(buf)))
		}
		werr <- err
	})
	w.wg.Go(func() {
		defer close(w.bulkDone)
		got := sha256.New()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				got.Write(buf[:n])
				w.bulkBytes.Add(int64(n))
				w.mu.Lock()
				w.bulkReads = append(w.bulkReads, time.Now())
				w.mu.Unlock()
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				w.fail(fmt.Errorf("bulk read: %w", err))
				return
			}
		}
		if err := <-werr; err != nil {
			w.fail(fmt.Errorf("bulk write: %w", err))
			return
		}
		if m, n := w.bulkBytes.Load(), sentN.Load(); m != n {
			w.fail(fmt.Errorf("bulk: echoed %d bytes, sent %d", m, n))
		} else if !bytes.Equal(sent.Sum(nil), got.Sum(nil)) {
			w.fail(errors.New("bulk: echo differs from what was sent (SHA-256)"))
		}
	})
	return w
}

func (w *Workload) pingPong(i int, c net.Conn) {
	msg, got := make([]byte, 1000), make([]byte, 1000)
	for n := 0; ; n++ {
		select {
		case <-w.stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		_, _ = rand.Read(msg)
		copy(msg, fmt.Sprintf("conn %d round %d ", i, n))
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			w.fail(fmt.Errorf("ping-pong %d write: %w", i, err))
			return
		}
		if _, err := io.ReadFull(c, got); err != nil {
			w.fail(fmt.Errorf("ping-pong %d read: %w", i, err))
			return
		}
		if !bytes.Equal(msg, got) {
			w.fail(fmt.Errorf("ping-pong %d round %d: echo differs", i, n))
			return
		}
		w.mu.Lock()
		w.trips[i] = append(w.trips[i], RoundTrip{start, time.Now()})
		w.mu.Unlock()
	}
}

// Warm waits until every ping-pong connection did 20 round trips and the
// bulk transfer echoed minBulk bytes.
func (w *Workload) Warm(t testing.TB, minBulk int64, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, trips := range w.trips {
			if len(trips) < 20 {
				return false
			}
		}
		return w.bulkBytes.Load() >= minBulk
	}, timeout, time.Millisecond, "workload did not get going")
}

// BulkDone is closed when the bulk transfer has ended.
func (w *Workload) BulkDone() <-chan struct{} { return w.bulkDone }

// Finish stops the workload (a bulk transfer without a size half-closes and
// reads the echo to EOF) and fails the test with every error. If the tunnel
// is stuck it closes the connections after bound.
func (w *Workload) Finish(t testing.TB, bound time.Duration) {
	t.Helper()
	close(w.stop)
	done := make(chan struct{})
	go func() {
		w.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(bound):
		t.Error("workload did not finish: closing its connections")
		for _, c := range w.conns {
			_ = c.Close()
		}
		<-done
	}
	for _, err := range w.errs {
		t.Error(err)
	}
}

// LongestGap returns the longest time between consecutive events (sorted)
// from the last one before at to the first one more than window after it.
func LongestGap(events []time.Time, at time.Time, window time.Duration) time.Duration {
	i, _ := slices.BinarySearchFunc(events, at, func(e, at time.Time) int { return e.Compare(at) })
	prev := at
	if i > 0 {
		prev = events[i-1]
	}
	var gap time.Duration
	for _, e := range events[i:] {
		gap = max(gap, e.Sub(prev))
		prev = e
		if e.Sub(at) > window {
			break
		}
	}
	return gap
}

// Report logs how the workload went through an event (what) at at and
// returns the stall, the longest time a ping-pong connection went without
// completing a round trip around at (within window), and fresh, how long
// after at the first round trip begun after at completed (the latest over
// the connections).
func (w *Workload) Report(t testing.TB, what string, at time.Time, window time.Duration) (stall, fresh time.Duration) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, trips := range w.trips {
		first := time.Duration(-1)
		ends := make([]time.Time, 0, len(trips))
		for _, rt := range trips {
			ends = append(ends, rt.End)
			if first < 0 && !rt.Start.Before(at) {
				first = rt.End.Sub(at)
			}
		}
		require.GreaterOrEqual(t, first, time.Duration(0), "ping-pong %d completed no round trip after the %s", i, what)
		gap := LongestGap(ends, at, window)
		stall, fresh = max(stall, gap), max(fresh, first)
		t.Logf("%s: ping-pong %d: longest time without a round trip %v; first round trip begun after it done %v after it; %d round trips",
			what, i, gap.Round(100*time.Microsecond), first.Round(100*time.Microsecond), len(trips))
	}
	t.Logf("%s: bulk: longest time without a read %v; %d MiB echoed", what,
		LongestGap(w.bulkReads, at, window).Round(100*time.Microsecond), w.bulkBytes.Load()>>20)
	return stall, fresh
}
