package harness

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/tools/linkem/netns"
)

func TestUsageMetrics(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 23, 5, 0, 0, 0, time.UTC)
	a := usageSnap{At: t0, Process: 10, Client: 1, Server: 2,
		Drops: map[string]uint64{"queue": 5, "overflow": 1, "loss": 100, "blackout": 7}, TxPackets: 1000, WriteErrors: 1,
		Late: 10, LatenessNS: 1e9, TUNDrops: 3}
	b := usageSnap{At: t0.Add(10 * time.Second), Process: 16, Client: 3, Server: 7,
		Drops: map[string]uint64{"queue": 25, "overflow": 1, "loss": 180, "ge": 20, "blackout": 9}, TxPackets: 81000, WriteErrors: 1,
		Late: 810, LatenessNS: 1e9 + 80002*250e3, TUNDrops: 5}
	m := usageMetrics(a, b, 1, true)
	assert.InDelta(t, 60, m["harness_cpu_pct"], 1e-9)
	assert.InDelta(t, 10, m["reader_cpu_pct"], 1e-9)
	assert.InDelta(t, 50, m["emu_cpu_pct"], 1e-9, "harness less its readers")
	assert.InDelta(t, 20, m["cpu_client_pct"], 1e-9)
	assert.InDelta(t, 50, m["cpu_server_pct"], 1e-9)
	assert.InDelta(t, 20, m["emu_queue_drops"], 1e-9)
	assert.InDelta(t, 100, m["emu_loss_drops"], 1e-9, "loss and Gilbert-Elliott")
	assert.Zero(t, m["emu_write_errors"])
	assert.InDelta(t, 8000, m["emu_pps"], 1e-9)
	assert.InDelta(t, 1, m["emu_late_pct"], 1e-3, "800 of 80002 popped (80000 sent, 2 blackout drops)")
	assert.InDelta(t, 250, m["emu_mean_late_us"], 1e-9)
	assert.InDelta(t, 2, m["emu_tun_drops"], 1e-9)

	direct := usageMetrics(a, b, 7, false)
	assert.NotContains(t, direct, "cpu_client_pct", "direct TCP has no tunnel process")
	assert.Zero(t, usageMetrics(a, b, 9, false)["emu_cpu_pct"], "never negative")
	assert.Empty(t, usageMetrics(b, a, 0, true), "no interval")
}

func TestParseTxDropped(t *testing.T) {
	t.Parallel()
	out := `[{"ifindex":2,"ifname":"lem0","flags":["POINTOPOINT","NOARP","UP","LOWER_UP"],"mtu":1500,"qdisc":"fq_codel","operstate":"UNKNOWN","txqlen":5000,"link_type":"none","stats64":{"rx":{"bytes":9,"packets":1,"errors":0,"dropped":4,"over_errors":0,"multicast":0},"tx":{"bytes":17921671,"packets":4620,"errors":0,"dropped":37,"carrier_errors":0,"collisions":0}}}]`
	n, err := parseTxDropped([]byte(out))
	require.NoError(t, err)
	assert.Equal(t, uint64(37), n)
	_, err = parseTxDropped([]byte(`[{"ifname":"lem0"}]`))
	require.Error(t, err)
	_, err = parseTxDropped([]byte(`Device "lem0" does not exist.`))
	require.Error(t, err)
}

func TestFairnessMetrics(t *testing.T) {
	t.Parallel()
	m := fairnessMetrics(70, 25, 100)
	assert.InDelta(t, 70, m["share_pct"], 1e-9)
	assert.InDelta(t, 25, m["against_share_pct"], 1e-9)
	assert.InDelta(t, 95, m["total_mbit_per_s"], 1e-9)
	assert.InDelta(t, 95.0*95/(2*(70*70+25*25)), m["jain"], 1e-9)
	assert.InDelta(t, 1, jain(40, 40), 1e-9)
	assert.InDelta(t, 0.5, jain(90, 0), 1e-9)
	assert.Zero(t, jain(0, 0))

	unlimited := fairnessMetrics(300, 100, 0)
	assert.InDelta(t, 75, unlimited["share_pct"], 1e-9, "share of the sum without a rate")
	assert.NotContains(t, fairnessMetrics(0, 0, 0), "share_pct")

	assert.InDelta(t, 100, linkRateMbit(LinkOf("WAN", WANDelay, 0, "100mbit")), 1e-9)
	assert.Zero(t, linkRateMbit(LinkOf("WAN", WANDelay, 0, "0")))
	assert.Zero(t, linkRateMbit(LinkOf("WAN", WANDelay, 0, "")))
}

func TestSteadyWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 23, 5, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	a := []flowPoint{{at(0), 0}, {at(5), 50}, {at(30), 300}}
	b := []flowPoint{{at(1), 0}, {at(29), 100}}
	from, to, ok := steadyWindow(a, b, 10*time.Second)
	require.True(t, ok)
	assert.Equal(t, at(11), from, "warm-up counted from the later start")
	assert.Equal(t, at(29), to, "ends at the earlier end")
	_, _, ok = steadyWindow(a, b, 30*time.Second)
	assert.False(t, ok, "warm-up longer than the common time")
	_, _, ok = steadyWindow(a, nil, 0)
	assert.False(t, ok)
}

func TestFlowTimeline(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 23, 5, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	p := &progress{}
	assert.Zero(t, p.last())
	// 1 MB/s for 2 s, a gap (blackout 2-5 s), then 2 MB/s.
	for ms := 0; ms <= 2000; ms += 100 {
		p.add(at(ms), int64(ms)*1000)
	}
	for ms := 5300; ms <= 7000; ms += 100 {
		p.add(at(ms), 2_000_000+int64(ms-5200)*2000)
	}
	pts := p.points()
	assert.Equal(t, int64(2_000_000+1800*2000), p.last())
	assert.Equal(t, int64(1_000_000), bytesAt(pts, at(1050)))
	assert.Zero(t, bytesAt(pts, at(-1)))
	assert.InDelta(t, 8, rateBetween(pts, at(1000), at(2000)), 1e-9, "1 MB/s = 8 Mbit/s")
	assert.Zero(t, rateBetween(pts, at(2000), at(2000)))

	end := at(5000)
	d, ok := flowAfter(pts, end, 1)
	require.True(t, ok)
	assert.Equal(t, 300*time.Millisecond, d, "first byte after the end")
	d, ok = flowAfter(pts, end, 1_000_000)
	require.True(t, ok)
	assert.Equal(t, 700*time.Millisecond, d, "1 MB arrived after the end")
	_, ok = flowAfter(pts, end, 100_000_000)
	assert.False(t, ok)

	m := blackoutBulkMetrics(pts, bbTimes{warmStart: t0, cut: at(2000), end: end}, at(5250))
	assert.InDelta(t, 1, m["echo_ok"], 1e-9)
	assert.InDelta(t, 0.25, m["echo_after_s"], 1e-9)
	assert.InDelta(t, 8, m["bulk_before_mbit_per_s"], 1e-9)
	assert.InDelta(t, 0.3, m["bulk_first_byte_after_s"], 1e-9)
	assert.InDelta(t, 1.0*flowingBytes/2000/1000, m["bulk_flowing_after_s"]-0.2, 0.1)
	assert.InDelta(t, 16, m["bulk_after_mbit_per_s"], 0.5, "2 MB/s")
	failed := blackoutBulkMetrics(pts[:21], bbTimes{warmStart: t0, cut: at(2000), end: end}, time.Time{})
	assert.Zero(t, failed["echo_ok"])
	assert.NotContains(t, failed, "echo_after_s")
	assert.NotContains(t, failed, "bulk_flowing_after_s")
}

