package harness

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleResults() *Results {
	mk := func(sc, link, cs, v string, rep int, m map[string]float64, e string) Sample {
		return Sample{Scenario: sc, Link: link, Case: cs, Variant: v, Rep: rep, Metrics: m, Error: e}
	}
	return &Results{
		Version: 1, Profile: "quick", Started: time.Date(2026, 11, 23, 5, 0, 0, 0, time.UTC),
		Finished: time.Date(2026, 11, 23, 5, 5, 0, 0, time.UTC), Reps: 3,
		Variants: []string{"direct", "quictun"},
		Links:    []LinkSpec{LinkOf("LAN", LANDelay, 0.01, "")},
		Checks:   []Check{{Name: "RTT LAN", Configured: "0.25ms", Measured: "0.6 ms", Value: 0.6, Expected: 0.5, Unit: "ms"}},
		Samples: []Sample{
			mk(ScLatency, "LAN loss 1%", "1000 x 1000 B", "direct", 0, map[string]float64{"total_ms": 4000, "first_packet_ms": 1}, ""),
			mk(ScLatency, "LAN loss 1%", "1000 x 1000 B", "direct", 1, map[string]float64{"total_ms": 5000, "first_packet_ms": 2}, ""),
			mk(ScLatency, "LAN loss 1%", "1000 x 1000 B", "direct", 2, map[string]float64{"total_ms": 4500, "first_packet_ms": 3}, "boom"),
			mk(ScLatency, "LAN loss 1%", "1000 x 1000 B", "quictun", 0, map[string]float64{"total_ms": 2000, "first_packet_ms": 2}, ""),
			mk(ScBulk, "WAN 100mbit loss 0%", "1 stream(s)", "quictun", 0, map[string]float64{"mbit_per_s": 90}, ""),
			mk(ScBulk, "WAN 100mbit loss 0%", "1 stream(s)", "direct", 0, map[string]float64{"mbit_per_s": 94}, ""),
		},
	}
}

func TestAggregate(t *testing.T) {
	t.Parallel()
	agg := Aggregate(sampleResults().Samples)
	s := agg[Key{ScLatency, "LAN loss 1%", "1000 x 1000 B", "direct", "total_ms"}]
	assert.InDelta(t, 4500, s.Median, 1e-9)
	assert.InDelta(t, 4000, s.Min, 1e-9)
	assert.InDelta(t, 5000, s.Max, 1e-9)
	assert.Equal(t, 3, s.N)
	assert.Equal(t, 1, s.Errors)

	even := summarize([]float64{4, 1, 3, 2}, 0)
	assert.InDelta(t, 2.5, even.Median, 1e-9)
}

func TestSaveLoadReportCompare(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	res := sampleResults()
	require.NoError(t, res.Save(filepath.Join(dir, "results.json")))
	back, err := LoadResults(dir)
	require.NoError(t, err)
	assert.Equal(t, res.Samples, back.Samples)

	require.NoError(t, WriteReport(dir, back))
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	text := string(md)
	assert.Contains(t, text, "## 1. Latency")
	assert.Contains(t, text, "| LAN loss 1% | 1000 x 1000 B | total ms | 4500 (4000–5000) ⚠1 | 2000 |")
	assert.Contains(t, text, "| RTT LAN | 0.25ms | 0.6 ms |")
	assert.Contains(t, text, "boom")
	assert.Contains(t, text, "![")
	pngs, _ := filepath.Glob(filepath.Join(dir, "*.png"))
	assert.NotEmpty(t, pngs)

	newer := sampleResults()
	for i := range newer.Samples {
		if newer.Samples[i].Variant == "quictun" {
			for k, v := range newer.Samples[i].Metrics {
				newer.Samples[i].Metrics[k] = v / 2
			}
		}
	}
	var out bytes.Buffer
	require.NoError(t, Compare(&out, res, newer, false))
	cmp := out.String()
	assert.Contains(t, cmp, "| latency | LAN loss 1% | 1000 x 1000 B | quictun | total_ms | 2000 | 1000 | 0.500 ↑ |")
	assert.Contains(t, cmp, "| bulk | WAN 100mbit loss 0% | 1 stream(s) | quictun | mbit_per_s | 90.00 | 45.00 | 0.500 ↓ |")
	assert.Contains(t, cmp, "| latency | LAN loss 1% | 1000 x 1000 B | direct | total_ms | 4500 | 4500 | 1.000 |")

	// Metrics outside the report's tables appear only with all.
	res.Samples[0].Metrics["p50_ms"] = 1
	newer.Samples[0].Metrics["p50_ms"] = 2
	out.Reset()
	require.NoError(t, Compare(&out, res, newer, false))
	assert.NotContains(t, out.String(), "p50_ms")
	out.Reset()
	require.NoError(t, Compare(&out, res, newer, true))
	assert.Contains(t, out.String(), "| p50_ms | 1.00 | 2.00 | 2.000 ↓ |")
}

