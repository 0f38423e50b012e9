package app

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/transport"
)

func TestCheckFiles(t *testing.T) {
	t.Parallel()
	good := writeFile(t, "secret", "0123456789abcdef0123\n")
	short := writeFile(t, "short", "tooshort\n")
	garbage := writeFile(t, "garbage.pem", "not a certificate")
	goodTokens := writeFile(t, "tokens", "127.0.0.0/8 tcp:127.0.0.1:22\n* tcp:127.0.0.1:80\n")
	badTokens := writeFile(t, "bad-tokens", "127.0.0.0/8 tcp:127.0.0.1:22\n127.0.0.0/8 tcp:127.0.0.1:23\n")
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	for _, d := range []string{a, b} {
		_, err := transport.LoadOrCreateState(d, "", "")
		require.NoError(t, err)
	}
	missing := filepath.Join(t.TempDir(), "not-on-this-host")
	loose := writeFile(t, "loose-secret", "0123456789abcdef0123\n")
	require.NoError(t, os.Chmod(loose, 0o644))
	keyPEM, err := os.ReadFile(filepath.Join(a, transport.KeyFileName))
	require.NoError(t, err)
	looseKey := writeFile(t, "loose-key.pem", string(keyPEM))
	require.NoError(t, os.Chmod(looseKey, 0o640))
	for _, tc := range []struct {
		name    string
		mutate  func(*Options)
		wantErr []string
	}{
		{"good secret", func(o *Options) { o.SecretFile = good }, nil},
		{"missing files are errors", func(o *Options) {
			o.SecretFile, o.HTTPDTokenFile, o.CAFile, o.CertFile, o.KeyFile = missing, missing, missing, missing, missing
			o.TokenSourcePlugin, o.TokenSource = token.PluginFile, missing
		}, []string{"--secret-file: open " + missing, "--httpd-token-file: open " + missing, "--ca-file", "--cert-file/--key-file", "--token-source"}},
		{"missing session file is fine", func(o *Options) { o.SessionFile = missing }, nil},
		{"secret readable by others", func(o *Options) { o.SecretFile = loose }, []string{"--secret-file " + loose + " is accessible by group or others (mode 0644): run: chmod 600 " + loose}},
		{"session file readable by group", func(o *Options) { o.SessionFile = loose }, []string{"--session-file", "chmod 600 " + loose}},
		{"key file readable by others", func(o *Options) {
			o.CertFile, o.KeyFile = filepath.Join(a, transport.CertFileName), looseKey
		}, []string{"--key-file " + looseKey, "chmod 600 " + looseKey}},
		{"good CA, key pair and token file", func(o *Options) {
			o.CAFile = filepath.Join(a, transport.CertFileName)
			o.CertFile, o.KeyFile = filepath.Join(a, transport.CertFileName), filepath.Join(a, transport.KeyFileName)
			o.TokenSourcePlugin, o.TokenSource = token.PluginFile, goodTokens
		}, nil},
		{"fixed token is not a file", func(o *Options) { o.TokenSource = garbage }, nil},
		{"short secret", func(o *Options) { o.SecretFile = short }, []string{"--secret-file", "at least 16 bytes"}},
		{"short admin token", func(o *Options) { o.HTTPDTokenFile = short }, []string{"--httpd-token-file"}},
		{"CA not PEM", func(o *Options) { o.CAFile = garbage }, []string{"--ca-file", "no PEM certificates"}},
		{"key of another certificate", func(o *Options) {
			o.CertFile, o.KeyFile = filepath.Join(a, transport.CertFileName), filepath.Join(b, transport.KeyFileName)
		}, []string{"--cert-file/--key-file"}},
		{"bad token file", func(o *Options) { o.TokenSourcePlugin, o.TokenSource = "file", badTokens }, []string{"--token-source"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := NewOptions()
			tc.mutate(o)
			err := o.CheckFiles()
			if len(tc.wantErr) == 0 {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, s := range tc.wantErr {
				assert.Contains(t, err.Error(), s)
			}
			assert.NotContains(t, err.Error(), "tooshort", "never prints a secret")
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