func TestVariantNamesAndSelection(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "direct", (&direct{}).Name())
	assert.Equal(t, "direct-cubic", (&direct{CC: "cubic"}).Name())
	assert.Equal(t, "quictun", (&quictun{}).Name())
	q := &quictun{Congestion: "bbr", Instance: 2}
	assert.Equal(t, "quictun-bbr", q.Name())
	assert.Equal(t, []string{"--congestion", "bbr"}, q.ccArgs())
	assert.Nil(t, (&quictun{}).ccArgs(), "no flag when empty")
	assert.Equal(t, "127.0.0.1:6521", q.Sink())
	assert.Equal(t, "127.0.0.1:6520", q.Echo())
	assert.Equal(t, 7502, q.udpPort())
	addr, from := q.MuxEcho()
	assert.Equal(t, q.Sink(), addr)
	assert.Equal(t, "127.0.0.2", from)
	assert.Equal(t, "quictun-bbr-quictun-server.log", q.file("quictun-server.log"))
	assert.Equal(t, "quictun-server.log", (&quictun{Congestion: "reno"}).file("quictun-server.log"), "instance 0 keeps the old names")

	assert.True(t, variantSelected("quictun-bbr", nil))
	assert.True(t, variantSelected("quictun-bbr", []string{"quictun"}))
	assert.True(t, variantSelected("quictun-bbr", []string{"direct", "quictun-bbr"}))
	assert.False(t, variantSelected("quictun-cubic", []string{"quictun-bbr"}))
	assert.False(t, variantSelected("direct-cubic", []string{"quictun", "direct-bbr"}))
	assert.True(t, variantSelected("direct", []string{"direct"}))
	assert.Equal(t, []string{"direct", "direct-bbr"}, directVariants([]string{"direct", "kcptun", "direct-bbr", "quictun-bbr"}))

	assert.Equal(t, "# written by the bench harness\n127.0.0.2 tcp:127.0.0.1:15676\n* tcp:127.0.0.1:15677\n", muxTokenFile())
	assert.Equal(t, [][]string{
		{"-n", "qb-s", "addr", "add", "198.18.0.11/32", "dev", "lem0"},
		{"-n", "qb-c", "route", "add", "198.18.0.11/32", "dev", "lem0", "congctl", "cubic"},
		{"-n", "qb-s", "rule", "add", "from", "198.18.0.11", "lookup", "100"},
		{"-n", "qb-s", "route", "add", "198.18.0.1/32", "dev", "lem0", "congctl", "cubic", "table", "100"},
	}, ccRouteCommands("qb-c", "qb-s", "198.18.0.11", netns.ClientIP, "100", "cubic"))
}

func TestHelpHasFlag(t *testing.T) {
	t.Parallel()
	help := `Tunnel:
      --listen-on strings            local listeners
      --congestion string            congestion controller: bbr, cubic or reno (default "bbr")
      --fec string                   forward error correction K/M, e.g. 10/3; the --congestion-free part
`
	assert.True(t, helpHasFlag(help, "--congestion"))
	assert.True(t, helpHasFlag(help, "--fec"))
	assert.False(t, helpHasFlag(help, "--cong"))
	assert.False(t, helpHasFlag("      --congestion-window int   x\n", "--congestion"))
	assert.True(t, helpHasFlag("      --congestion=bbr\n", "--congestion"))
}

