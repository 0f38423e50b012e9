package procstat

import (
	"os"
	"strings"
	"testing"

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
