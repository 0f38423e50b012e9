package harness

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/tools/linkem/emu"
)

func TestLossProfile(t *testing.T) {
	p, err := Profiles("loss")
	require.NoError(t, err)
	assert.Equal(t, []string{ScLoss, ScFair}, p.Scenarios)
	assert.Equal(t, 3, p.Reps)
	assert.Equal(t, 3, p.LossRuns)
	assert.Equal(t, 10*time.Second, p.LossDuration)
	var names []string
	for _, l := range p.LossLinks {
		names = append(names, l.Name)
		assert.Equal(t, "100mbit", l.Params["rate"])
		assert.Equal(t, WANDelay, l.Params["delay"])
	}
	assert.Equal(t, []string{"WAN 100mbit loss 0%", "WAN 100mbit loss 1%", "WAN 100mbit loss 5%", "WAN 100mbit loss 10%",
		"WAN 100mbit loss 20%", "WAN 100mbit loss 30%", "WAN 100mbit loss 50%"}, names)
	require.Len(t, p.FairLinks, 2)
	// 30 and 50 ms at 100 Mbit/s.
	assert.Equal(t, "375000", p.FairLinks[0].Params["queue-bytes"])
	assert.Equal(t, "625000", p.FairLinks[1].Params["queue-bytes"])
	assert.Equal(t, "WAN 100mbit loss 0% queue 30ms", p.FairLinks[0].Name)
	assert.Equal(t, []string{"quictun"}, p.FairVariants)
	assert.Equal(t, []string{"bbr", "cubic"}, p.DirectCC)
	// Bounded: 7 levels x 3 repetitions x 5 variants (4 + --bin-b) x
	// (3 runs of 10 s, each with its drain limit, and a restart) fits.
	worst := time.Duration(len(p.LossLinks)*p.Reps*5) * (time.Duration(p.LossRuns)*(p.LossDuration+lossDrainLimit) + 25*time.Second)
	assert.Greater(t, p.MaxDuration, worst/2, "typical runs finish well inside the bound")
	for _, l := range append(p.LossLinks, p.FairLinks...) {
		assert.NotPanics(t, func() { _ = linkUpdate(l) }, l.Name)
		require.NoError(t, validLink(l), l.Name)
	}
}

// validLink checks that the emulator accepts the link's parameters.
func validLink(l LinkSpec) error {
	ctl := emu.NewControl(emu.NewLink(emu.DefaultParams(), 1), emu.NewLink(emu.DefaultParams(), 2), emu.RealClock())
	return ctl.Apply(linkUpdate(l))
}

func TestWithQueueUnlimitedRate(t *testing.T) {
	l := withQueue(LinkOf("WAN", WANDelay, 0, ""), 30*time.Millisecond)
	assert.NotContains(t, l.Params, "queue-bytes", "no rate, no queue to size")
}

func TestRateBinsAndMin(t *testing.T) {
	t0 := time.Unix(100, 0)
	// 1.25 MB in the first second (10 Mbit/s), nothing in the second.
	pts := []flowPoint{{t0, 0}, {t0.Add(500 * time.Millisecond), 625_000}, {t0.Add(time.Second), 1_250_000}}
	bins := rateBins(pts, t0, 2*time.Second, 500*time.Millisecond)
	require.Len(t, bins, 4)
	assert.InDelta(t, 10, bins[0], 1e-9)
	assert.InDelta(t, 10, bins[1], 1e-9)
	assert.InDelta(t, 0, bins[2], 1e-9)
	assert.InDelta(t, 5, rateBetween(pts, t0, t0.Add(2*time.Second)), 1e-9)
	assert.Equal(t, 0.0, minOf([]float64{88, 0, 23}), "a run that got nothing is the figure")
	assert.Equal(t, 23.0, minOf([]float64{88, 71, 23}))
	assert.Equal(t, 88.0, maxOf([]float64{88, 71, 23}))
	assert.Equal(t, 0.0, minOf(nil))
}

// lossResults is a finished loss run of two variants, two repetitions.
func lossResults(t *testing.T) *Results {
	t.Helper()
	res := &Results{Profile: "loss", Reps: 2, Variants: []string{"kcptun", "quictun", "direct-bbr"}}
	link := "WAN 100mbit loss 10%"
	runs := map[string][][]float64{"kcptun": {{38, 39, 38}, {37, 40, 39}}, "quictun": {{18, 70, 18}, {63, 9, 18}}}
	for v, reps := range runs {
		for rep, rs := range reps {
			for i, x := range rs {
				raw, err := json.Marshal(lossRaw{Bins: []float64{x, x, x}, BinSeconds: 0.5})
				require.NoError(t, err)
				res.Samples = append(res.Samples, Sample{Scenario: ScLoss, Link: link, Case: lossRunName(i), Variant: v, Rep: rep,
					Metrics: map[string]float64{"mbit_per_s": x, "cpu_client_pct": 20, "cpu_server_pct": 30, "emu_cpu_pct": 40}, Raw: raw})
			}
			res.Samples = append(res.Samples, Sample{Scenario: ScLoss, Link: link, Case: lossMinCase, Variant: v, Rep: rep,
				Metrics: map[string]float64{"mbit_per_s": minOf(rs)}})
		}
	}
	return res
}

