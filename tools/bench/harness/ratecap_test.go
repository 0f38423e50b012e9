package harness

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRateCapMetrics: the rate in each direction is the server's byte
// count between two readings, over the time between them, against the cap.
func TestRateCapMetrics(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 28, 20, 0, 0, 0, time.UTC)
	a := identityUsage{At: t0, BytesUpstream: 1_000_000, BytesDownstream: 5_000_000}
	b := identityUsage{At: t0.Add(8 * time.Second), BytesUpstream: 1_000_000 + 5_000_000, BytesDownstream: 5_000_000 + 19_600_000}
	for _, tc := range []struct {
		name, dir     string
		capMbit       float64
		mbit, capPct  float64
		wantNoCapPart bool
	}{
		{name: "download", dir: rateCapDown, capMbit: 20, mbit: 19.6, capPct: 98},
		{name: "upload", dir: rateCapUp, capMbit: 5, mbit: 5, capPct: 100},
		{name: "no cap", dir: rateCapUp, capMbit: 0, mbit: 5, wantNoCapPart: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := rateCapMetrics(tc.dir, a, b, tc.capMbit)
			assert.InDelta(t, tc.mbit, m["mbit_per_s"], 1e-9)
			assert.InDelta(t, 8.0, m["window_s"], 1e-9)
			if tc.wantNoCapPart {
				assert.NotContains(t, m, "cap_pct")
				return
			}
			assert.InDelta(t, tc.capPct, m["cap_pct"], 1e-9)
		})
	}
	assert.Nil(t, rateCapMetrics(rateCapDown, b, a, 20), "readings out of order give no figure")
}

// TestRateCapVariant: the client runs each controller (fixed with its
// rate) against a server that runs the profile's and caps the identity.
func TestRateCapVariant(t *testing.T) {
	t.Parallel()
	r := &Runner{prof: Profile{RateCap: rateCapSpec(10*time.Second, 2*time.Second)}, opts: Options{ServerArgs: []string{"--x"}}}
	q := r.rateCapVariant("fixed", 2, "")
	assert.Equal(t, "quictun-client-fixed", q.Name())
	assert.Equal(t, rateCapInstance+2, q.Instance)
	assert.Equal(t, "20Mbit/5Mbit", q.RateLimit)
	assert.Equal(t, []string{"--x", "--congestion", "bbr"}, q.ServerArgs)
	assert.Equal(t, []string{"--congestion", "fixed", "--rate", "100Mbit"}, q.ClientArgs)
	assert.Equal(t, []string{"--congestion", "cubic"}, r.rateCapVariant("cubic", 1, "").ClientArgs)
	b := r.rateCapVariant("bbr", 0, "/old/bin")
	assert.Equal(t, "quictun-b-client-bbr", b.Name())
	assert.Equal(t, "/old/bin", b.BinDir)
	assert.Equal(t, rateCapInstance+10, b.Instance, "ports of its own")
	assert.Empty(t, r.opts.ServerArgs[1:], "the run's own flags are not changed")
	assert.Equal(t, "download, cap 20 Mbit/s, 4 streams", rateCapCase(r.prof.RateCap, rateCapDown))
	assert.Equal(t, "upload, cap 5 Mbit/s, 4 streams", rateCapCase(r.prof.RateCap, rateCapUp))
}

func TestQuictunWanted(t *testing.T) {
	t.Parallel()
	assert.True(t, quictunWanted(nil))
	assert.True(t, quictunWanted([]string{"direct", "quictun"}))
	assert.True(t, quictunWanted([]string{"quictun-bbr"}))
	assert.False(t, quictunWanted([]string{"direct", "kcptun"}))
}

