package harness

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// seg is a stretch of a synthetic flow: this long at this rate.
type seg struct {
	d    time.Duration
	mbit float64
}

// synthFlow returns the arrivals of a flow that starts at t0 and runs the
// segments one after the other, one point every 10 ms.
func synthFlow(t0 time.Time, segs ...seg) []flowPoint {
	const step = 10 * time.Millisecond
	pts := []flowPoint{{t0, 0}}
	t, cum := t0, 0.0
	for _, s := range segs {
		for range int(s.d / step) {
			t = t.Add(step)
			cum += s.mbit * 1e6 / 8 * step.Seconds()
			pts = append(pts, flowPoint{t, int64(cum)})
		}
	}
	return pts
}

func TestYieldMetrics(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)
	sec := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	start, end := sec(5), sec(10)
	swinging := make([]seg, 0, 20)
	for i := range 20 {
		// 250 ms at 20, 250 ms at 80: never settles.
		swinging = append(swinging, seg{250 * time.Millisecond, 20 + 60*float64(i%2)})
	}
	never := yieldNever
	tests := []struct {
		name string
		pts  []flowPoint
		end  time.Time
		want map[string]float64 // the keys that must be there, with these values
		not  []string           // keys that must not be there
	}{
		{
			name: "settles and falls to a fifth 300 ms after the start",
			pts:  synthFlow(t0, seg{5300 * time.Millisecond, 50}, seg{4700 * time.Millisecond, 10}),
			end:  end,
			// Window [t-250ms, t] below 25 Mbit/s from t = 5.5 s (150 ms at
			// 50 and 100 ms at 10 make 26; 50 and 200 make 18).
			want: map[string]float64{"yield_settled": 1, "yield_before_mbit_per_s": 50, "yield_s": 0.5, "yield_first_s": 0.5,
				"yielded": 1, "yield_after_mbit_per_s": 10},
		},
		{
			name: "never falls",
			pts:  synthFlow(t0, seg{10 * time.Second, 50}),
			end:  end,
			want: map[string]float64{"yield_settled": 1, "yield_before_mbit_per_s": 50, "yield_s": never, "yield_first_s": never,
				"yielded": 0, "yield_after_mbit_per_s": 50},
		},
		{
			name: "falls only to 60 %: not below half",
			pts:  synthFlow(t0, seg{5 * time.Second, 50}, seg{5 * time.Second, 30}),
			end:  end,
			want: map[string]float64{"yield_s": never, "yield_first_s": never, "yielded": 0, "yield_after_mbit_per_s": 30},
		},
		{
			name: "a 300 ms dip is a first fall, the lasting fall comes at 3 s",
			pts: synthFlow(t0, seg{5200 * time.Millisecond, 50}, seg{300 * time.Millisecond, 0},
				seg{2500 * time.Millisecond, 50}, seg{2 * time.Second, 5}),
			end: end,
			// Dip: [t-250ms, t] below 25 from t = 5.35 s (150 ms of zero) to
			// 5.6 s; the lasting fall at 8 s: below from 8.15 s on.
			want: map[string]float64{"yield_first_s": 0.35, "yield_s": 3.15, "yielded": 1},
		},
		{
			name: "falls too near the end to tell whether it lasts",
			pts:  synthFlow(t0, seg{9800 * time.Millisecond, 50}, seg{200 * time.Millisecond, 0}),
			end:  end,
			want: map[string]float64{"yield_settled": 1, "yield_first_s": 4.95, "yield_s": never, "yielded": 0},
		},
		{
			name: "never settles: swinging between 20 and 80 every 250 ms",
			pts:  synthFlow(t0, append(swinging, seg{5 * time.Second, 5})...),
			end:  end,
			want: map[string]float64{"yield_settled": 0, "yield_before_mbit_per_s": 50},
			not:  []string{"yield_s", "yield_first_s", "yielded", "yield_after_mbit_per_s"},
		},
		{
			name: "started less than a second before the competing flow",
			pts:  synthFlow(sec(4.5), seg{5500 * time.Millisecond, 50}),
			end:  end,
			want: map[string]float64{"yield_settled": 0},
			not:  []string{"yield_s", "yield_first_s", "yielded"},
		},
		{
			name: "nothing before the start",
			pts:  synthFlow(t0, seg{5 * time.Second, 0}, seg{5 * time.Second, 50}),
			end:  end,
			want: map[string]float64{"yield_settled": 0, "yield_before_mbit_per_s": 0},
			not:  []string{"yield_s"},
		},
		{
			name: "no arrivals",
			end:  end,
			want: map[string]float64{"yield_settled": 0},
			not:  []string{"yield_s", "yield_before_mbit_per_s"},
		},
		{
			name: "common time too short for the rate after",
			pts:  synthFlow(t0, seg{6200 * time.Millisecond, 50}),
			end:  sec(6.2),
			want: map[string]float64{"yield_settled": 1, "yield_s": never},
			not:  []string{"yield_after_mbit_per_s"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := yieldMetrics(tc.pts, start, tc.end)
			for k, v := range tc.want {
				require.Contains(t, m, k)
				assert.InDelta(t, v, m[k], 1e-6, k)
			}
			for _, k := range tc.not {
				assert.NotContains(t, m, k)
			}
		})
	}
}

