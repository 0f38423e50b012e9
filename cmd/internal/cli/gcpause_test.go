package cli

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gcPercent reads GOGC's setting without changing it.
func gcPercent() int {
	p := debug.SetGCPercent(-1)
	debug.SetGCPercent(p)
	return p
}

// TestPauseGC: pauseGC switches the collector's pacing off within a memory
// limit of the heap plus the headroom (or the operator's lower limit), and
// restore gives both settings back, once; with GOGC off already it does
// nothing.
func TestPauseGC(t *testing.T) { // not parallel: the collector's settings are the process's
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, tc := range []struct {
		name    string
		percent int
		limit   int64
	}{
		{"defaults", 100, math.MaxInt64},
		{"operator's GOGC and GOMEMLIMIT", 150, 1 << 40},
		{"operator's low GOMEMLIMIT", 80, 16 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(tc.percent)
			debug.SetMemoryLimit(tc.limit)
			before, _ := gcMemory()
			g := pauseGC()
			require.NotNil(t, g)
			assert.Equal(t, -1, gcPercent(), "pacing off")
			limit := debug.SetMemoryLimit(-1)
			assert.LessOrEqual(t, limit, tc.limit, "never above the operator's limit")
			assert.LessOrEqual(t, limit, before+2*gcPauseHeadroom, "the heap may grow by the headroom, not more")
			assert.Greater(t, limit, min(tc.limit-1, before), "room to grow")
			g.restore()
			g.restore()
			assert.Equal(t, tc.percent, gcPercent())
			assert.Equal(t, tc.limit, debug.SetMemoryLimit(-1))
		})
	}
	t.Run("GOGC off", func(t *testing.T) {
		debug.SetGCPercent(-1)
		debug.SetMemoryLimit(math.MaxInt64)
		g := pauseGC()
		assert.Nil(t, g)
		assert.Zero(t, g.restore())
		assert.Equal(t, -1, gcPercent())
		assert.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1))
	})
}
