package hostcheck

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func writeSysctls(t *testing.T, rmem, wmem string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "net/core"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "net/core/rmem_max"), []byte(rmem+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "net/core/wmem_max"), []byte(wmem+"\n"), 0o644))
	return dir
}

func TestBuffers(t *testing.T) {
	ok := buffers(writeSysctls(t, "8000000", "8000000"))
	assert.Equal(t, OK, ok.Severity, ok.Detail)
	small := buffers(writeSysctls(t, "212992", "212992"))
	if hasNetAdmin() {
		assert.Equal(t, OK, small.Severity, "with CAP_NET_ADMIN quic-go forces its buffers")
		assert.Contains(t, small.Detail, "CAP_NET_ADMIN")
	} else {
		assert.Equal(t, Warn, small.Severity)
		assert.Contains(t, small.Fix, "rmem_max=7500000")
	}
	missing := buffers(t.TempDir())
	assert.Equal(t, Warn, missing.Severity)
}

func TestRunLoopback(t *testing.T) {
	fs := Run(Options{Remote: "127.0.0.1:7500"})
	require.Len(t, fs, 3)
	assert.Equal(t, "path-mtu", fs[2].Check)
	assert.Equal(t, OK, fs[2].Severity, fs[2].Detail) // loopback MTU is 65536
	assert.LessOrEqual(t, Worst(fs), Warn)
	assert.Equal(t, "warn", Warn.String())
}

func TestPathMTUBadRemote(t *testing.T) {
	f := pathMTU("[::1]:not-a-port")
	assert.Equal(t, Error, f.Severity)
}
