package harness

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLinkDelay(t *testing.T) {
	assert.Equal(t, 12500*time.Microsecond, linkDelay(LinkOf("WAN", WANDelay, 0, "")))
	assert.Zero(t, linkDelay(LinkSpec{Params: map[string]string{"delay": "soon"}}))
}

// TestRunColdStart restarts the quictun client in the smoke profile and
// checks that every sample measured a first echo, in RTTs of the link.
func TestRunColdStart(t *testing.T) {
	res, _, p := runTunnelSmoke(t, "hk", nil, ScCold)
	n := map[string]int{}
	for _, smp := range res.Samples {
		require.Equal(t, ScCold, smp.Scenario)
		assert.Empty(t, smp.Error, smp.Variant)
		assert.Positive(t, smp.Metrics["first_byte_ms"], smp.Variant)
		assert.Positive(t, smp.Metrics["first_byte_rtts"], smp.Variant)
		assert.GreaterOrEqual(t, smp.Metrics["since_start_ms"], smp.Metrics["first_byte_ms"], smp.Variant)
		n[smp.Variant]++
	}
	assert.Equal(t, map[string]int{"direct": p.ColdSamples, "quictun": p.ColdSamples}, n)
}