func TestLossReport(t *testing.T) {
	res := lossResults(t)
	dir := t.TempDir()
	require.NoError(t, WriteReport(dir, res))
	b, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	md := string(b)
	assert.Contains(t, md, "## 2c. Heavy random loss (issue 31)")
	assert.Contains(t, md, "| loss | kcptun | quictun | quictun ×kcptun |", "direct-bbr has no loss samples: no column")
	// quictun: minima 18 and 9; each run listed; CPU beside it.
	assert.Contains(t, md, "runs 18.0/70.0/18.0; 63.0/9.0/18.0<br>CPU % client 20 server 30 emu 40")
	assert.Contains(t, md, "| 0.36 |", "quictun's median minimum (13.5) over kcptun's (37.5)")
	assert.Contains(t, md, "| WAN 100mbit loss 10% | run 2 | quictun |")
	assert.FileExists(t, filepath.Join(dir, "loss-bulk-timeline-wan-100mbit-loss-10pct.png"))
	assert.Contains(t, md, "(loss-bulk-timeline-wan-100mbit-loss-10pct.png)")
}

func TestLossTimeline(t *testing.T) {
	res := lossResults(t)
	pts := lossTimeline(res.Samples, "WAN 100mbit loss 10%", "quictun")
	require.Len(t, pts, 9, "three runs of three bins, repetition 1 only")
	assert.InDelta(t, 0.25, pts[0].X, 1e-9)
	assert.InDelta(t, 1.75, pts[3].X, 1e-9, "run 2 follows run 1")
	assert.Equal(t, 70.0, pts[3].Y)
}

func TestRuntimeRowsInReport(t *testing.T) {
	res := lossResults(t)
	res.Runtime = runtimeInfo([]string{"HOME=/"}, []string{"GOMAXPROCS=1"}, "client side on CPU 0")
	dir := t.TempDir()
	require.NoError(t, WriteReport(dir, res))
	b, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	assert.Contains(t, string(b), "| daemons' Go runtime environment (every variant, inherited from the harness) | Go's defaults")
	assert.Contains(t, string(b), "| GOMAXPROCS=1 added |")
	assert.Contains(t, string(b), "| CPU pinning | client side on CPU 0 |")
}

// TestRunLoss runs the loss scenario end to end (smoke profile: one level,
// two 1 s runs) with direct TCP, quictun, a second build (--bin-b, here
// the same binaries) and a tuned variant of each build:
// every variant restarted and measured, the minimum recorded, the tuned
// variant named after its environment and run with it, the plain one with
// the inherited environment, each side pinned, a timeline chart drawn.
// No timing is asserted.
func TestRunLoss(t *testing.T) {
	t.Setenv("GOMAXPROCS", "")
	require.NoError(t, os.Unsetenv("GOMAXPROCS"))
	res, dir, p := runTunnelSmoke(t, "hl", func(o *Options) {
		o.RuntimeEnv = []string{"GOMAXPROCS=1"}
		o.BinDirB = o.BinDir
	}, ScLoss)
	tuned := "quictun-env(GOMAXPROCS=1)"
	require.Equal(t, []string{"direct", "quictun", "quictun-b", tuned, "quictun-b-env(GOMAXPROCS=1)"}, res.Variants, "notes %v", res.Notes)
	n := map[string]int{}
	for _, s := range res.Samples {
		require.Equal(t, ScLoss, s.Scenario)
		n[s.Variant]++
		assert.Empty(t, s.Error, "%s %s", s.Case, s.Variant)
		assert.Contains(t, s.Metrics, "mbit_per_s", "%s %s", s.Case, s.Variant)
		if s.Case != lossMinCase {
			assert.Contains(t, s.Metrics, "emu_cpu_pct")
			if s.Variant != "direct" {
				assert.Contains(t, s.Metrics, "cpu_client_pct")
				assert.Contains(t, s.Metrics, "reconnects")
			}
		}
	}
	for _, v := range res.Variants {
		assert.Equal(t, p.LossRuns+1, n[v], v)
	}
	require.NotNil(t, res.Runtime)
	assert.Equal(t, "GOMAXPROCS=1", res.Runtime.Tuned)
	logs := map[string]string{"quictun-client-sink.log": "gomaxprocsFromEnv=false",
		tuned + "-quictun-client-sink.log": "gomaxprocs=1 gomaxprocsFromEnv=true"}
	if _, err := exec.LookPath("taskset"); err == nil && runtime.NumCPU() >= 2 {
		logs["quictun-server.log"] = "taskset -c " + cpuRange(runtime.NumCPU()/2, runtime.NumCPU())
		logs["latency-client-serve.log"] = "taskset -c " + cpuRange(runtime.NumCPU()/2, runtime.NumCPU())
	}
	for name, want := range logs {
		b, err := os.ReadFile(filepath.Join(dir, "raw", name))
		require.NoError(t, err)
		assert.Contains(t, string(b), want, name)
		assert.NotContains(t, string(b), SysmonPolling, name)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "| CPU pinning |")
	assert.FileExists(t, filepath.Join(dir, "loss-bulk-timeline-"+chartSlug(p.LossLinks[0].Name)+".png"))
}

// TestLossLinksFromLevels: --loss-levels gives the loss scenario its links,
// each a fraction; anything else is refused.
func TestLossLinksFromLevels(t *testing.T) {
	links, err := LossLinks(0, 0.01)
	require.NoError(t, err)
	require.Len(t, links, 2)
	assert.Equal(t, "0.01", links[1].Params["loss"])
	for _, bad := range []float64{-0.1, 1, 30} {
		_, err := LossLinks(bad)
		assert.Error(t, err, "%v", bad)
	}
}
