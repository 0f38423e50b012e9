package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// writtenConfig runs --write-config and parses the YAML it prints.
func writtenConfig(t *testing.T, env []string, bin string, args ...string) (map[string]any, string) {
	t.Helper()
	r := run(t, env, bin, append(args, "--write-config")...)
	require.Equal(t, 0, r.code, "--write-config failed: %s", r.stderr)
	var m map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(r.stdout), &m), r.stdout)
	return m, r.stdout
}

// TestConfigPrecedence: an operator sets a value in the file, overrides some in
// the environment and one on the command line; --write-config shows which won.
func TestConfigPrecedence(t *testing.T) {
	checkLeaks(t)
	secret := newSecretFile(t)
	file := writeFile(t, "server.yaml", `# quictun-server
dial-timeout: 7s
header-timeout: 3s
idle-timeout: 20s
allow:
  - tcp:127.0.0.1:22
  - db=tcp:127.0.0.1:5432
secret-file: `+secret+`
state-dir: `+filepath.Join(t.TempDir(), "state")+`
`)
	env := []string{"QUICTUN_HEADER_TIMEOUT=4s", "QUICTUN_IDLE_TIMEOUT=30s", "QUICTUN_DRAIN_TIMEOUT=11s"}
	got, out := writtenConfig(t, env, bins.server, "--config", file, "--idle-timeout", "40s")
	assert.Equal(t, "7s", got["dial-timeout"], "file value, nothing overrides it")
	assert.Equal(t, "4s", got["header-timeout"], "environment beats file")
	assert.Equal(t, "40s", got["idle-timeout"], "command line beats environment and file")
	assert.Equal(t, "11s", got["drain-timeout"], "environment beats default")
	assert.Equal(t, "25s", got["keepalive-period"], "default")
	assert.Equal(t, []any{"tcp:127.0.0.1:22", "db=tcp:127.0.0.1:5432"}, got["allow"], "a YAML list replaces the default allow-list")
	assert.Equal(t, secret, got["secret-file"])

	// The output is a valid config file that loads back to the same effective config.
	written := writeFile(t, "written.yaml", out)
	again, _ := writtenConfig(t, nil, bins.server, "--config", written)
	assert.Equal(t, got, again)
	r := run(t, nil, bins.server, "--config", written, "--check-config")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "config OK\n", r.stdout)

	// The client follows the same rules.
	cfile := writeFile(t, "client.yaml", "server-endpoint: file.example:7500\ntoken-source: tcp:127.0.0.1:22\nsession-wait-timeout: 3s\n")
	cgot, _ := writtenConfig(t, []string{"QUICTUN_SERVER_ENDPOINT=env.example:7500", "QUICTUN_TOKEN_SOURCE=tcp:127.0.0.1:2222"},
		bins.client, "--config", cfile, "--token-source", "tcp:127.0.0.1:3333")
	assert.Equal(t, []any{"env.example:7500"}, cgot["server-endpoint"], "a list flag since issue 23 (several servers)")
	assert.Equal(t, "tcp:127.0.0.1:3333", cgot["token-source"])
	assert.Equal(t, "3s", cgot["session-wait-timeout"])
}

// TestConfigUnknownKey: a typo in the file is an error naming file:line, with a
// suggestion, and every bad key is reported, not only the first.
func TestConfigUnknownKey(t *testing.T) {
	checkLeaks(t)
	file := writeFile(t, "typo.yaml", "listen-on: 127.0.0.1:7500\ninsecure-no-auth: true\ndail-timeout: 2s\nallow: tcp:127.0.0.1:22\nheadr-timeout: 1s\n")
	for _, args := range [][]string{
		{"--config", file},
		{"--config", file, "--check-config"},
		{"--config", file, "--write-config"},
	} {
		r := run(t, nil, bins.server, args...)
		assert.NotEqual(t, 0, r.code, "%v must fail", args)
		assert.Empty(t, r.stdout, "%v", args)
		assert.Contains(t, r.stderr, file+`:3: unknown key "dail-timeout" (did you mean "dial-timeout"?)`, "%v", args)
		assert.Contains(t, r.stderr, file+`:5: unknown key "headr-timeout" (did you mean "header-timeout"?)`, "%v", args)
		assert.NotContains(t, r.stderr, "Server listening", "%v: a bad config must not start the server", args)
	}
}