// TestCCReport renders the bulk, fairness and blackout-under-load tables.
func TestCCReport(t *testing.T) {
	t.Parallel()
	res := sampleResults()
	res.Variants = []string{"direct-cubic", "direct-bbr", "quictun-bbr"}
	link := "WAN 100mbit loss 1%"
	mk := func(sc, cs, v string, m map[string]float64) Sample {
		return Sample{Scenario: sc, Link: link, Case: cs, Variant: v, Metrics: m}
	}
	res.Samples = []Sample{
		mk(ScBulk, "1 stream(s)", "direct-cubic", map[string]float64{"mbit_per_s": 20, "emu_cpu_pct": 30, "emu_queue_drops": 0}),
		mk(ScBulk, "1 stream(s)", "direct-bbr", map[string]float64{"mbit_per_s": 90, "emu_cpu_pct": 55, "emu_queue_drops": 12}),
		mk(ScBulk, "1 stream(s)", "quictun-bbr", map[string]float64{"mbit_per_s": 88, "cpu_client_pct": 40, "cpu_server_pct": 60, "emu_cpu_pct": 50, "emu_queue_drops": 3}),
		mk(ScFair, "vs direct TCP cubic", "quictun-bbr", map[string]float64{"mbit_per_s": 60, "against_mbit_per_s": 35, "share_pct": 60, "against_share_pct": 35, "jain": 0.93}),
		mk(ScBlackoutBulk, "blackout 10s", "quictun-bbr", map[string]float64{"echo_after_s": 0.3, "bulk_flowing_after_s": 0.6, "tunnel_survived": 1, "bulk_survived": 1}),
	}
	dir := t.TempDir()
	require.NoError(t, WriteReport(dir, res))
	b, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	md := string(b)
	assert.Contains(t, md, "| link | case | variant | Mbit/s | ×direct-cubic | ×direct-bbr | client CPU % | server CPU % | emulator CPU % | emulator queue drops |\n")
	assert.Contains(t, md, "| WAN 100mbit loss 1% | 1 stream(s) | quictun-bbr | 88.00 | 4.40 | 0.98 | 40.00 | 60.00 | 50.00 | 3.00 |\n")
	assert.Contains(t, md, "| WAN 100mbit loss 1% | 1 stream(s) | direct-cubic | 20.00 | 1.00 | 0.22 | – | – | 30.00 | 0 |\n")
	assert.Contains(t, md, "## 2b. Fairness against direct TCP Cubic")
	assert.Contains(t, md, "| WAN 100mbit loss 1% | vs direct TCP cubic | quictun-bbr | 60.00 | 35.00 | 60.00 | 35.00 | 0.93 |\n")
	assert.Contains(t, md, "## 5b. Blackout under load")
	assert.Contains(t, md, "| WAN 100mbit loss 1% | blackout 10s | quictun-bbr | 0.3 | 0.6 | 1.00 | 1.00 |\n")
	for _, png := range []string{"bulk-wan-mbit-per-s.png", "fairness-wan-share-pct.png", "blackout-bulk-wan-echo-after-s.png"} {
		assert.Contains(t, md, png)
		_, err := os.Stat(filepath.Join(dir, png))
		require.NoError(t, err, png)
	}
}

// TestRunCC runs the bulk, fairness and blackout-under-load scenarios end
// to end (smoke profile) with direct TCP per congestion control and
// quictun, and checks the samples, the CPU and drop columns and the
// teardown.
func TestRunCC(t *testing.T) {
	res, dir, p := runTunnelSmoke(t, "hb", func(o *Options) { o.DirectCC = []string{"cubic", "bbr"} }, ScBulk, ScFair, ScBlackoutBulk)
	require.Len(t, res.Variants, 3, "variants %v, notes %v", res.Variants, res.Notes)
	assert.Equal(t, []string{"direct-cubic", "direct-bbr"}, res.Variants[:2])
	n := map[string]int{}
	for _, smp := range res.Samples {
		n[smp.Scenario]++
		assert.Empty(t, smp.Error, "%s/%s/%s", smp.Scenario, smp.Case, smp.Variant)
		m := smp.Metrics
		assert.Contains(t, m, "emu_cpu_pct", smp.Scenario)
		assert.Contains(t, m, "emu_queue_drops", smp.Scenario)
		if smp.Variant == res.Variants[2] {
			assert.Contains(t, m, "cpu_client_pct", smp.Scenario)
			assert.Contains(t, m, "cpu_server_pct", smp.Scenario)
		}
		switch smp.Scenario {
		case ScBulk:
			assert.Positive(t, m["mbit_per_s"])
		case ScFair:
			assert.Positive(t, m["share_pct"], smp.Variant)
			assert.Positive(t, m["against_share_pct"], smp.Variant)
		case ScBlackoutBulk:
			assert.Equal(t, 1.0, m["echo_ok"], smp.Variant)
			assert.Equal(t, 1.0, m["bulk_survived"], smp.Variant)
			assert.Equal(t, 1.0, m["bulk_verified"], smp.Variant)
			assert.Contains(t, m, "bulk_flowing_after_s", smp.Variant)
			if smp.Variant == res.Variants[2] {
				assert.Equal(t, 1.0, m["tunnel_survived"])
			}
		}
	}
	assert.Equal(t, map[string]int{ScBulk: 3 * len(p.BulkParallel), ScFair: 3, ScBlackoutBulk: 3}, n)
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "×direct-cubic")
}
