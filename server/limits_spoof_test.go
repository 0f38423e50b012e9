package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func spoofedIP(i int) string { return fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255) }

// TestSourceLimiterBoundedUnderSpoofing: every Initial packet from a new
// (possibly spoofed) source reaches VerifySourceAddress → suspicious before any
// address validation, so the per-source table must stay bounded.
func TestSourceLimiterBoundedUnderSpoofing(t *testing.T) {
	t.Parallel()
	l := newSourceLimiter(20, 64, 0)
	now := time.Unix(1000, 0)
	for i := range maxTrackedSources + 200 {
		l.suspicious(spoofedIP(i), now)
	}
	l.mu.Lock()
	n := len(l.sources)
	l.mu.Unlock()
	assert.LessOrEqual(t, n, maxTrackedSources, "per-source table grew past its bound")
}

// BenchmarkSourceLimiterNewSource measures what one Initial from a new source
// costs when the table is full of recent sources.
func BenchmarkSourceLimiterNewSource(b *testing.B) {
	l := newSourceLimiter(20, 64, 0)
	now := time.Unix(1000, 0)
	for i := range maxTrackedSources {
		l.suspicious(spoofedIP(i), now)
	}
	b.ResetTimer()
	for i := range b.N {
		l.suspicious(spoofedIP(maxTrackedSources+i), now)
	}
}
