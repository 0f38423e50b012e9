package harness

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDaemonEnv(t *testing.T) {
	const sysmon = "GODEBUG=" + SysmonPolling
	for _, tc := range []struct {
		name             string
		inherited, extra []string
		procs            int
		want             []string
	}{
		{"nothing set, 2 CPUs", []string{"A=1"}, nil, 2, []string{"GOMAXPROCS=1", sysmon}},
		{"16 CPUs: half", nil, nil, 16, []string{"GOMAXPROCS=8", sysmon}},
		{"1 CPU: at least one", nil, nil, 1, []string{"GOMAXPROCS=1", sysmon}},
		{"extra GOMAXPROCS wins", nil, []string{"GOMAXPROCS=2"}, 2, []string{"GOMAXPROCS=2", sysmon}},
		{"inherited GOMAXPROCS is kept", []string{"GOMAXPROCS=2"}, nil, 2, []string{sysmon}},
		{"extra GODEBUG naming schedtrace wins", nil, []string{"GODEBUG=schedtrace=0"}, 2, []string{"GOMAXPROCS=1", "GODEBUG=schedtrace=0"}},
		{"inherited GODEBUG naming schedtrace is kept", []string{"GODEBUG=gctrace=1, schedtrace=1000"}, nil, 2, []string{"GOMAXPROCS=1"}},
		{"other GODEBUG settings kept", []string{"GODEBUG=madvdontneed=1"}, nil, 2, []string{"GOMAXPROCS=1", "GODEBUG=madvdontneed=1," + SysmonPolling}},
		{"extra's GODEBUG over inherited's", []string{"GODEBUG=madvdontneed=1"}, []string{"GODEBUG=gctrace=1"}, 2,
			[]string{"GOMAXPROCS=1", "GODEBUG=gctrace=1", "GODEBUG=gctrace=1," + SysmonPolling}},
		{"a similar name is not schedtrace", nil, []string{"GODEBUG=xschedtrace=1"}, 4, []string{"GOMAXPROCS=2", "GODEBUG=xschedtrace=1", "GODEBUG=xschedtrace=1," + SysmonPolling}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, daemonEnv(tc.inherited, tc.extra, tc.procs))
		})
	}
}
