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
