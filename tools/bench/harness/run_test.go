package harness

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/tools/linkem/netns"
)

// TestRunSmoke runs the smoke profile end to end with direct TCP (and
// kcptun when installed) and checks the outputs and the teardown.
func TestRunSmoke(t *testing.T) {
	needTestbed(t)
	needIP(t)
	bin := buildBins(t, "tools/latency-client")

	p, err := Profiles("smoke")
	require.NoError(t, err)
	variants := []string{"direct"}
	if KcptunAvailable() {
		variants = append(variants, "kcptun")
	}
	prefix := "hs" + strconv.Itoa(os.Getpid()%100000)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	dir, err := Run(ctx, Options{Profile: p, BinDir: bin, ResultsDir: out, Prefix: prefix, Variants: variants,
		Scenarios: []string{ScLatency, ScBulk, ScConnrate, ScBlackout}, SkipChecks: true, Spin: time.Millisecond})
	require.NoError(t, err)

	c, s := netns.Names(prefix)
	assert.False(t, netns.Exists(c), "namespace %s left behind", c)
	assert.False(t, netns.Exists(s), "namespace %s left behind", s)

	res, err := LoadResults(dir)
	require.NoError(t, err)
	assert.Equal(t, variants, res.Variants)
	seen := map[string]int{}
	for _, smp := range res.Samples {
		seen[smp.Scenario+"/"+smp.Variant]++
		assert.Empty(t, smp.Error, "%s/%s/%s", smp.Scenario, smp.Link, smp.Variant)
	}
	for _, v := range variants {
		assert.Equal(t, 2, seen[ScLatency+"/"+v])
		assert.Equal(t, 2, seen[ScBulk+"/"+v])
		assert.Equal(t, 1, seen[ScBlackout+"/"+v])
	}
	_, err = os.Stat(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
}

// TestRunCancelled stops a run midway (as Ctrl-C does) and checks that it
// returns, keeps what it measured, and tears everything down.
func TestRunCancelled(t *testing.T) {
	needTestbed(t)
	bin := buildBins(t, "tools/latency-client")
	p, err := Profiles("smoke")
	require.NoError(t, err)
	p.Blackouts = []time.Duration{time.Minute} // still running when cancelled
	prefix := "hc" + strconv.Itoa(os.Getpid()%100000)
	ctx, cancel := context.WithCancel(t.Context())
	timer := time.AfterFunc(12*time.Second, cancel)
	defer timer.Stop()
	start := time.Now()
	dir, err := Run(ctx, Options{Profile: p, BinDir: bin, ResultsDir: t.TempDir(), Prefix: prefix, Variants: []string{"direct"},
		Scenarios: []string{ScLatency, ScBlackout}, SkipChecks: true, Spin: time.Millisecond})
	require.Error(t, err)
	assert.Less(t, time.Since(start), 45*time.Second, "cancellation was not prompt")
	c, s := netns.Names(prefix)
	assert.False(t, netns.Exists(c), "namespace %s left behind", c)
	assert.False(t, netns.Exists(s), "namespace %s left behind", s)
	res, lerr := LoadResults(dir)
	require.NoError(t, lerr)
	assert.NotEmpty(t, res.Samples, "the latency samples measured before the cancel are kept")
	assert.NotEmpty(t, res.Notes)
}

// TestRunTeardownOnEarlyError fails right after the namespaces exist (an
// unknown congestion control) and checks that they are removed.
func TestRunTeardownOnEarlyError(t *testing.T) {
	needTestbed(t)
	bin := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bin, "latency-client"), []byte("#!/bin/sh\nexit 1\n"), 0o755))
	p, err := Profiles("smoke")
	require.NoError(t, err)
	prefix := "he" + strconv.Itoa(os.Getpid()%100000)
	_, err = Run(t.Context(), Options{Profile: p, BinDir: bin, ResultsDir: t.TempDir(), Prefix: prefix,
		SkipChecks: true, TCPCC: "no-such-cc"})
	require.ErrorContains(t, err, "tcp_congestion_control")
	c, s := netns.Names(prefix)
	assert.False(t, netns.Exists(c), "namespace %s left behind", c)
	assert.False(t, netns.Exists(s), "namespace %s left behind", s)
}

