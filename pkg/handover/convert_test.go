package handover

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/quictun/quictun/pkg/resume"
)

// TestLimitsOf: nothing without resumable tunnels; each tunnel within the
// cap plus one read (the default cap without one); all within the budget
// when it is smaller than the tunnels' sum.
func TestLimitsOf(t *testing.T) {
	t.Parallel()
	on := func() time.Duration { return time.Minute }
	off := func() time.Duration { return 0 }
	per := resume.DefaultCap + resume.ChunkSize + resume.ExtraBytes
	for _, tc := range []struct {
		name string
		s    *resume.Settings
		max  int
		want Limits
	}{
		{"no settings", nil, 10, Limits{}},
		{"window 0", &resume.Settings{Window: off}, 10, Limits{}},
		{"default cap, no budget", &resume.Settings{Window: on}, 10, Limits{MaxTunnels: 10, MaxTunnelBytes: per, MaxTotalBytes: 10 * int64(per)}},
		{"own cap", &resume.Settings{Window: on, Cap: 1 << 20}, 2, Limits{MaxTunnels: 2, MaxTunnelBytes: 1<<20 + resume.ChunkSize + resume.ExtraBytes,
			MaxTotalBytes: 2 * int64(1<<20+resume.ChunkSize+resume.ExtraBytes)}},
		{"budget below the sum", &resume.Settings{Window: on, Budget: resume.NewBudget(5 << 20)}, 10, Limits{MaxTunnels: 10, MaxTunnelBytes: per, MaxTotalBytes: 5 << 20}},
	} {
		assert.Equal(t, tc.want, LimitsOf(tc.s, tc.max), tc.name)
	}
}