func TestProfiles(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"quick", "full", "cc", "smoke"} {
		p, err := Profiles(name)
		require.NoError(t, err)
		assert.Equal(t, name, p.Name)
		assert.Positive(t, p.Reps)
		assert.NotEmpty(t, p.Scenarios)
		for _, s := range append(append([]string{}, p.EchoSizes...), p.ReqSizes...) {
			_, err := ParseSize(s)
			assert.NoError(t, err, s)
		}
	}
	_, err := Profiles("huge")
	require.Error(t, err)
	full, _ := Profiles("full")
	assert.Len(t, full.LatencyLinks, 6)
	assert.Len(t, full.BulkLinks, 10)
	assert.Equal(t, []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 35 * time.Second}, full.Blackouts)
	assert.Equal(t, 1000, full.ScaleConns)
	assert.Empty(t, full.Congestion, "full keeps one quictun variant")
	for _, name := range []string{"quick", "full", "smoke"} {
		p, _ := Profiles(name)
		assert.Contains(t, p.Scenarios, ScUDPBlocked, name)
		assert.NotEmpty(t, p.UDPBlockedLink.Params["delay"], "%s: udp-blocked has its link", name)
	}

	cc, _ := Profiles("cc")
	assert.Equal(t, []string{ScBulk, ScFair, ScRateCap, ScBlackoutBulk}, cc.Scenarios)
	var names []string
	for _, l := range cc.BulkLinks {
		names = append(names, l.Name)
	}
	assert.Equal(t, []string{"WAN 100mbit loss 0%", "WAN 100mbit loss 1%", "WAN 100mbit loss 2%", "WAN 100mbit loss 5%"}, names)
	assert.Equal(t, []string{"bbr", "cubic", "reno"}, cc.Congestion)
	assert.Equal(t, []string{"cubic", "bbr"}, cc.DirectCC)
	assert.Equal(t, "cubic", cc.FairAgainst)
	assert.Equal(t, []time.Duration{10 * time.Second, 30 * time.Second}, cc.BlackoutBulkDurations)
	assert.Equal(t, "WAN 100mbit loss 10%", cc.BlackoutBulkLinks[1].Name)
	// Rough lower bound of its length with 6 variants, 4 of them in the
	// blackout cases: it must stay near 15 minutes.
	est := time.Duration(len(cc.BulkLinks)*6)*cc.BulkDuration + time.Duration(len(cc.FairLinks)*6)*cc.FairDuration
	for _, d := range cc.BlackoutBulkDurations {
		est += time.Duration(len(cc.BlackoutBulkLinks)*4) * (cc.BlackoutBulkWarmup + d + 2*time.Second)
	}
	assert.Less(t, est, 14*time.Minute, "estimate %v", est)
	for _, name := range AllScenarios() {
		_, ok := Scenarios()[name]
		assert.True(t, ok, "report info of %s", name)
	}
}

func TestParseSizeAndLinks(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"128": 128, "1KB": 1000, "100KB": 100000, "16KiB": 16384, "16MiB": 16 << 20, "1GB": 1e9} {
		got, err := ParseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "x", "-1", "1.5KB", "0"} {
		_, err := ParseSize(bad)
		assert.Error(t, err, bad)
	}
	l := LinkOf("WAN", WANDelay, 0.005, "100mbit")
	assert.Equal(t, "WAN 100mbit loss 0.5%", l.Name)
	assert.Equal(t, map[string]string{"delay": "12.5ms", "loss": "0.005", "rate": "100mbit"}, l.Params)
	assert.Equal(t, "LAN loss 0%", LinkOf("LAN", LANDelay, 0, "0").Name)
	assert.Equal(t, "WAN loss 0.1%", LinkOf("WAN", WANDelay, 0.001, "").Name)
}
