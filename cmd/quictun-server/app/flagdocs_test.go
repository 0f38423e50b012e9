package app

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/cmd/internal/cli"
)

// TestFlagDocsCurrent: docs/flags-server.md is what `make docs` writes from the
// command's flags today, so the flag reference cannot disagree with --help.
func TestFlagDocsCurrent(t *testing.T) {
	var want bytes.Buffer
	require.NoError(t, cli.WriteFlagDocs(&want, NewCommand()))
	path := filepath.Join("..", "..", "..", "docs", "flags-server.md")
	got, err := os.ReadFile(path)
	require.NoError(t, err, "run make docs")
	require.Equal(t, want.String(), string(got), "%s is stale: run make docs and commit it", path)
}
