package server

import (
	"sync"
	"sync/atomic"
)

// maxIdleStreamWorkers bounds the goroutines kept waiting for the next
// stream, server-wide: their stacks (grown to what serving a stream takes,
// some 16-32 KiB) are the memory the pool holds at most.
const maxIdleStreamWorkers = 32

// streamWorkers runs the streams of every connection on goroutines kept
// between streams. A new goroutine starts with a small stack, and serving a
// stream (header, rules, dial) grows it: the runtime copies the stack each
// time, some 4-5 % of the server's CPU when clients open many short
// tunnels. A goroutine kept has it grown already. At most
// maxIdleStreamWorkers wait; the rest end after their stream. Run owns the
// pool: it stops it once no connection can start a stream.
type streamWorkers struct {
	work chan func()
	done chan struct{}
	idle atomic.Int32
	max  int32
	wg   sync.WaitGroup
	// started counts the goroutines started (tests).
	started atomic.Int64
}

func newStreamWorkers(maxIdle int) *streamWorkers {
	return &streamWorkers{work: make(chan func()), done: make(chan struct{}), max: int32(maxIdle)}
}

// Go runs f on a waiting worker, or on a new one.
func (w *streamWorkers) Go(f func()) {
	select {
	case w.work <- f:
	default:
		w.started.Add(1)
		w.wg.Go(func() { w.run(f) })
	}
}

// run runs f, then waits for the next work while fewer than max others
// wait, until stop.
func (w *streamWorkers) run(f func()) {
	for {
		f()
		if w.idle.Add(1) > w.max {
			w.idle.Add(-1)
			return
		}
		select {
		case f = <-w.work:
			w.idle.Add(-1)
		case <-w.done:
			w.idle.Add(-1)
			return
		}
	}
}

// waiting returns how many workers wait for work.
func (w *streamWorkers) waiting() int { return int(w.idle.Load()) }

// stop ends the waiting workers and waits for the others to end their
// work. Call it once, when Go can no longer be called.
func (w *streamWorkers) stop() {
	close(w.done)
	w.wg.Wait()
}
