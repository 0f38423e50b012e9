package harness

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The daemons get nothing the user did not set (issue 32): no GOMAXPROCS,
// no GODEBUG added, whatever the CPU count.
func TestBenchDaemonEnvAddsNothing(t *testing.T) {
	assert.Nil(t, benchDaemonEnv(nil))
	assert.Nil(t, benchDaemonEnv([]string{}))
	extra := []string{"GOGC=200"}
	got := benchDaemonEnv(extra)
	assert.Equal(t, []string{"GOGC=200"}, got)
	got[0] = "X=1"
	assert.Equal(t, "GOGC=200", extra[0], "the caller's slice is not shared")
}

func TestParseRuntimeEnv(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{"", nil, ""},
		{"   ", nil, ""},
		{TunedRuntimeEnv, []string{"GOMAXPROCS=1", "GODEBUG=" + SysmonPolling}, ""},
		{"GODEBUG=gctrace=1,schedtrace=0  GOGC=off", []string{"GODEBUG=gctrace=1,schedtrace=0", "GOGC=off"}, ""},
		{"GOMAXPROCS=", []string{"GOMAXPROCS="}, ""},
		{"GOMAXPROCS", nil, `"GOMAXPROCS": want NAME=VALUE`},
		{"=1", nil, `"=1": want NAME=VALUE`},
		{"1X=2 A-B=3", nil, `"1X=2": want NAME=VALUE`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseRuntimeEnv(tc.in)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestRuntimeEnvName(t *testing.T) {
	assert.Equal(t, "quictun", runtimeEnvName("quictun", nil))
	name := runtimeEnvName("quictun-bbr", []string{"GOMAXPROCS=1", "GODEBUG=" + SysmonPolling})
	assert.Equal(t, "quictun-bbr-env(GOMAXPROCS=1,GODEBUG=schedtrace=2147483647)", name)
	assert.True(t, variantSelected(name, []string{"quictun"}), "the tuned variant stays in its family")
	assert.Equal(t, "quictun-b-env(GOGC=off)", (&quictun{Label: "quictun-b", Env: []string{"GOGC=off"}}).Name())
	assert.Equal(t, "quictun", (&quictun{}).Name())
}

func TestInheritedRuntimeEnv(t *testing.T) {
	assert.Contains(t, inheritedRuntimeEnv([]string{"HOME=/root"}, nil), "Go's defaults")
	assert.Equal(t, "GOMAXPROCS=2 GODEBUG=x=1", inheritedRuntimeEnv([]string{"GOMAXPROCS=4", "GODEBUG=x=1"}, []string{"GOMAXPROCS=2"}))
}

func TestPinPlan(t *testing.T) {
	for _, tc := range []struct {
		name       string
		want       bool
		cpus       int
		taskset    bool
		pin        cpuPin
		descSubstr string
	}{
		{"2 CPUs", true, 2, true, cpuPin{Client: "0", Server: "1"}, "on CPU 0"},
		{"8 CPUs: halves", true, 8, true, cpuPin{Client: "0-3", Server: "4-7"}, "on CPU 4-7"},
		{"3 CPUs", true, 3, true, cpuPin{Client: "0", Server: "1-2"}, "on CPU 1-2"},
		{"turned off", false, 2, true, cpuPin{}, "--pin=false"},
		{"1 CPU", true, 1, true, cpuPin{}, "off: 1 CPU"},
		{"no taskset", true, 2, false, cpuPin{}, "taskset(1) not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pin, desc := pinPlan(tc.want, tc.cpus, tc.taskset)
			assert.Equal(t, tc.pin, pin)
			assert.Contains(t, desc, tc.descSubstr)
		})
	}
}

func TestCPUPinWrap(t *testing.T) {
	p := cpuPin{Client: "0", Server: "1"}
	bin, args := p.wrap(sideClient, "/bin/quictun-client", []string{"--a", "b"})
	assert.Equal(t, "taskset", bin)
	assert.Equal(t, []string{"-c", "0", "/bin/quictun-client", "--a", "b"}, args)
	bin, args = p.wrap(sideServer, "kcptun-server", nil)
	assert.Equal(t, "taskset", bin)
	assert.Equal(t, []string{"-c", "1", "kcptun-server"}, args)
	bin, args = cpuPin{}.wrap(sideServer, "x", []string{"y"})
	assert.Equal(t, "x", bin)
	assert.Equal(t, []string{"y"}, args)
}

// With --runtime-env, each quictun build gets one tuned copy with its own
// ports; without it, none.
func TestTunedVariants(t *testing.T) {
	cands := []Variant{&direct{}, &quictun{Congestion: "bbr", Instance: 0}, &quictun{Congestion: "cubic", Instance: 1},
		&quictun{Congestion: "bbr", Instance: 2, BinDir: "/b", Label: "quictun-b"}}
	r := &Runner{}
	assert.Empty(t, r.tunedVariants(cands))
	r.opts.RuntimeEnv = []string{"GOMAXPROCS=1"}
	got := r.tunedVariants(cands)
	require.Len(t, got, 2)
	a, b := got[0].(*quictun), got[1].(*quictun)
	assert.Equal(t, "quictun-bbr-env(GOMAXPROCS=1)", a.Name())
	assert.Equal(t, 3, a.Instance)
	assert.Empty(t, a.BinDir)
	assert.Equal(t, "quictun-b-env(GOMAXPROCS=1)", b.Name())
	assert.Equal(t, 4, b.Instance)
	assert.Equal(t, "/b", b.BinDir)
}
