package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSysmonEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		want []string // nil: no re-execution
	}{
		{"no GODEBUG", []string{"A=1"}, []string{"A=1", "GODEBUG=" + SysmonSetting}},
		{"empty GODEBUG", []string{"GODEBUG=", "A=1"}, []string{"GODEBUG=" + SysmonSetting, "A=1"}},
		{"other settings kept", []string{"GODEBUG=gctrace=1,madvdontneed=1"}, []string{"GODEBUG=gctrace=1,madvdontneed=1," + SysmonSetting}},
		{"the user's schedtrace wins", []string{"GODEBUG=schedtrace=0"}, nil},
		{"named among others", []string{"GODEBUG=gctrace=1, schedtrace=1000"}, nil},
		{"already set by the first execution", []string{"GODEBUG=" + SysmonSetting}, nil},
		{"a similar name is not schedtrace", []string{"GODEBUG=xschedtrace=1"}, []string{"GODEBUG=xschedtrace=1," + SysmonSetting}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := sysmonEnv(tc.env)
			assert.Equal(t, tc.want != nil, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}
