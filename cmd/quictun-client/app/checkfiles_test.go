package app

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/token"
)

// TestCheckFiles: the client's --check-config reads each file its flags
// name (the checks themselves are cli's TestCheckStartFiles) and its token
// file.
func TestCheckFiles(t *testing.T) {
	t.Parallel()
	garbage := writeFile(t, "garbage", "not a token file")
	goodTokens := writeFile(t, "tokens", "127.0.0.0/8 tcp:127.0.0.1:22\n* tcp:127.0.0.1:80\n")
	badTokens := writeFile(t, "bad-tokens", "127.0.0.0/8 tcp:127.0.0.1:22\n127.0.0.0/8 tcp:127.0.0.1:23\n")
	missing := filepath.Join(t.TempDir(), "not-on-this-host")
	loose := writeFile(t, "loose-session", "")
	require.NoError(t, os.Chmod(loose, 0o644))
	for _, tc := range []struct {
		name    string
		mutate  func(*Options)
		wantErr []string
	}{
		{"good secret", func(o *Options) { o.SecretFile = writeFile(t, "secret", "0123456789abcdef0123\n") }, nil},
		{"every file flag is read", func(o *Options) {
			o.SecretFile, o.HTTPDTokenFile, o.CAFile, o.CertFile, o.KeyFile = missing, missing, missing, missing, missing
			o.TokenSourcePlugin, o.TokenSource = token.PluginFile, missing
		}, []string{"--secret-file: open " + missing, "--httpd-token-file: open " + missing, "--ca-file", "--cert-file/--key-file", "--token-source"}},
		{"missing session file is fine", func(o *Options) { o.SessionFile = missing }, nil},
		{"session file readable by others", func(o *Options) { o.SessionFile = loose }, []string{"--session-file", "chmod 600 " + loose}},
		{"good token file", func(o *Options) { o.TokenSourcePlugin, o.TokenSource = token.PluginFile, goodTokens }, nil},
		{"fixed token is not a file", func(o *Options) { o.TokenSource = garbage }, nil},
		{"bad token file", func(o *Options) { o.TokenSourcePlugin, o.TokenSource = "file", badTokens }, []string{"--token-source"}},
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
	args := []string{"--check-config", "--server-endpoint", "127.0.0.1:7500", "--token-source", "tcp:127.0.0.1:22",
		"--server-fingerprint", testFingerprint}
	_, err := execute(t, append(args, "--secret-file", short)...)
	require.ErrorIs(t, err, cli.ErrUsage)
	assert.Contains(t, err.Error(), "at least 16 bytes")

	missing := filepath.Join(t.TempDir(), "secret")
	_, err = execute(t, append(args, "--secret-file", missing)...)
	require.ErrorIs(t, err, cli.ErrUsage)
	assert.Contains(t, err.Error(), "--secret-file: open "+missing+": no such file or directory")
	assert.Contains(t, err.Error(), "--check-config=flags checks only the flags")
	out, err := execute(t, append(args, "--secret-file", missing, "--check-config=flags")...)
	require.NoError(t, err, "a config for another host: flags only")
	assert.Equal(t, "config OK (flags only; files not read)\n", out)

	good := writeFile(t, "good", "0123456789abcdef")
	require.NoError(t, os.Chmod(good, 0o640))
	_, err = execute(t, append(args, "--secret-file", good)...)
	require.ErrorIs(t, err, cli.ErrUsage)
	assert.Contains(t, err.Error(), "run: chmod 600 "+good)

	require.NoError(t, os.Chmod(good, 0o600))
	out, err = execute(t, append(args, "--secret-file", good)...)
	require.NoError(t, err)
	assert.Equal(t, "config OK\n", out)
}
