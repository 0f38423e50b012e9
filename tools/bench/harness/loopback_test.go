package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRedisCSV(t *testing.T) {
	out := `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"SET","50000.00","0.064","0.016","0.055","0.183","0.239","0.255"
"GET","48780.49","0.070","0.008","0.055","0.183","0.199","0.223"
`
	m, err := parseRedisCSV([]byte(out))
	require.NoError(t, err)
	assert.InDelta(t, 50000.0, m["set_rps"], 0.01)
	assert.InDelta(t, 48780.49, m["get_rps"], 0.01)
	_, err = parseRedisCSV([]byte("Could not connect to Redis at 127.0.0.1:1: Connection refused\n"))
	require.Error(t, err)
}

// TestLoopbackSmoke runs every loopback case, scaled down, with binaries
// built from this tree: no sample fails, each has its figures and the
// tunnel's CPU time, the report names each tunnel's ratio to direct, and no
// process is left running.
func TestLoopbackSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the loopback benchmark run under -short")
	}
	bin := buildBins(t, "tools/latency-client", "cmd/quictun-server", "cmd/quictun-client")
	out := t.TempDir()
	t.Setenv("GOMAXPROCS", "")
	require.NoError(t, os.Unsetenv("GOMAXPROCS"))
	dir, err := RunLoopback(t.Context(), LoopbackOptions{BinDir: bin, ResultsDir: out, Reps: 1, Smoke: true,
		EnvB: []string{"GOMAXPROCS=2"}, RuntimeEnv: []string{"GOMAXPROCS=1"}})
	require.NoError(t, err)
	res, err := LoadResults(dir)
	require.NoError(t, err)
	assert.Equal(t, []string{"direct", "quictun", "quictun-b", "quictun-env(GOMAXPROCS=1)", "quictun-b-env(GOMAXPROCS=1)"}, res.Variants)
	// The plain daemons ran with the inherited environment (Go's defaults:
	// nothing added), quictun-b with its own GOMAXPROCS, the tuned ones
	// with the --runtime-env setting; pinned with taskset where the host
	// has two CPUs or more.
	for name, want := range map[string]string{"quictun-client.log": "gomaxprocsFromEnv=false", "quictun-b-client.log": "gomaxprocs=2 gomaxprocsFromEnv=true",
		"quictun-env(GOMAXPROCS=1)-client.log": "gomaxprocs=1 gomaxprocsFromEnv=true"} {
		b, err := os.ReadFile(filepath.Join(dir, "raw", name))
		require.NoError(t, err)
		assert.Contains(t, string(b), want, name)
		assert.NotContains(t, string(b), SysmonPolling, name)
	}
	require.NotNil(t, res.Runtime)
	assert.Equal(t, "GOMAXPROCS=1", res.Runtime.Tuned)
	if _, err := exec.LookPath("taskset"); err == nil && runtime.NumCPU() >= 2 {
		b, err := os.ReadFile(filepath.Join(dir, "raw", "quictun-server.log"))
		require.NoError(t, err)
		assert.Contains(t, string(b), "taskset -c "+cpuRange(runtime.NumCPU()/2, runtime.NumCPU()), "the server side is pinned")
	}
	cases := map[string]bool{}
	for _, s := range res.Samples {
		cases[s.Case] = true
		assert.Empty(t, s.Error, "%s %s", s.Case, s.Variant)
		for _, m := range loopbackFigures[s.Case] {
			if m == "tunnel_cpu_s_per_gb" && s.Variant == "direct" {
				continue
			}
			assert.Contains(t, s.Metrics, m, "%s %s", s.Case, s.Variant)
		}
		if s.Variant != "direct" {
			assert.Contains(t, s.Metrics, "tunnel_cpu_s", "%s %s", s.Case, s.Variant)
		}
	}
	for _, c := range LoopbackCases() {
		if c == LbRedis && !cases[c] {
			continue // redis-server not installed
		}
		assert.True(t, cases[c], "case %s ran", c)
	}
	report, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	var row []string
	for _, l := range strings.Split(string(report), "\n") {
		if strings.HasPrefix(l, "| pingpong | total_ms |") {
			row = strings.Split(strings.Trim(l, "| "), " | ")
		}
	}
	require.Len(t, row, 11, "case, metric, direct, then each of the four tunnels and its ratio: %q", row)
	for _, ratio := range []string{row[4], row[6], row[8], row[10]} {
		_, err := strconv.ParseFloat(ratio, 64)
		assert.NoError(t, err, "ratio %q", ratio)
	}

	// Every process the run started has exited.
	logs, err := filepath.Glob(filepath.Join(dir, "raw", "*-server.log"))
	require.NoError(t, err)
	require.NotEmpty(t, logs)
	require.Eventually(t, func() bool { return !anyRunning(bin) }, 10*time.Second, 50*time.Millisecond)
}

// anyRunning reports whether a process runs an executable from dir.
func anyRunning(dir string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/exe")
	for _, p := range procs {
		if exe, err := os.Readlink(p); err == nil && strings.HasPrefix(exe, dir+"/") {
			return true
		}
	}
	return false
}
