package cli

import (
	"math"
	"os"
	"runtime/debug"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// minorFaults is the process's count of minor page faults so far.
func minorFaults(t *testing.T) int64 {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return ru.Minflt
}

// TestWarmMemory: warmMemory writes what it is asked for beyond what the
// process holds, within its bound, and the memory written then serves new
// objects without faulting pages in (with the collector's pacing off, as
// in an upgrade's new process); without it, writing 32 MiB of new objects
// faults in about a page each 4 KiB.
func TestWarmMemory(t *testing.T) { // not parallel: the collector's settings are the process's
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	const size = 32 << 20
	g := pauseGC()
	require.NotNil(t, g)
	defer g.restore()
	assert.Zero(t, g.warm(heldMemory()/2), "less than the process holds: nothing to write")
	w := g.warm(heldMemory() + size)
	assert.InDelta(t, size, w, warmPiece, "what it holds already is not written again")

	if testutil.RaceEnabled {
		return // the race detector's shadow of each new object's memory faults in pages of its own
	}
	page := os.Getpagesize()
	before := minorFaults(t)
	pieces := make([][]byte, 0, size/(64<<10))
	for range cap(pieces) {
		b := make([]byte, 64<<10)
		for i := 0; i < len(b); i += page {
			b[i] = 1
		}
		pieces = append(pieces, b)
	}
	faults := minorFaults(t) - before
	assert.Less(t, faults, int64(size/page/4), "new objects in warmed memory fault in few pages (%d written)", size/page)
}

// TestWarmSize: what the old process holds, less what this one does,
// within warmLimit and half of what the memory limit leaves.
func TestWarmSize(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	for _, tc := range []struct {
		name                string
		n, held, limit, now int64
		want                int64
	}{
		{"not told", 0, 5 * mib, math.MaxInt64, 8 * mib, 0},
		{"the rest of the old process's", 60 * mib, 5 * mib, math.MaxInt64, 8 * mib, 55 * mib},
		{"in whole pieces", 60*mib + 1000, 5 * mib, math.MaxInt64, 8 * mib, 55 * mib},
		{"bounded", 1 << 40, 5 * mib, math.MaxInt64, 8 * mib, warmLimit},
		{"half of what the limit leaves", 60 * mib, 5 * mib, 48 * mib, 8 * mib, 20 * mib},
		{"past the limit", 60 * mib, 5 * mib, 8 * mib, 9 * mib, 0},
		{"less than a piece", 5*mib + 1000, 5 * mib, math.MaxInt64, 8 * mib, 0},
	} {
		assert.Equal(t, tc.want, warmSize(tc.n, tc.held, tc.limit, tc.now), tc.name)
	}
}

// TestMemoryFromEnv: the old process's figure is read once and cleared.
func TestMemoryFromEnv(t *testing.T) {
	t.Setenv(envMemory, "12345")
	assert.Equal(t, int64(12345), memoryFromEnv())
	_, ok := os.LookupEnv(envMemory)
	assert.False(t, ok, "cleared for this process's children")
	assert.Zero(t, memoryFromEnv())
	t.Setenv(envMemory, "lots")
	assert.Zero(t, memoryFromEnv())
}
