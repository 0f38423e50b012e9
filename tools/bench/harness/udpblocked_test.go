package harness

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUDPBlockCommands: the block moves local delivery behind a UDP
// blackhole on the link device, and the unblock restores the rule table.
func TestUDPBlockCommands(t *testing.T) {
	t.Parallel()
	assert.Equal(t, [][]string{
		{"-n", "qb-c", "rule", "add", "pref", "100", "lookup", "local"},
		{"-n", "qb-c", "rule", "del", "pref", "0"},
		{"-n", "qb-c", "rule", "add", "pref", "50", "iif", "lem0", "ipproto", "udp", "blackhole"},
	}, udpBlockCommands("qb-c"))
	assert.Equal(t, [][]string{
		{"-n", "qb-s", "rule", "del", "pref", "50"},
		{"-n", "qb-s", "rule", "add", "pref", "0", "lookup", "local"},
		{"-n", "qb-s", "rule", "del", "pref", "100"},
	}, udpUnblockCommands("qb-s"))
}

// TestRunUDPBlocked runs the udp-blocked scenario (smoke profile) with
// direct TCP and quictun: the block held (the UDP probe lost every
// datagram, quictun's client says new tunnels go over TCP), quictun's
// client started and carried its first echo, both variants measured the
// latency workload and a download, quictun's with the daemons' CPU (kcptun,
// UDP only, none), and afterwards UDP got through again and the tunnels
// restarted.
func TestRunUDPBlocked(t *testing.T) {
	// kcptun, when installed, sits the block out and is restarted after it.
	withKcptun := func(o *Options) {
		if KcptunAvailable() {
			o.Variants = append(o.Variants, "kcptun")
		}
	}
	res, _, p := runTunnelSmoke(t, "hu", withKcptun, ScUDPBlocked)
	loss := map[string]float64{}
	for _, c := range res.Checks {
		loss[c.Name] = c.Value
	}
	assert.Equal(t, map[string]float64{"UDP blocked": 100, "UDP back": 0}, loss, "checks %v", res.Checks)
	for _, n := range res.Notes {
		assert.NotContains(t, n, "udp-blocked", "UDP unblocked and quictun restarted after the scenario")
	}
	n := map[string]int{}
	for _, smp := range res.Samples {
		require.Equal(t, ScUDPBlocked, smp.Scenario)
		assert.Empty(t, smp.Error, "%s/%s", smp.Case, smp.Variant)
		m := smp.Metrics
		n[smp.Variant+"/"+smp.Case]++
		switch smp.Case {
		case udpBlockedStartCase:
			assert.Equal(t, 1.0, m["transport_tcp"], "quictun's client on TCP")
			assert.Positive(t, m["first_byte_ms"])
			assert.GreaterOrEqual(t, m["since_start_ms"], m["first_byte_ms"])
		case "1 stream(s)":
			assert.Positive(t, m["mbit_per_s"], smp.Variant)
			if smp.Variant == "quictun" {
				assert.Contains(t, m, "cpu_client_pct")
				assert.Contains(t, m, "cpu_server_pct")
			}
		default:
			assert.Positive(t, m["total_ms"], smp.Variant)
			assert.Positive(t, m["first_echo_ms"], smp.Variant)
			assert.NotContains(t, m, "mbit_per_s", "the download's column")
		}
	}
	lat := "20 x 1000 B"
	require.Equal(t, 20, p.LatencyNumber)
	assert.Equal(t, map[string]int{"quictun/" + udpBlockedStartCase: 1, "quictun/" + lat: 1, "quictun/1 stream(s)": 1,
		"direct/" + lat: 1, "direct/1 stream(s)": 1}, n)
}