func TestFairTimelineAndCase(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "vs direct TCP cubic", fairCase("cubic", 0), "the case of the existing runs is unchanged")
	assert.Equal(t, "vs direct TCP cubic, after 5s alone", fairCase("cubic", 5*time.Second))

	t0 := time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)
	var raw fairRaw
	fairTimeline(&raw, synthFlow(t0, seg{2 * time.Second, 40}, seg{time.Second, 20}), synthFlow(t0.Add(2*time.Second), seg{time.Second, 60}))
	assert.InDelta(t, 0.25, raw.BinSeconds, 1e-9)
	assert.InDelta(t, 2, raw.AgainstStartS, 1e-9)
	require.Len(t, raw.FlowBins, 12)
	require.Len(t, raw.AgainstBins, 12)
	assert.InDelta(t, 40, raw.FlowBins[0], 1e-6)
	assert.InDelta(t, 20, raw.FlowBins[11], 1e-6)
	assert.Zero(t, raw.AgainstBins[7], "before its start")
	assert.InDelta(t, 60, raw.AgainstBins[8], 1e-6)

	var empty fairRaw
	fairTimeline(&empty, nil, nil)
	assert.Nil(t, empty.FlowBins)
}

// TestFairReportTimeline renders a delayed fairness sample: the yield
// columns, the timeline chart and the CSV.
func TestFairReportTimeline(t *testing.T) {
	t.Parallel()
	res := sampleResults()
	res.Variants = []string{"quictun"}
	raw, err := json.Marshal(fairRaw{BinSeconds: 0.25, AgainstStartS: 0.5, FlowBins: []float64{50, 50, 20, 10}, AgainstBins: []float64{0, 0, 30, 80}})
	require.NoError(t, err)
	res.Samples = []Sample{{Scenario: ScFair, Link: "WAN 100mbit", Case: fairCase("cubic", 5*time.Second), Variant: "quictun", Raw: raw,
		Metrics: map[string]float64{"mbit_per_s": 12, "against_mbit_per_s": 80, "share_pct": 12, "against_share_pct": 80, "jain": 0.6,
			"yield_settled": 1, "yield_before_mbit_per_s": 50, "yield_s": 0.4, "yield_first_s": 0.4, "yielded": 1, "yield_after_mbit_per_s": 11}}}
	dir := t.TempDir()
	require.NoError(t, WriteReport(dir, res))
	b, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	md := string(b)
	assert.Contains(t, md, "| Jain | settled before | flow Mbit/s before | yield s | first fall s | yielded | flow Mbit/s after 1 s |")
	assert.Contains(t, md, "| WAN 100mbit | vs direct TCP cubic, after 5s alone | quictun | 12.00 | 80.00 | 12.00 | 80.00 | 0.6 | 1.00 | 50.00 | 0.4 | 0.4 | 1.00 | 11.00 |")
	assert.Contains(t, md, "[fairness-timeline.csv](fairness-timeline.csv)")
	png := "fairness-timeline-wan-100mbit-vs-direct-tcp-cubic-after-5s-alone-quictun.png"
	assert.Contains(t, md, png)
	_, err = os.Stat(filepath.Join(dir, png))
	require.NoError(t, err)
	csv, err := os.ReadFile(filepath.Join(dir, fairTimelineCSV))
	require.NoError(t, err)
	assert.Equal(t, "link,case,variant,rep,t_start_s,flow_mbit_per_s,against_mbit_per_s\n"+
		"WAN 100mbit,\"vs direct TCP cubic, after 5s alone\",quictun,0,0.000,50.000,0.000\n"+
		"WAN 100mbit,\"vs direct TCP cubic, after 5s alone\",quictun,0,0.250,50.000,0.000\n"+
		"WAN 100mbit,\"vs direct TCP cubic, after 5s alone\",quictun,0,0.500,20.000,30.000\n"+
		"WAN 100mbit,\"vs direct TCP cubic, after 5s alone\",quictun,0,0.750,10.000,80.000\n", string(csv))
}

