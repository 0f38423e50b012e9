package harness

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseUDPDrops(t *testing.T) {
	t.Parallel()
	const procNetUDP = `   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops            
  530: 0200120C:1D4C 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1404457 2 0000000005076c0d 174     
  531: 0100007F:1D4C 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1404458 2 0000000005076c0e 6     
  983: 0100007F:CE0B 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1404452 2 00000000c2b87895 0       
`
	got, err := parseUDPDrops(strings.NewReader(procNetUDP), 7500) // 0x1D4C
	require.NoError(t, err)
	assert.InDelta(t, 180, got, 1e-9)
	got, err = parseUDPDrops(strings.NewReader(procNetUDP), 0xCE0B)
	require.NoError(t, err)
	assert.Zero(t, got)
	_, err = parseUDPDrops(strings.NewReader(procNetUDP), 29900)
	require.ErrorContains(t, err, "no UDP socket on port 29900")
}

func TestFloodCasesRotate(t *testing.T) {
	t.Parallel()
	kinds := floodKinds()
	first := map[string]bool{}
	for rep := range 5 {
		cs := floodCases(kinds, true, rep)
		assert.ElementsMatch(t, append([]string{FloodNone, FloodControl}, kinds...), cs, "every case once per repetition")
		first[cs[0]] = true
	}
	assert.Len(t, first, 5, "each case goes first in turn")
	assert.Equal(t, []string{FloodNone, "random", "quic-initial", "short-header"}, floodCases(kinds, false, 0))
}

func TestMergeRaw(t *testing.T) {
	t.Parallel()
	var m map[string]map[string]any
	require.NoError(t, json.Unmarshal(mergeRaw(json.RawMessage(`{"p50_ms":1}`), json.RawMessage(`{"pps":2}`)), &m))
	assert.InDelta(t, 1.0, m["probe"]["p50_ms"], 1e-9)
	assert.InDelta(t, 2.0, m["flood"]["pps"], 1e-9)
	var only map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(mergeRaw(nil, json.RawMessage(`{"pps":2}`)), &only))
	assert.NotContains(t, only, "probe")
}

// TestFloodReport renders flood samples: both tables, the ratio and the
// k/n counts of the health checks.
func TestFloodReport(t *testing.T) {
	t.Parallel()
	res := sampleResults()
	link := "LAN loss 0%"
	mk := func(cs string, rep int, m map[string]float64, e string) Sample {
		return Sample{Scenario: ScFlood, Link: link, Case: cs, Variant: "quictun", Rep: rep, Metrics: m, Error: e}
	}
	res.Samples = append(res.Samples,
		mk(FloodNone, 0, map[string]float64{"p50_ms": 2, "p99_ms": 4, "total_ms": 2000, "server_alive": 1, "healthz_ok": 1, "tunnel_survived": 1}, ""),
		mk("random", 0, map[string]float64{"p50_ms": 3, "p99_ms": 8, "total_ms": 3000, "p50_ratio": 1.5, "p99_ratio": 2, "total_ratio": 1.5,
			"flood_pps": 123456, "flood_mbit_per_s": 1185, "reply_pps": 10, "server_cpu_pct": 95, "flood_cpu_pct": 99, "socket_drops": 4000,
			"server_alive": 1, "healthz_ok": 1, "tunnel_survived": 1}, ""),
		mk("random", 1, map[string]float64{"p50_ms": 5, "p50_ratio": 2.5, "server_alive": 1, "healthz_ok": 0, "tunnel_survived": 1},
			"server /healthz failed during the flood"),
	)
	dir := t.TempDir()
	require.NoError(t, WriteReport(dir, res))
	b, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	md := string(b)
	assert.Contains(t, md, "## 7. Garbage UDP flood against the tunnel server")
	assert.Contains(t, md, "quictun, latency:")
	assert.Contains(t, md, "quictun, server:")
	assert.Contains(t, md, "| LAN loss 0% | random | 123456 (1185) | 4.00 (3.00–5.00) ⚠1 | 8.00 | 3000 | 2.00 (1.50–2.50) ⚠1 | 2.00 | 1.50 |")
	assert.Contains(t, md, "| LAN loss 0% | no flood | – | 2.00 | 4.00 | 2000 | – | – | – |")
	assert.Contains(t, md, "| LAN loss 0% | random | 10.00 | 95.00 | 99.00 | 4000 | – | 2/2 | 1/2 | 2/2 |")
	assert.NotContains(t, md, "direct, latency:", "a variant without flood samples gets no table")
	assert.Contains(t, md, "flood-lan-p50-ms.png")
	_, err = os.Stat(filepath.Join(dir, "flood-lan-p50-ms.png"))
	require.NoError(t, err)
}

// TestRunFlood runs the flood scenario end to end (smoke profile) against
// a freshly built quictun and checks the samples and the teardown.
func TestRunFlood(t *testing.T) {
	res, dir, _ := runTunnelSmoke(t, "hf", nil, ScFlood)
	cases := map[string]Sample{}
	var names []string
	for _, smp := range res.Samples {
		require.Equal(t, ScFlood, smp.Scenario)
		assert.Equal(t, "quictun", smp.Variant, "direct has no UDP server to flood")
		assert.Empty(t, smp.Error, smp.Case)
		cases[smp.Case] = smp
		names = append(names, smp.Case)
	}
	require.Len(t, cases, 5, "cases: %v", names)
	for cs, smp := range cases {
		m := smp.Metrics
		assert.InDelta(t, 50, m["tps"]*m["total_ms"]/1000, 1, "%s: 50 round trips", cs)
		assert.Equal(t, 1.0, m["server_alive"], cs)
		assert.Equal(t, 1.0, m["healthz_ok"], cs)
		assert.Equal(t, 1.0, m["tunnel_survived"], cs)
		assert.Contains(t, m, "socket_drops", cs)
		if cs == FloodNone {
			assert.NotContains(t, m, "flood_pps")
			continue
		}
		assert.Greater(t, m["flood_pps"], 1000.0, cs)
		assert.Positive(t, m["p50_ratio"], cs)
	}
	assert.Positive(t, cases["short-header"].Metrics["reply_pps"], "stateless resets")
	assert.Zero(t, cases[FloodControl].Metrics["reply_pps"], "the discard socket answers nothing")
	assert.Positive(t, cases["quic-initial"].Metrics["reply_pps"], "Retry or refusals")
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "quictun, latency:")
	assert.Contains(t, string(md), "flood: direct has no UDP server to flood, skipped")
}
