package harness

import (
	"strings"
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
// checks that every sample measured a first echo, in RTTs of the link; then
// (one testbed for both) the first connection after an idle spell, on the
// healthy link and through a cut.
func TestRunColdStart(t *testing.T) {
	res, _, p := runTunnelSmoke(t, "hk", nil, ScCold, ScAfterIdle)
	n := map[string]int{}
	idle := map[string]int{}
	for _, smp := range res.Samples {
		if smp.Scenario == ScAfterIdle {
			assert.Empty(t, smp.Error, smp.Variant)
			assert.Positive(t, smp.Metrics["first_byte_ms"], smp.Variant)
			_, cut := smp.Metrics["after_cut_ms"]
			assert.Equal(t, strings.Contains(smp.Case, "link cut"), cut, smp.Case)
			idle[smp.Variant]++
			continue
		}
		require.Equal(t, ScCold, smp.Scenario)
		assert.Empty(t, smp.Error, smp.Variant)
		assert.Positive(t, smp.Metrics["first_byte_ms"], smp.Variant)
		assert.Positive(t, smp.Metrics["first_byte_rtts"], smp.Variant)
		assert.GreaterOrEqual(t, smp.Metrics["since_start_ms"], smp.Metrics["first_byte_ms"], smp.Variant)
		n[smp.Variant]++
	}
	assert.Equal(t, map[string]int{"direct": p.ColdSamples, "quictun": p.ColdSamples}, n)
	// Each sample once on the healthy link and once through the cut.
	assert.Equal(t, map[string]int{"direct": 2 * p.AfterIdleSamples, "quictun": 2 * p.AfterIdleSamples}, idle)
}
