package cli

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
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

// A fresh process takes its memory from the system page by page as it
// first writes it: importing 1,000 tunnels and serving their
// re-attachments faulted in tens of MiB, each fault costly on a virtual
// machine (a fifth to a quarter of the new process's CPU during a
// 1,000-tunnel upgrade, perf of both sides, most of it in the goroutine
// stacks the tunnels start). The new process therefore writes, before it
// reports ready, about as much memory as its predecessor holds in heap
// objects and stacks (the old process tells it, envMemory), then frees
// it to the runtime: with the collector's pacing off the runtime keeps
// those pages (its scavenger gives them back to the system once the
// pacing is back), and the import's objects and stacks reuse them.

// warm writes about n bytes of memory and frees it (warmMemory), and
// returns how many it wrote; the collection that frees them is not
// counted among the cycles while the pacing was off. g may be nil (GOGC
// off already).
func (g *gcPause) warm(n int64) int64 {
	w := warmMemory(n)
	if g != nil {
		_, g.pausedAt = gcMemory()
	}
	return w
}

// memoryFromEnv reads envMemory (0: not set, or not a number) and clears
// it, so that this process's own children do not see it.
func memoryFromEnv() int64 {
	v, ok := os.LookupEnv(envMemory)
	if !ok {
		return 0
	}
	_ = os.Unsetenv(envMemory)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// envMemory names the environment variable in which an upgrading process
// tells its successor how much memory its heap objects and goroutine
// stacks hold (bytes).
const envMemory = "QUICTUN_HANDOVER_MEMORY"

// warmLimit bounds the memory warmMemory writes.
const warmLimit = gcPauseHeadroom / 2

// warmPiece is the size of each allocation warmMemory writes: a large
// object (its own span), freed whole.
const warmPiece = 256 << 10

// heldMemory is what this process's heap objects and goroutine stacks
// hold (bytes): what a successor will hold once it has every tunnel.
func heldMemory() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(s)
	return int64(min(s[0].Value.Uint64()+s[1].Value.Uint64(), math.MaxInt64))
}

// warmMemory writes about n bytes of newly allocated memory (warmSize),
// one write per page, and frees it (a collection); it returns how many
// bytes it wrote. Call it with the collector's pacing off (pauseGC), or
// the scavenger may give the pages back to the system at once.
func warmMemory(n int64) int64 {
	now, _ := gcMemory()
	w := warmSize(n, heldMemory(), debug.SetMemoryLimit(-1), now)
	if w == 0 {
		return 0
	}
	touch(int(w / warmPiece))
	runtime.GC()
	return w
}

// warmSize is what warmMemory writes for n: n less what the process holds
// already (held), at most warmLimit and half of what the memory limit
// leaves above the memory in use now, in whole warmPieces.
func warmSize(n, held, limit, now int64) int64 {
	w := min(n-held, warmLimit, (limit-now)/2)
	if w < warmPiece {
		return 0
	}
	return w / warmPiece * warmPiece
}

// touch allocates pieces of warmPiece bytes and writes one byte of each
// page; they are garbage once it returns.
func touch(pieces int) {
	page := os.Getpagesize()
	held := make([][]byte, 0, pieces)
	for range pieces {
		b := make([]byte, warmPiece)
		for i := 0; i < len(b); i += page {
			b[i] = 1
		}
		held = append(held, b)
	}
	runtime.KeepAlive(held)
}