// TestAggregateNever: a yield that never happened (-1) is counted, not
// taken into the median, and shown as never.
func TestAggregateNever(t *testing.T) {
	t.Parallel()
	mk := func(rep int, v string, y float64) Sample {
		return Sample{Scenario: ScFair, Link: "WAN", Case: "c", Variant: v, Rep: rep, Metrics: map[string]float64{"yield_s": y, "jain": -1}}
	}
	agg := Aggregate([]Sample{mk(0, "a", 0.5), mk(1, "a", yieldNever), mk(2, "a", 0.7), mk(0, "b", yieldNever), mk(1, "b", yieldNever)})
	a := agg[Key{ScFair, "WAN", "c", "a", "yield_s"}]
	assert.Equal(t, Summary{Median: 0.6, Min: 0.5, Max: 0.7, N: 2, Never: 1}, a)
	assert.Equal(t, "0.6 (0.5–0.7), never ×1", fmtSummary(a, true))
	b := agg[Key{ScFair, "WAN", "c", "b", "yield_s"}]
	assert.Equal(t, Summary{Never: 2}, b)
	assert.Equal(t, "never ×2", fmtSummary(b, true))
	assert.Equal(t, "never", fmtSummary(Summary{Never: 1}, true))
	assert.Equal(t, -1.0, agg[Key{ScFair, "WAN", "c", "b", "jain"}].Median, "-1 is only special for the yield metrics")
}

// TestRunFairDelay runs the fairness scenario with the competing flow
// started later (smoke profile) and checks its case, the yield figures'
// presence, the timeline and the teardown.
func TestRunFairDelay(t *testing.T) {
	res, dir, _ := runTunnelSmoke(t, "hy", func(o *Options) {
		o.Profile.FairDelay = 2 * time.Second
		o.Variants = []string{"quictun"}
	}, ScFair)
	require.Len(t, res.Samples, 1, "notes %v", res.Notes)
	s := res.Samples[0]
	assert.Empty(t, s.Error)
	assert.Equal(t, "vs direct TCP cubic, after 2s alone", s.Case)
	assert.Contains(t, s.Metrics, "yield_settled")
	assert.Contains(t, s.Metrics, "share_pct")
	assert.NotContains(t, s.Metrics, "whole_share_pct", "the tunnel's whole run includes its time alone")
	var raw fairRaw
	require.NoError(t, json.Unmarshal(s.Raw, &raw))
	assert.Positive(t, raw.Flow.Bytes)
	assert.Positive(t, raw.Against.Bytes)
	assert.Greater(t, raw.AgainstStartS, 0.5, "the competing flow started later")
	assert.GreaterOrEqual(t, len(raw.FlowBins), 8, "3 s of 250 ms bins, less the ends")
	assert.Len(t, raw.AgainstBins, len(raw.FlowBins))
	_, err := os.Stat(filepath.Join(dir, fairTimelineCSV))
	require.NoError(t, err)
}
