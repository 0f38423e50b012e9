package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/pkg/transport"
)

func TestCheckFiles(t *testing.T) {
	t.Parallel()
	good := writeFile(t, "secret", "0123456789abcdef0123\n")
	short := writeFile(t, "short", "tooshort\n")
	garbage := writeFile(t, "garbage.pem", "not a certificate")
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	for _, d := range []string{a, b} {
		_, err := transport.LoadOrCreateState(d, "", "")
		require.NoError(t, err)
	}
	missing := filepath.Join(t.TempDir(), "not-on-this-host")
	looseDir, looseKeyDir := filepath.Join(t.TempDir(), "loose"), filepath.Join(t.TempDir(), "loose-key")
	for _, d := range []string{looseDir, looseKeyDir} {
		_, err := transport.LoadOrCreateState(d, "", "")
		require.NoError(t, err)
	}
	require.NoError(t, os.Chmod(looseDir, 0o770))
	require.NoError(t, os.Chmod(filepath.Join(looseKeyDir, transport.ResetKeyFileName), 0o640))
	looseSecret := writeFile(t, "loose-secret", "0123456789abcdef0123\n")
	require.NoError(t, os.Chmod(looseSecret, 0o604))
	for _, tc := range []struct {
		name    string
		mutate  func(*Options)
		wantErr []string
	}{
		{"good secret", func(o *Options) { o.SecretFile = good }, nil},
		{"missing files are errors", func(o *Options) {
			o.SecretFile, o.HTTPDTokenFile, o.ClientCAFile, o.CertFile, o.KeyFile = missing, missing, missing, missing, missing
		}, []string{"--secret-file: open " + missing, "--httpd-token-file: open " + missing, "--client-ca-file", "--cert-file/--key-file"}},
		{"missing state dir is created at start", func(o *Options) { o.StateDir = missing }, nil},
		{"good state dir", func(o *Options) { o.StateDir = a }, nil},
		{"state dir readable by others", func(o *Options) { o.StateDir = looseDir }, []string{"--state-dir " + looseDir + " is accessible by group or others (mode 0770): run: chmod 700 " + looseDir}},
		{"state key readable by group", func(o *Options) { o.StateDir = looseKeyDir },
			[]string{"--state-dir key file " + filepath.Join(looseKeyDir, transport.ResetKeyFileName), "chmod 600 " + filepath.Join(looseKeyDir, transport.ResetKeyFileName)}},
		{"secret readable by others", func(o *Options) { o.SecretFile = looseSecret }, []string{"chmod 600 " + looseSecret}},
		{"good CA and key pair", func(o *Options) {
			o.ClientCAFile = filepath.Join(a, transport.CertFileName)
			o.CertFile, o.KeyFile = filepath.Join(a, transport.CertFileName), filepath.Join(a, transport.KeyFileName)
		}, nil},
		{"short secret", func(o *Options) { o.SecretFile = short }, []string{"--secret-file", "at least 16 bytes"}},
		{"short admin token", func(o *Options) { o.HTTPDTokenFile = short }, []string{"--httpd-token-file"}},
		{"CA not PEM", func(o *Options) { o.ClientCAFile = garbage }, []string{"--client-ca-file", "no PEM certificates"}},
		{"key of another certificate", func(o *Options) {
			o.CertFile, o.KeyFile = filepath.Join(a, transport.CertFileName), filepath.Join(b, transport.KeyFileName)
		}, []string{"--cert-file/--key-file"}},
		{"everything at once", func(o *Options) {
			o.SecretFile, o.HTTPDTokenFile, o.ClientCAFile, o.CertFile, o.KeyFile = short, short, garbage, garbage, garbage
		}, []string{"--secret-file", "--httpd-token-file", "--client-ca-file", "--cert-file/--key-file"}},
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
