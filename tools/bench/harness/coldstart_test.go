package harness

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/tools/linkem/netns"
)

func TestLinkDelay(t *testing.T) {
	assert.Equal(t, 12500*time.Microsecond, linkDelay(LinkOf("WAN", WANDelay, 0, "")))
	assert.Zero(t, linkDelay(LinkSpec{Params: map[string]string{"delay": "soon"}}))
}

// TestRunColdStart restarts the quictun client in the smoke profile and
// checks that every sample measured a first echo, in RTTs of the link.
func TestRunColdStart(t *testing.T) {
	needTestbed(t)
	needIP(t)
	bin := buildBins(t, "tools/latency-client", "cmd/quictun-server", "cmd/quictun-client")

	p, err := Profiles("smoke")
	require.NoError(t, err)
	prefix := "hk" + strconv.Itoa(os.Getpid()%100000)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	dir, err := Run(ctx, Options{Profile: p, BinDir: bin, ResultsDir: t.TempDir(), Prefix: prefix, Variants: []string{"direct", "quictun"},
		Scenarios: []string{ScCold}, SkipChecks: true, Spin: time.Millisecond})
	require.NoError(t, err)
	c, s := netns.Names(prefix)
	assert.False(t, netns.Exists(c), "namespace %s left behind", c)
	assert.False(t, netns.Exists(s), "namespace %s left behind", s)

	res, err := LoadResults(dir)
	require.NoError(t, err)
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