// TestCheckConfig: --check-config exits 0 only for a config the daemon would run with.
func TestCheckConfig(t *testing.T) {
	checkLeaks(t)
	secret := newSecretFile(t)
	state := filepath.Join(t.TempDir(), "state")
	short := writeFile(t, "short-secret", "tooshort\n")
	for _, tc := range []struct {
		name     string
		env      []string
		args     []string
		wantCode int
		want     []string // substrings of stderr
	}{
		{name: "valid", args: []string{"--secret-file", secret, "--state-dir", state}, wantCode: 0},
		{name: "no auth", args: []string{"--state-dir", state}, wantCode: 1,
			want: []string{"client authentication is required: set --secret-file (or --keys-file) or --client-ca-file"}},
		{name: "contradiction", args: []string{"--state-dir", state, "--secret-file", secret, "--insecure-no-auth"}, wantCode: 1,
			want: []string{"--insecure-no-auth contradicts --secret-file/--keys-file/--client-ca-file"}},
		{name: "keepalive not below idle", args: []string{"--secret-file", secret, "--idle-timeout", "2s", "--keepalive-period", "2s"}, wantCode: 1,
			want: []string{"--keepalive-period (2s) must be shorter than --idle-timeout (2s)"}},
		{name: "bad env value", env: []string{"QUICTUN_DIAL_TIMEOUT=soon"}, args: []string{"--secret-file", secret}, wantCode: 1,
			want: []string{`environment QUICTUN_DIAL_TIMEOUT: invalid value "soon" for flag --dial-timeout`}},
		{name: "bad allow rule", args: []string{"--secret-file", secret, "--allow", "tcp:127.0.0.1"}, wantCode: 1,
			want: []string{"--allow"}},
		{name: "every problem at once", args: []string{"--listen-on", "", "--idle-timeout", "0s", "--max-streams-per-conn", "0"}, wantCode: 1,
			want: []string{"--listen-on", "client authentication is required", "--idle-timeout must be positive", "--max-streams-per-conn must be at least 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, tc.env, bins.server, append(tc.args, "--check-config")...)
			assert.Equal(t, tc.wantCode, r.code, "stderr: %s", r.stderr)
			if tc.wantCode == 0 {
				assert.Equal(t, "config OK\n", r.stdout)
			} else {
				assert.NotContains(t, r.stdout, "config OK")
			}
			for _, w := range tc.want {
				assert.Contains(t, r.stderr, w)
			}
		})
	}
	// --check-config reads the secret as the daemon does at start: a too-short
	// secret fails both.
	r := run(t, nil, bins.server, "--secret-file", short, "--state-dir", state, "--check-config")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "secret must be at least 16 bytes")
	r = run(t, nil, bins.server, "--secret-file", short, "--state-dir", state, "--listen-on", "127.0.0.1:0", "--httpd-listen-on", "")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "secret must be at least 16 bytes")
}

// TestMissingAuthAndVerification: a client started with no way to verify the
// server and no credentials lists every problem in one error.
func TestMissingAuthAndVerification(t *testing.T) {
	checkLeaks(t)
	r := run(t, nil, bins.client)
	assert.Equal(t, 1, r.code)
	for _, w := range []string{
		"--server-endpoint is required",
		"--token-source is required",
		"server verification is required: set --server-fingerprint or --ca-file (or --insecure-skip-verify explicitly)",
		"client authentication is required: set --secret-file or --cert-file/--key-file (or --insecure-no-auth explicitly)",
	} {
		assert.Contains(t, r.stderr, w)
	}
	r = run(t, nil, bins.client, "--server-endpoint", "127.0.0.1:7500", "--token-source", "tcp:127.0.0.1:22",
		"--server-fingerprint", "sha256:1234", "--insecure-skip-verify", "--insecure-no-auth", "--check-config")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "choose one of --server-fingerprint, --ca-file, --insecure-skip-verify")
	assert.Contains(t, r.stderr, `--server-fingerprint "sha256:1234": fingerprint must be sha256:<64 hex digits>`)

	r = run(t, nil, bins.server, "--state-dir", filepath.Join(t.TempDir(), "s"))
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "client authentication is required")
}

