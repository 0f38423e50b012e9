package harness

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunFailover runs the failover scenario (smoke profile): for each case
// a new tunnel succeeded after the failure, its first byte and the timeline
// are recorded; direct TCP has no such samples.
func TestRunFailover(t *testing.T) {
	res, _, p := runTunnelSmoke(t, "hv", nil, ScFailover)
	n := map[string]int{}
	for _, smp := range res.Samples {
		require.Equal(t, ScFailover, smp.Scenario)
		require.Equal(t, "quictun", smp.Variant)
		assert.Empty(t, smp.Error, smp.Case)
		assert.Positive(t, smp.Metrics["failover_ms"], smp.Case)
		assert.Positive(t, smp.Metrics["first_byte_ms"], smp.Case)
		assert.Positive(t, smp.Metrics["p99_first_byte_ms"], smp.Case)
		var timeline []foEvent
		require.NoError(t, json.Unmarshal(smp.Raw, &timeline), smp.Case)
		assert.NotEmpty(t, timeline, smp.Case)
		n[smp.Case]++
	}
	assert.Equal(t, map[string]int{FailoverKill: p.FailoverSamples, FailoverStop: p.FailoverSamples}, n)
}