// TestRunSecondBuild runs a second build of the daemons (--bin-b, here the
// same binaries) as variant quictun-b beside quictun, interleaved in the
// same run, each with its own ports and samples.
func TestRunSecondBuild(t *testing.T) {
	res, _, p := runTunnelSmoke(t, "h2", func(o *Options) { o.BinDirB = o.BinDir }, ScLatency)
	assert.Equal(t, []string{"direct", "quictun", "quictun-b"}, res.Variants)
	seen := map[string]int{}
	for _, smp := range res.Samples {
		seen[smp.Variant]++
		assert.Empty(t, smp.Error, "%s/%s", smp.Link, smp.Variant)
	}
	for _, v := range res.Variants {
		assert.Equal(t, len(p.LatencyLinks), seen[v], "latency samples of %s", v)
	}
}

// TestRunEchoCPU: the echo scenarios (3a, 3b) record the tunnel's and the
// emulator's CPU beside their throughput, and the report shows it. Each
// tunnel sample's CPU is above zero: procstat reads the processes' CPU clocks
// in nanoseconds (with /proc/PID/stat's 10 ms ticks a daemon using a few ms
// in a short smoke sample showed 0).
func TestRunEchoCPU(t *testing.T) {
	res, dir, p := runTunnelSmoke(t, "hc", nil, ScEcho, ScReqSize)
	n := map[string]int{}
	for _, smp := range res.Samples {
		name := smp.Scenario + "/" + smp.Case + "/" + smp.Variant
		require.Empty(t, smp.Error, name)
		n[smp.Scenario]++
		assert.Contains(t, smp.Metrics, "emu_cpu_pct", name)
		if smp.Variant == "quictun" {
			assert.Positive(t, smp.Metrics["cpu_client_pct"], "quictun-client's CPU in %s", name)
			assert.Positive(t, smp.Metrics["cpu_server_pct"], "quictun-server's CPU in %s", name)
		} else {
			assert.NotContains(t, smp.Metrics, "cpu_client_pct", "direct TCP has no tunnel processes")
		}
	}
	assert.Equal(t, 2*len(p.EchoSizes)*p.Reps, n[ScEcho])
	assert.Equal(t, 2*len(p.ReqSizes)*p.Reps, n[ScReqSize])
	report, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	for _, section := range []string{"## 3a.", "## 3b."} {
		_, rest, ok := strings.Cut(string(report), section)
		require.True(t, ok, section)
		rest, _, _ = strings.Cut(rest, "\n## ")
		for _, row := range []string{"| client CPU % |", "| server CPU % |", "| emulator CPU % |"} {
			assert.Contains(t, rest, row, section)
		}
	}
}

// TestRunReverse runs the opt-in reverse-tunnel variant (quictun-reverse:
// echo server next to the client, probe on the server host) beside direct
// TCP in the latency scenario, and checks that it has no part in the
// others (bulk here) and that the report shows its column and the first
// echo in RTTs.
func TestRunReverse(t *testing.T) {
	res, dir, p := runTunnelSmoke(t, "hr", func(o *Options) { o.Variants = []string{"direct", "quictun-reverse"} }, ScLatency, ScBulk)
	assert.Equal(t, []string{"direct", "quictun-reverse"}, res.Variants)
	seen := map[string]int{}
	for _, smp := range res.Samples {
		seen[smp.Scenario+"/"+smp.Variant]++
		require.Empty(t, smp.Error, "%s/%s/%s", smp.Scenario, smp.Link, smp.Variant)
		if smp.Scenario == ScLatency {
			assert.Positive(t, smp.Metrics["first_echo_rtts"], "%s/%s", smp.Link, smp.Variant)
			t.Logf("%s %s: connect %.2f ms, first echo %.2f ms (%.2f RTTs), total %.1f ms (loaded machine, indicative)",
				smp.Link, smp.Variant, smp.Metrics["connect_ms"], smp.Metrics["first_echo_ms"], smp.Metrics["first_echo_rtts"], smp.Metrics["total_ms"])
		}
	}
	assert.Equal(t, len(p.LatencyLinks), seen[ScLatency+"/quictun-reverse"])
	assert.Equal(t, len(p.LatencyLinks), seen[ScLatency+"/direct"])
	assert.Zero(t, seen[ScBulk+"/quictun-reverse"], "the reverse variant is measured in the latency scenario only")
	assert.Positive(t, seen[ScBulk+"/direct"])
	report, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	assert.Contains(t, string(report), "quictun-reverse")
	assert.Contains(t, string(report), "connect to first echo RTTs")
}
