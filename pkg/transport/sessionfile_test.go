package transport_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/transport"
)

// TestFileSessionCacheSurvivesClientRestart: a client that starts again with
// the same session file resumes with 0-RTT; the file is private.
func TestFileSessionCacheSurvivesClientRestart(t *testing.T) {
	t.Parallel()
	st, err := transport.LoadOrCreateState(filepath.Join(t.TempDir(), "state"), "", "")
	require.NoError(t, err)
	pin, err := transport.ParseFingerprint(st.Fingerprint())
	require.NoError(t, err)
	addr, _ := serveOnce(t, st)
	path := filepath.Join(t.TempDir(), "sessions.json")
	var errs []error
	onErr := func(err error) { errs = append(errs, err) }

	first := newSignallingCache(transport.NewFileSessionCache(path, 4, onErr))
	conn := dialEarly(t, addr, first, pin)
	assert.False(t, conn.ConnectionState().Used0RTT, "no ticket yet")
	first.waitStored(t)
	_ = conn.CloseWithError(0, "")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the file holds resumption secrets")

	// The "restarted" client: a new cache from the same file.
	second := transport.NewFileSessionCache(path, 4, onErr)
	conn = dialEarly(t, addr, second, pin)
	assert.True(t, conn.ConnectionState().Used0RTT, "0-RTT with the ticket from the file")
	assert.True(t, conn.ConnectionState().TLS.DidResume)
	_ = conn.CloseWithError(0, "")
	assert.Empty(t, errs)
}

// TestFileSessionCacheBadFiles: an unreadable, foreign or truncated file
// is reported and ignored; the cache still works and rewrites it.
func TestFileSessionCacheBadFiles(t *testing.T) {
	t.Parallel()
	for name, content := range map[string]string{
		"garbage":       "\x00\x01not json",
		"other version": `{"version": 99, "sessions": {}}`,
		"bad ticket":    `{"version": 1, "sessions": {"k": {"ticket": "AAAA", "state": "AAAA"}}}`,
		"truncated":     `{"version": 1, "sessions": {"k": {"ticket": "AA`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "sessions.json")
			require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
			var errs []error
			c := transport.NewFileSessionCache(path, 4, func(err error) { errs = append(errs, err) })
			require.Len(t, errs, 1)
			assert.Contains(t, errs[0].Error(), path)
			_, ok := c.Get("k")
			assert.False(t, ok)
		})
	}
	t.Run("missing is empty", func(t *testing.T) {
		t.Parallel()
		var errs []error
		transport.NewFileSessionCache(filepath.Join(t.TempDir(), "none.json"), 4, func(err error) { errs = append(errs, err) })
		assert.Empty(t, errs)
	})
}

// TestFileSessionCacheTooLarge: a file past the size bound is reported and ignored.
func TestFileSessionCacheTooLarge(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sessions.json")
	big := `{"version": 1, "sessions": {"k": {"ticket": "` + strings.Repeat("A", 2<<20) + `", "state": "AAAA"}}}`
	require.NoError(t, os.WriteFile(path, []byte(big), 0o600))
	var errs []error
	c := transport.NewFileSessionCache(path, 4, func(err error) { errs = append(errs, err) })
	require.Len(t, errs, 1)
	_, ok := c.Get("k")
	assert.False(t, ok)
}
