package loadgen

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"))
}

func TestClientIP(t *testing.T) {
	t.Parallel()
	for i, want := range map[int]string{
		0: "127.0.0.2", 252: "127.0.0.254", 253: "127.0.1.1", 253 + 254: "127.0.2.1",
		maxClients - 1: "127.255.255.254",
	} {
		assert.Equal(t, want, clientIP(i).String(), "client %d", i)
	}
	seen := map[string]bool{}
	for i := range 2000 {
		ip := clientIP(i)
		assert.NotContains(t, []byte{0, 255}, ip[3], "client %d: %s", i, ip)
		assert.False(t, seen[ip.String()], "client %d: %s twice", i, ip)
		seen[ip.String()] = true
	}
}

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	m, err := parseMetrics(strings.NewReader(`# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 17
quictun_server_refused_connections_total{reason="handshake_rate"} 3
quictun_server_refused_connections_total{reason="max_connections"} 0
go_memstats_heap_inuse_bytes 3.3554432e+06
`))
	require.NoError(t, err)
	assert.InDelta(t, 17, m["go_goroutines"], 0)
	assert.InDelta(t, 3.3554432e6, m["go_memstats_heap_inuse_bytes"], 0)
	assert.InDelta(t, 3, m.sum("quictun_server_refused_connections_total"), 0)
	assert.Equal(t, map[string]float64{`reason="handshake_rate"`: 3}, labelled(m, "quictun_server_refused_connections_total"))
	_, err = parseMetrics(strings.NewReader("go_goroutines seventeen\n"))
	require.Error(t, err)
}

func TestParseRcvbufErrors(t *testing.T) {
	t.Parallel()
	snmp := `Tcp: RtoAlgorithm RtoMin
Tcp: 1 200
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors
Udp: 4784875 30722 388056 4156909 388057 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors
UdpLite: 0 0 0 0 7 0
`
	assert.InDelta(t, 388057, parseRcvbufErrors(snmp), 0)
	assert.Zero(t, parseRcvbufErrors("Tcp: 1 200\n"))
}

func TestValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, DefaultOptions().Validate())
	for name, tc := range map[string]struct {
		mutate func(*Options)
		want   string
	}{
		"no clients":   {func(o *Options) { o.Clients = 0 }, "--clients"},
		"tunnels > N":  {func(o *Options) { o.Clients, o.Tunnels = 5, 6 }, "--tunnels"},
		"bad signal":   {func(o *Options) { o.Restarts = []string{"hup"} }, "--restarts"},
		"no timeout":   {func(o *Options) { o.Timeout = 0 }, "--timeout"},
		"concurrency":  {func(o *Options) { o.Concurrency = 0 }, "--concurrency"},
		"tunnel bytes": {func(o *Options) { o.TunnelBytes = 0 }, "--tunnel-bytes"},
	} {
		o := DefaultOptions()
		tc.mutate(&o)
		err := o.Validate()
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), tc.want, name)
	}
}

// TestSmoke runs every phase with 20 clients against a quictun-server built
// from this tree, with keep-alives of 1 s so a SIGKILLed server is noticed
// at once, and fails if a phase breaks.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the load generator run under -short")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin, "github.com/quictun/quictun/cmd/quictun-server")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run(), "build quictun-server")

	o := DefaultOptions()
	o.BinDir, o.ResultsDir = bin, t.TempDir()
	o.Clients, o.Concurrency, o.Tunnels = 20, 8, 4
	o.Idle, o.Quiet, o.KeepAlive, o.Settle = 2*time.Second, 0, time.Second, 500*time.Millisecond
	o.ServerArgs = []string{"--keepalive-period=1s"}
	o.PhaseTimeout, o.Timeout, o.GCWait = time.Minute, 3*time.Minute, 0
	o.Command = "TestSmoke"
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	dir, err := Run(ctx, o)
	require.NoError(t, err)
	r, err := LoadResults(dir)
	require.NoError(t, err)

	require.NotNil(t, r.Connect, "connect")
	assert.Equal(t, 20, r.Connect.Full, "full handshakes")
	assert.Positive(t, r.Connect.PerSecond)
	assert.Positive(t, r.Baseline.Goroutines)
	require.NotNil(t, r.Idle, "idle")
	assert.InDelta(t, 20, r.Idle.ServerConnections, 0)
	assert.Equal(t, 20, r.Idle.ClientsReady)
	assert.Positive(t, r.Idle.GoroutinesPerClient)
	assert.Positive(t, r.Idle.ServerCPUSeconds)
	require.NotNil(t, r.Tunnels, "tunnels")
	assert.Equal(t, 4, r.Tunnels.OK)
	require.Len(t, r.Restarts, 2)
	for _, rs := range r.Restarts {
		assert.Zero(t, rs.NotBack, rs.Signal)
		assert.Equal(t, 20, rs.Full+rs.ZeroRTT, rs.Signal)
		assert.Positive(t, rs.AllBackSeconds, rs.Signal)
	}
	require.NotNil(t, r.Resume, "resume")
	assert.Equal(t, 20, r.Resume.ZeroRTT, "resumed with 0-RTT")
	require.NotNil(t, r.Leave, "leave")
	require.NotNil(t, r.Leave.Disconnect, "leave")
	assert.InDelta(t, 20, r.Leave.ServerEnded[`result="shutdown"`], 0, "closed by the clients")
	assert.LessOrEqual(t, r.Leave.GoroutinesOverBaseline, float64(leakTolerance))
	assert.True(t, r.Leave.GCAfterLeave, "the server collected when asked")
	// Measured (heap_alloc over the baseline's), not asserted: with 20
	// clients the garbage either snapshot holds can outweigh their state,
	// so its sign varies (-7.9 KiB in one make test under load).
	assert.NotZero(t, r.Idle.LiveHeapPerClientBytes, "live heap per client")
	assert.Positive(t, r.Baseline.LiveHeapBytes, "baseline live heap")
	report, err := os.ReadFile(dir + "/report.md")
	require.NoError(t, err)
	assert.Contains(t, string(report), "4 restart SIGKILL")
}
