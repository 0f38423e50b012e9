package app

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/cmd/internal/cli"
)

// writeKeysFile writes a --keys-file of n keys (mode 0600).
func writeKeysFile(tb testing.TB, n int) string {
	tb.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "user-%d secret-of-user-%d-long-enough\n", i, i)
	}
	p := filepath.Join(tb.TempDir(), "keys")
	require.NoError(tb, os.WriteFile(p, []byte(b.String()), 0o600))
	return p
}

// TestLoadTenThousandKeys (issue 35 item 5): a --keys-file of 10,000 keys
// loads, and a reload's key diff of two such files names only the change;
// both well within a second (the bound here is loose for -race on a loaded
// machine; BenchmarkLoadKeys10000 is the figure).
func TestLoadTenThousandKeys(t *testing.T) {
	t.Parallel()
	p := writeKeysFile(t, 10_000)
	start := time.Now()
	kr, err := loadKeys("", p)
	require.NoError(t, err)
	require.Equal(t, 10_000, kr.Len())
	next := kr.Keys()[1:]
	added, removed := cli.Diff(keyLabels(kr), keyLabelsOf(next))
	took := time.Since(start)
	t.Logf("loaded 10,000 keys and diffed them in %v", took)
	assert.Empty(t, added)
	require.Len(t, removed, 1)
	assert.Contains(t, removed[0], "user-0 (")
	assert.Less(t, took, 10*time.Second)
	assert.Equal(t, []string{"a"}, capList([]string{"a"}))
	assert.Len(t, capList(removed), 1)
	long := capList(keyLabels(kr))
	assert.Len(t, long, maxLoggedKeys+1)
	assert.Equal(t, "... and 9980 more", long[maxLoggedKeys])
}

// BenchmarkLoadKeys10000 is reading and checking a --keys-file of 10,000
// keys, as the server does at start and at each reload.
func BenchmarkLoadKeys10000(b *testing.B) {
	p := writeKeysFile(b, 10_000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := loadKeys("", p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReloadKeyDiff10000 is the reload's diff of two 10,000-key rings
// (for its log line).
func BenchmarkReloadKeyDiff10000(b *testing.B) {
	kr, err := loadKeys("", writeKeysFile(b, 10_000))
	require.NoError(b, err)
	cur, next := keyLabels(kr), keyLabelsOf(kr.Keys()[1:])
	b.ReportAllocs()
	for b.Loop() {
		cli.Diff(cur, next)
	}
}