// TestVersion: both daemons print their name and the version they were built with.
func TestVersion(t *testing.T) {
	checkLeaks(t)
	for _, bin := range []string{bins.server, bins.client} {
		r := run(t, nil, bin, "version")
		assert.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, "^"+regexp.QuoteMeta(filepath.Base(bin)+" "+testVersion+" (revision ")+`.*, go1\.\d+.*\)\n$`, r.stdout)
	}
}

// TestFingerprint: `fingerprint` creates the state on first use, prints the
// SHA-256 of the certificate in --state-dir, and is stable across calls.
func TestFingerprint(t *testing.T) {
	checkLeaks(t)
	state := filepath.Join(t.TempDir(), "state")
	r := run(t, nil, bins.server, "fingerprint", "--state-dir", state)
	require.Equal(t, 0, r.code, r.stderr)
	fp := strings.TrimSpace(r.stdout)
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, fp)

	pemBytes, err := os.ReadFile(filepath.Join(state, "cert.pem"))
	require.NoError(t, err)
	block, _ := pem.Decode(pemBytes)
	require.NotNil(t, block)
	sum := sha256.Sum256(block.Bytes)
	assert.Equal(t, "sha256:"+hex.EncodeToString(sum[:]), fp)

	again := run(t, nil, bins.server, "fingerprint", "--state-dir", state)
	assert.Equal(t, r.stdout, again.stdout, "the identity persists in --state-dir")
	for _, f := range []string{"key.pem", "cert.pem", "stateless-reset.key", "session-ticket.key", "address-token.key"} {
		fi, err := os.Stat(filepath.Join(state, f))
		if assert.NoError(t, err) {
			assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), f)
		}
	}
	other := run(t, nil, bins.server, "fingerprint", "--state-dir", filepath.Join(t.TempDir(), "other"))
	assert.NotEqual(t, r.stdout, other.stdout, "a new state dir is a new identity")
}

// TestCheckConfigCatchesStartupErrors: --check-config fails for a config the
// daemon cannot start with: a missing or too short secret file, a missing CA,
// the example's placeholder fingerprint, a token that is no endpoint, a
// listener beyond loopback without --listen-non-loopback.
func TestCheckConfigCatchesStartupErrors(t *testing.T) {
	checkLeaks(t)
	short := writeFile(t, "short-secret", "tooshort\n")
	badCA := writeFile(t, "bad-ca.pem", "not a certificate\n")
	state := filepath.Join(t.TempDir(), "state")
	for _, args := range [][]string{
		{bins.server, "--state-dir", state, "--secret-file", short},
		{bins.server, "--state-dir", state, "--client-ca-file", badCA},
		{bins.server, "--state-dir", state, "--secret-file", filepath.Join(t.TempDir(), "missing-secret")},
		{bins.client, "--server-endpoint", "127.0.0.1:7500", "--token-source", "tcp:127.0.0.1:22",
			"--server-fingerprint", "sha256:" + strings.Repeat("0", 64), "--secret-file", newSecretFile(t)},
		{bins.client, "--server-endpoint", "127.0.0.1:7500", "--token-source", "tcp:bad",
			"--server-fingerprint", "sha256:" + strings.Repeat("1", 64), "--secret-file", newSecretFile(t)},
		{bins.client, "--server-endpoint", "127.0.0.1:7500", "--token-source", "tcp:127.0.0.1:22", "--listen-on", "tcp:0.0.0.0:6500",
			"--server-fingerprint", "sha256:" + strings.Repeat("1", 64), "--secret-file", newSecretFile(t)},
		{bins.client, "--server-endpoint", "127.0.0.1:7500", "--token-source", "tcp:127.0.0.1:22",
			"--server-fingerprint", "sha256:" + strings.Repeat("0", 64), "--secret-file", short},
	} {
		r := run(t, nil, args[0], append(args[1:], "--check-config")...)
		assert.NotEqual(t, 0, r.code, "%v --check-config: %s", args[1:], r.stdout)
	}
	// The control: the same client config with real values passes.
	r := run(t, nil, bins.client, "--server-endpoint", "127.0.0.1:7500", "--token-source", "tcp:127.0.0.1:22",
		"--server-fingerprint", "sha256:"+strings.Repeat("1", 64), "--secret-file", newSecretFile(t), "--check-config")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "config OK\n", r.stdout)
}
