package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/transport"
)

// TestCheckFiles: the server's --check-config reads each file its flags
// name (the checks themselves are cli's TestCheckStartFiles).
func TestCheckFiles(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "not-on-this-host")
	looseDir := filepath.Join(t.TempDir(), "loose")
	_, err := transport.LoadOrCreateState(looseDir, "", "")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(looseDir, 0o770))
	for _, tc := range []struct {
		name    string
		mutate  func(*Options)
		wantErr []string
	}{
		{"good secret", func(o *Options) { o.SecretFile = writeFile(t, "secret", "0123456789abcdef0123\n") }, nil},
		{"every file flag is read", func(o *Options) {
			o.SecretFile, o.KeysFile, o.HTTPDTokenFile, o.ClientCAFile, o.CertFile, o.KeyFile = missing, missing, missing, missing, missing, missing
		}, []string{"--secret-file: open " + missing, "--keys-file: open " + missing, "--httpd-token-file: open " + missing, "--client-ca-file", "--cert-file/--key-file"}},
		{"a --keys-file name that is the --secret-file key's ID", func(o *Options) {
			o.SecretFile = writeFile(t, "secret", "0123456789abcdef0123\n")
			o.KeysFile = writeFile(t, "keys", proto.KeyIDOf([]byte("0123456789abcdef0123")).String()+" another-secret-of-16-bytes\n")
		}, []string{"--secret-file/--keys-file: key 2: the name \"" + proto.KeyIDOf([]byte("0123456789abcdef0123")).String() + "\" is the ID of key 1 (the unnamed key"}},
		{"missing state dir is created at start", func(o *Options) { o.StateDir = missing }, nil},
		{"state dir readable by others", func(o *Options) { o.StateDir = looseDir }, []string{"--state-dir " + looseDir, "chmod 700 " + looseDir}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := NewOptions()
			tc.mutate(o)
			testutil.RequireErrorContains(t, o.CheckFiles(), tc.wantErr)
		})
	}
}

func TestCheckConfigReadsFiles(t *testing.T) {
	clearEnv(t)
	short := writeFile(t, "short", "tooshort")
	_, err := execute(t, "--check-config", "--secret-file", short)
	require.ErrorIs(t, err, cli.ErrUsage)
	assert.Contains(t, err.Error(), "at least 16 bytes")

	good := writeFile(t, "good", strings.Repeat("s", 32))
	out, err := execute(t, "--check-config", "--secret-file", good)
	require.NoError(t, err)
	assert.Equal(t, "config OK\n", out)

	// --write-config does not read files.
	_, err = execute(t, "--write-config", "--secret-file", short)
	require.NoError(t, err)
}