// TestRateCapReport renders the rate-cap section.
func TestRateCapReport(t *testing.T) {
	t.Parallel()
	res := sampleResults()
	res.Variants = []string{"quictun"}
	link := "WAN 100mbit loss 0%"
	res.Samples = []Sample{
		{Scenario: ScRateCap, Link: link, Case: "download, cap 20 Mbit/s, 4 streams", Variant: "quictun-client-fixed",
			Metrics: map[string]float64{"cap_pct": 97.5, "mbit_per_s": 19.5, "cap_mbit_per_s": 20, "client_mbit_per_s": 18.9}},
	}
	dir := t.TempDir()
	require.NoError(t, WriteReport(dir, res))
	b, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	md := string(b)
	assert.Contains(t, md, "## 2c. Rate caps the client cannot dodge (issue 35)")
	assert.Contains(t, md, "| "+link+" | download, cap 20 Mbit/s, 4 streams | quictun-client-fixed | 97.50 | 19.50 | 20.00 | 18.90 |")
	assert.True(t, strings.Contains(md, "ratecap-wan-cap-pct.png"), "chart")
}

// TestRunRateCap runs the rate-cap scenario end to end (smoke profile: 2 s
// transfers): every client controller gets a download and an upload sample
// measured by the server against the cap, with the CPU columns; then the
// shared run gives a sample per identity and direction.
func TestRunRateCap(t *testing.T) {
	res, _, p := runTunnelSmoke(t, "hr", nil, ScRateCap)
	require.Len(t, res.Samples, 2*len(p.RateCap.ClientCC)+2*len(p.RateCap.Shared), "notes %v", res.Notes)
	shared := 0
	for _, smp := range res.Samples {
		assert.Empty(t, smp.Error, "%s/%s", smp.Case, smp.Variant)
		m := smp.Metrics
		assert.Positive(t, m["mbit_per_s"], smp.Case)
		if smp.Variant == "quictun-shared" {
			shared++
			if m["cap_mbit_per_s"] == 0 {
				assert.Positive(t, m["rest_pct"], "%s: against what the caps leave", smp.Case)
				continue
			}
		} else {
			assert.Contains(t, m, "cpu_server_pct")
			assert.Contains(t, m, "emu_cpu_pct")
		}
		// The cap holds: far below the 100 Mbit/s link (a loaded machine
		// may get less than the cap, never much more).
		assert.Less(t, m["cap_pct"], 130.0, "%s/%s", smp.Case, smp.Variant)
	}
	assert.Equal(t, 2*len(p.RateCap.Shared), shared)
}

// TestRateCapShared: the shared run's server has a key per identity, a cap
// for the capped ones, and the cases name each identity among the others.
func TestRateCapShared(t *testing.T) {
	t.Parallel()
	r := &Runner{prof: Profile{RateCap: rateCapSpec(10*time.Second, 2*time.Second)}}
	p := r.prof.RateCap
	assert.Equal(t, 24*time.Second, p.SharedDuration)
	assert.Equal(t, 4*time.Second, p.SharedWarmup, "a 20 s window")
	q := r.rateCapSharedVariant()
	assert.Equal(t, "quictun-shared", q.Name())
	assert.Equal(t, []KeyClient{{"capped20", "20Mbit/20Mbit"}, {"capped40", "40Mbit/40Mbit"}, {"uncapped", ""}}, q.Keys)
	assert.Equal(t, []string{"--link-rate", "90Mbit", "--congestion", "bbr"}, q.ServerArgs)
	assert.Equal(t, "127.0.0.1:"+strconv.Itoa(qtKeySinkLocal+1+10*q.Instance), q.KeySink("capped40"))
	assert.Empty(t, q.KeySink("nobody"))
	assert.Equal(t, "download, 3 identities at once (caps 20/40/none), 4 streams each: key=capped40, cap 40 Mbit/s",
		rateCapSharedCase(p, rateCapDown, p.Shared[1]))
	assert.Equal(t, "upload, 3 identities at once (caps 20/40/none), 4 streams each: key=uncapped, uncapped",
		rateCapSharedCase(p, rateCapUp, p.Shared[2]))
	assert.InDelta(t, 40.0, sharedRest(p.Shared, rateCapDown, 100), 1e-9)
	assert.Zero(t, sharedRest(p.Shared, rateCapDown, 50), "caps above the link leave nothing")
	assert.Zero(t, sharedRest(p.Shared, rateCapDown, 0), "unknown link rate")
}
