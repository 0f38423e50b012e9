package server

import (
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
)

// TestStreamWorkersReused: streams one after the other run on one
// goroutine, kept between them; a burst starts a goroutine per stream at
// once, of which at most max stay to wait; stop ends those and waits for
// the work still running.
func TestStreamWorkersReused(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newStreamWorkers(4)
		var ran atomic.Int64
		for range 10 {
			w.Go(func() { ran.Add(1) })
			synctest.Wait() // done, and its worker waits for more
		}
		require.EqualValues(t, 10, ran.Load())
		require.EqualValues(t, 1, w.started.Load(), "one after the other: one goroutine")

		release := make(chan struct{})
		for range 10 {
			w.Go(func() { <-release; ran.Add(1) })
		}
		synctest.Wait()
		require.EqualValues(t, 10, w.started.Load(), "a burst of 10: the waiting worker and 9 new ones")
		close(release)
		synctest.Wait()
		require.EqualValues(t, 20, ran.Load())
		require.EqualValues(t, 4, w.idle.Load(), "at most max wait")

		block := make(chan struct{})
		w.Go(func() { <-block })
		stopped := make(chan struct{})
		go func() { w.stop(); close(stopped) }()
		synctest.Wait()
		select {
		case <-stopped:
			t.Fatal("stop returned while a stream was still being served")
		default:
		}
		close(block)
		<-stopped
		require.Zero(t, w.idle.Load())
	})
}
