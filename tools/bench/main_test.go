package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
