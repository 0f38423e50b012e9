package main

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/tools/bench/harness"
)

// TestCommands builds every subcommand: a flag defined twice panics here
// rather than in the hands of whoever runs the bench.
func TestCommands(t *testing.T) {
	var root interface{ Name() string }
	require.NotPanics(t, func() { root = newRootCommand() })
	assert.Equal(t, "bench", root.Name())
	cmd, _, err := newRootCommand().Find([]string{"loadgen"})
	require.NoError(t, err)
	assert.NotNil(t, cmd.Flags().Lookup("gc-wait"))
}

// TestFairDelayFlag: a negative --fair-delay is refused before anything
// runs.
func TestFairDelayFlag(t *testing.T) {
	root := newRootCommand()
	root.SetArgs([]string{"run", "--fair-delay=-1s", "--out", t.TempDir()})
	err := root.Execute()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--fair-delay -1s: must be 0 or more")
}

// TestResumeFlags: the --resume-* flags change the profile's spec, and bad
// values are refused before anything runs.
func TestResumeFlags(t *testing.T) {
	p, err := harness.Profiles("resume")
	require.NoError(t, err)
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.Int("resume-tunnels", 0, "")
	fs.String("resume-transfer-size", "", "")
	fs.Duration("resume-idle-timeout", 0, "")
	fs.String("resume-pause", "", "")
	require.NoError(t, fs.Parse([]string{"--resume-tunnels=1000", "--resume-transfer-size=1GB", "--resume-idle-timeout=0s", "--resume-pause=1s-2s"}))
	spec := p.Resume
	require.NoError(t, applyResumeFlags(fs, &spec, resumeFlags{tunnels: 1000, transfer: "down", size: "1GB", pause: "1s-2s"}))
	assert.Equal(t, 1000, spec.Tunnels)
	assert.Equal(t, time.Second, spec.PauseMin)
	assert.Equal(t, 2*time.Second, spec.PauseMax)
	assert.Equal(t, int64(1e9), spec.Transfer)
	assert.True(t, spec.TransferDown)
	assert.Zero(t, spec.IdleTimeout)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--resume-transfer=sideways"}, `--resume-transfer "sideways"`},
		{[]string{"run", "--profile=resume", "--resume-blackout=20m"}, "shorter than the blackout"},
		{[]string{"run", "--resume-cases=reboot"}, `resume case "reboot"`},
		{[]string{"run", "--resume-pause=1s"}, `--resume-pause "1s": want MIN-MAX`},
		{[]string{"run", "--resume-pause=2s-1s"}, "0 <= pause min <= pause max"},
	} {
		root := newRootCommand()
		root.SetArgs(append(tc.args, "--out", t.TempDir()))
		assert.ErrorContains(t, root.Execute(), tc.want, tc.args)
	}
}
