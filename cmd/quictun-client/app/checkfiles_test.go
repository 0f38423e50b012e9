package app

import (
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
	for _, tc := range []struct {
		name    string
		mutate  func(*Options)
		wantErr []string
	}{
		{"good secret", func(o *Options) { o.SecretFile = good }, nil},
		{"files of another host are skipped", func(o *Options) {
			o.SecretFile, o.HTTPDTokenFile, o.CAFile, o.CertFile, o.KeyFile = missing, missing, missing, missing, missing
			o.TokenSourcePlugin, o.TokenSource = token.PluginFile, missing
		}, nil},
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

	good := writeFile(t, "good", "0123456789abcdef")
	out, err := execute(t, append(args, "--secret-file", good)...)
	require.NoError(t, err)
	assert.Equal(t, "config OK\n", out)
}
