package procstat

import (
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProcReaders(t *testing.T) {
	t.Parallel()
	cpu, err := CPUSeconds(os.Getpid())
	require.NoError(t, err)
	assert.GreaterOrEqual(t, cpu, 0.0)
	rss, err := RSSBytes(os.Getpid())
	require.NoError(t, err)
	assert.Greater(t, rss, int64(1<<20))

	v, err := ParseVmRSS(strings.NewReader("Name:\tx\nVmRSS:\t   1234 kB\n"))
	require.NoError(t, err)
	assert.Equal(t, int64(1234*1024), v)
	_, err = ParseVmRSS(strings.NewReader("Name:\tx\n"))
	require.Error(t, err)
}

func TestContextSwitches(t *testing.T) {
	v, iv := parseSwitches(strings.NewReader("Name:\tx\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n"))
	assert.Equal(t, int64(12), v)
	assert.Equal(t, int64(3), iv)
	v, _, err := ContextSwitches(os.Getpid())
	require.NoError(t, err)
	assert.Positive(t, v, "this test process has slept at least once")
}

// TestCPUSecondsResolution: CPUSeconds sees a few milliseconds of CPU, which
// /proc/PID/stat's 10 ms ticks do not (benchmark samples of a second show a
// daemon using 0 CPU with them), and it reads another process too. It checks
// the size of the clock's steps, not how many fit in some amount of CPU, so it
// holds however slowly the machine (or the race detector) runs the loop: a
// reader of ticks never steps by less than 10 ms, whatever the load.
func TestCPUSecondsResolution(t *testing.T) {
	start, err := CPUSeconds(os.Getpid())
	require.NoError(t, err)
	smallest := math.Inf(1)
	deadline := time.Now().Add(5 * time.Second) // bounds the loop on a machine that gives this process no CPU
	for prev, steps := start, 0; steps < 20 && time.Now().Before(deadline); {
		cpu, err := CPUSeconds(os.Getpid())
		require.NoError(t, err)
		require.GreaterOrEqual(t, cpu, prev, "the CPU clock went backwards")
		if cpu > prev {
			smallest = math.Min(smallest, cpu-prev)
			steps++
		}
		prev = cpu
	}
	assert.Less(t, smallest, 0.002, "the smallest step of the CPU clock, in seconds (ticks step by 0.01)")
	stat, err := statCPUSeconds(os.Getpid())
	require.NoError(t, err)
	cpu, err := CPUSeconds(os.Getpid())
	require.NoError(t, err)
	assert.InDelta(t, cpu, stat, 0.05, "the CPU clock and /proc/PID/stat agree to a few ticks")

	child := exec.Command("sleep", "5")
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	c, err := CPUSeconds(child.Process.Pid)
	require.NoError(t, err)
	assert.Less(t, c, 1.0, "sleep's CPU time")
	require.NoError(t, child.Process.Kill())
	_ = child.Wait()
	_, err = CPUSeconds(child.Process.Pid)
	assert.Error(t, err, "a reaped process has no CPU time")
}
