package cli

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// An upgrade's new process takes every tunnel over within milliseconds of
// its start, with a heap of a few MiB: importing 1,000 tunnels (each a
// Pipe with its goroutines and its unconfirmed bytes) and serving their
// re-attachments grows it tenfold, and with GOGC's default pacing the
// collector ran several cycles meanwhile, each scanning the stacks of
// thousands of new goroutines: a quarter of the new process's CPU during
// the hand-over (perf, 1,000 tunnels, both upgrades), on the CPU the
// re-attachments wait for. gcPauseHeadroom bounds what the heap may grow by
// while the collector's pacing is off.
const gcPauseHeadroom = 256 << 20

// gcPause is the garbage collector's pacing switched off for a while
// (pauseGC): within a memory limit of the heap then plus gcPauseHeadroom, or
// the process's own limit if lower (GOMEMLIMIT), where the collector runs
// again.
type gcPause struct {
	once             sync.Once
	percent          int
	limit            int64
	pausedAt, cycles uint64
}

// pauseGC switches the collector's pacing off until restore is called
// (nil: GOGC is off already, as the operator asked).
func pauseGC() *gcPause {
	percent := debug.SetGCPercent(-1)
	if percent < 0 {
		debug.SetGCPercent(percent)
		return nil
	}
	limit := debug.SetMemoryLimit(-1) // reads it
	now, cycles := gcMemory()
	debug.SetMemoryLimit(min(limit, satAdd(now, gcPauseHeadroom)))
	return &gcPause{percent: percent, limit: limit, pausedAt: cycles}
}

// restore gives the collector its pacing back (once; nil: nothing to do)
// and returns how many cycles ran while it was paused (at the memory
// limit).
func (g *gcPause) restore() (cycles uint64) {
	if g == nil {
		return 0
	}
	g.once.Do(func() {
		debug.SetMemoryLimit(g.limit)
		debug.SetGCPercent(g.percent)
		_, now := gcMemory()
		g.cycles = now - g.pausedAt
	})
	return g.cycles
}

// gcMemory returns the memory the memory limit counts (the Go runtime's
// total minus what it released to the system) and the collector's cycles
// so far.
func gcMemory() (bytes int64, cycles uint64) {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"},
		{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	total, released := s[0].Value.Uint64(), s[1].Value.Uint64()
	return int64(min(total-min(released, total), math.MaxInt64)), s[2].Value.Uint64()
}

// satAdd is a+b, at most math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
