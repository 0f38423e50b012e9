package loadgen

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestScaleReport builds the report from result files: rows ordered by
// clients, the charts, the idle rows with datagrams per keep-alive period.
func TestScaleReport(t *testing.T) {
	tmp := t.TempDir()
	var dirs []string
	for _, n := range []int{5000, 1000} {
		r := &Results{Clients: n, Started: time.Date(2026, 11, 26, 20, 0, 0, 0, time.UTC), Command: "bench loadgen -n",
			Baseline: Snapshot{CPUCores: 0.003},
			Idle: &Idle{Snapshot: Snapshot{RSSBytes: int64(n) * 90 << 10}, ServerCores: 0.001 * float64(n) / 100,
				RSSPerClientBytes: 90 << 10, LiveHeapPerClientBytes: 39 << 10, StackPerClientBytes: 16 << 10, GoroutinesPerClient: 4},
			Connect:  &Connect{Handshakes: Handshakes{Full: n, PerServerCPUSecond: 600}},
			Restarts: []Restart{{Signal: SignalKill, AllBackSeconds: 21.5}}}
		d := filepath.Join(tmp, "loadgen-"+strings.Repeat("x", n/1000))
		require.NoError(t, os.MkdirAll(d, 0o755))
		require.NoError(t, r.save(d))
		dirs = append(dirs, d)
	}
	idle := filepath.Join(tmp, "idle.json")
	require.NoError(t, os.WriteFile(idle, []byte(`{"started": "2026-11-26T20:00:00Z", "mode": "ssh", "seconds": 100, "keepalive_seconds": 25,
  "client_context_switches_per_second": 2.8, "server_context_switches_per_second": 1.2,
  "client_wakeups_per_second": 0.15, "server_wakeups_per_second": 0.08, "client_cpu_percent": 0, "server_cpu_percent": 0.0167,
  "udp_datagrams_sent": 8, "udp_datagrams_received": 8, "revision": "quictun-server abc", "loadavg_before": "1", "loadavg_after": "2"}`), 0o644))
	out := filepath.Join(tmp, "report")
	require.NoError(t, WriteScaleReport(out, ScaleInputs{Loadgen: dirs, Idle: []string{idle}}))
	b, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	md := string(b)
	assert.Contains(t, md, "## Server scale")
	assert.Contains(t, md, "## Idle")
	i1, i5 := strings.Index(md, "| 1000 | 11-26 20:00 | "), strings.Index(md, "| 5000 | 11-26 20:00 | ")
	require.Positive(t, i1)
	assert.Less(t, i1, i5, "rows ordered by clients")
	assert.Contains(t, md, "| 90.0 KiB | 39.0 KiB | 16.0 KiB | 4.00 |")
	assert.Contains(t, md, "21.5 s")
	assert.Contains(t, md, "| ssh | 100 | 0.15 | 0.08 | 2.80 / 1.20 |")
	assert.Contains(t, md, "2.00 (period 25s)", "8 datagrams over 4 keep-alive periods")
	for _, c := range []string{"server-scale-memory.png", "server-scale-cpu.png", "server-scale-rss.png"} {
		assert.FileExists(t, filepath.Join(out, c))
		assert.Contains(t, md, "("+c+")")
	}
	require.Error(t, WriteScaleReport(out, ScaleInputs{Idle: []string{filepath.Join(dirs[0], "results.json")}}), "a loadgen file is no idle result")
}
