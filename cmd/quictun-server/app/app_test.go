package app

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quictun/quictun/internal/testutil"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/pkg/config"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/version"
	"github.com/quictun/quictun/server"
)

func validOptions() *Options {
	o := NewOptions()
	o.SecretFile = "/etc/quictun/secret"
	return o
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		mutate  func(*Options)
		wantErr []string // substrings; empty means valid
	}{
		{"defaults with a secret", func(*Options) {}, nil},
		{"client CA instead of secret", func(o *Options) { o.SecretFile, o.ClientCAFile = "", "/ca.pem" }, nil},
		{"secret and client CA", func(o *Options) { o.ClientCAFile = "/ca.pem" }, nil},
		{"explicit no auth", func(o *Options) { o.SecretFile, o.InsecureNoAuth = "", true }, nil},
		{"cert and key without state dir", func(o *Options) { o.CertFile, o.KeyFile, o.StateDir = "/c", "/k", "" }, []string{"--state-dir is required"}},
		{"keepalive disabled", func(o *Options) { o.KeepAlivePeriod = 0 }, nil},
		{"drain 0", func(o *Options) { o.DrainTimeout = 0 }, nil},
		{"tail probes 0 and 4", func(o *Options) { o.TailProbes = 4 }, nil},
		{"empty allow list denies all", func(o *Options) { o.Allow = nil }, nil},
		{"replica ID", func(o *Options) { o.Server.ReplicaID = "quictun-server-7d9f8b6c5-x2k4q" }, nil},
		{"replica ID with a space", func(o *Options) { o.Server.ReplicaID = "replica a" }, []string{"--replica-id must be at most 253 bytes without spaces"}},
		{"replica ID too long", func(o *Options) { o.Server.ReplicaID = strings.Repeat("a", 254) }, []string{"--replica-id must be at most 253 bytes"}},

		{"metrics identities", func(o *Options) { o.MetricsIdentities = []string{"key=alice", "CN=bob", "CN=c,key=d", "anonymous"} }, nil},
		{"bad metrics identity", func(o *Options) { o.MetricsIdentities = []string{"alice"} }, []string{`--metrics-identity "alice": an identity is key=NAME`}},
		{"too many metrics identities", func(o *Options) {
			for i := range maxMetricsIdentities + 1 {
				o.MetricsIdentities = append(o.MetricsIdentities, fmt.Sprintf("key=u%d", i))
			}
		}, []string{"--metrics-identity names 257 identities, at most 256"}},
		{"usage save interval too short", func(o *Options) { o.UsageSaveInterval = 100 * time.Millisecond }, []string{"--usage-save-interval must be between 1s and 1h"}},
		{"fixed rate", func(o *Options) { o.Congestion, o.Rate = "fixed", "50Mbit" }, nil},
		{"fixed without a rate", func(o *Options) { o.Congestion = "fixed" }, []string{"--congestion fixed needs --rate"}},
		{"fixed with a bad rate", func(o *Options) { o.Congestion, o.Rate = "fixed", "fast" }, []string{`--rate "fast": rate "fast": a number and a unit`}},
		{"fixed with rate 0", func(o *Options) { o.Congestion, o.Rate = "fixed", "0" }, []string{`--rate "0": must be above 0`}},
		{"a rate without fixed", func(o *Options) { o.Rate = "50Mbit" }, []string{"--rate 50Mbit: only --congestion fixed sends at a set rate"}},
		{"rate limits", func(o *Options) {
			o.RateLimits, o.DefaultRateLimit = []string{"key=alice=20Mbit/5Mbit", "CN=bob=1MiB", "anonymous=0/100kbit"}, "50Mbit"
		}, nil},
		{"bad rate limits", func(o *Options) {
			o.RateLimits, o.DefaultRateLimit = []string{"alice=20Mbit", "key=a=20", "key=b=1Mbit", "key=b=2Mbit", "key=c=4bit"}, "fast"
		}, []string{`--rate-limit "alice=20Mbit": an identity is`, `--rate-limit "key=a=20": rate "20": a number and a unit`,
			`"key=b=2Mbit": key=b has a cap already`, `"key=c=4bit": rate "4bit": at least 8kbit`, `--default-rate-limit: rate "fast"`}},
		{"rate limits with reno", func(o *Options) { o.RateLimits, o.Congestion = []string{"key=a=1Mbit"}, "reno" }, []string{"use --congestion bbr or cubic"}},
		{"link rate", func(o *Options) { o.LinkRate = "900Mbit/90Mbit" }, nil},
		{"bad link rate", func(o *Options) { o.LinkRate = "fast" }, []string{`--link-rate: rate "fast": a number and a unit`}},
		{"link rate with reno", func(o *Options) { o.LinkRate, o.Congestion = "90Mbit", "reno" }, []string{"use --congestion bbr or cubic"}},
		{"quotas", func(o *Options) {
			o.Quotas, o.DefaultQuota = []string{"key=alice=100GiB/30d", "CN=bob=1TB/7d"}, "10GiB/1d"
		}, nil},
		{"bad quotas", func(o *Options) {
			o.Quotas, o.DefaultQuota = []string{"alice=1GiB/1d", "key=a=1GiB", "key=b=1GiB/1d", "key=b=2GiB/1d"}, "lots"
		}, []string{`--quota "alice=1GiB/1d": an identity is`, `--quota "key=a=1GiB": quota "1GiB": want BYTES/WINDOW`,
			`"key=b=2GiB/1d": key=b has a quota already`, `--default-quota: quota "lots"`}},
		{"usage report", func(o *Options) { o.UsageReportURL, o.UsageReportTokenFile = "https://billing.example/usage", "/t" }, nil},
		{"usage report to a local agent", func(o *Options) { o.UsageReportURL = "http://127.0.0.1:9000/usage" }, nil},
		{"usage report in clear", func(o *Options) { o.UsageReportURL = "http://billing.example/usage" }, []string{"use https (http only to a loopback address)"}},
		{"usage report token without URL", func(o *Options) { o.UsageReportTokenFile = "/t" }, []string{"--usage-report-token-file needs --usage-report-url"}},
		{"auth hook", func(o *Options) { o.AuthHook = "https://auth.example/keys" }, nil},
		{"auth hook in clear", func(o *Options) { o.AuthHook = "http://auth.example/keys" }, []string{"--auth-hook \"http://auth.example/keys\": use https"}},
		{"auth hook for client certificates only", func(o *Options) {
			o.AuthHook, o.SecretFile, o.ClientCAFile = "https://auth.example/keys", "", "/ca.pem"
		}, nil},
		{"auth hook without shared secrets or certificates", func(o *Options) {
			o.AuthHook, o.SecretFile, o.ClientCAFile, o.AuthHookCertificates = "https://auth.example/keys", "", "/ca.pem", false
		}, []string{"--auth-hook answers the secrets of key IDs and about client certificates: it needs shared-secret authentication"}},
		{"auth hook certificates off without hook", func(o *Options) { o.AuthHookCertificates = false },
			[]string{"--auth-hook-certificates=false needs --auth-hook"}},
		{"auth hook bounds", func(o *Options) { o.AuthHook, o.AuthHookMaxInFlight = "https://auth.example/keys", 0 }, []string{"--auth-hook-max-in-flight at least 1"}},
		{"no listen address", func(o *Options) { o.ListenOn = "" }, []string{"--listen-on is required"}},
		{"bad allow rule", func(o *Options) { o.Allow = []string{"bogus"} }, []string{"--allow"}},
		{"bad deny rule", func(o *Options) { o.Deny = []string{"tcp:10.0.0.1/8:*"} }, []string{`--allow/--deny: invalid rule: deny rule 0 "tcp:10.0.0.1/8:*": prefix 10.0.0.1/8 has host bits set`}},
		{"unknown token parser", func(o *Options) { o.TokenParserPlugin = "Nope" }, []string{"--token-parser-plugin"}},
		{"cert without key", func(o *Options) { o.CertFile = "/c" }, []string{"--cert-file and --key-file go together"}},
		{"key without cert", func(o *Options) { o.KeyFile = "/k" }, []string{"--cert-file and --key-file go together"}},
		{"no state dir", func(o *Options) { o.StateDir = "" }, []string{"--state-dir is required"}},
		{"no auth", func(o *Options) { o.SecretFile = "" }, []string{"client authentication is required"}},
		{"no auth contradiction", func(o *Options) { o.InsecureNoAuth = true }, []string{"--insecure-no-auth contradicts"}},
		{"no auth contradiction CA", func(o *Options) { o.SecretFile, o.ClientCAFile, o.InsecureNoAuth = "", "/ca", true }, []string{"--insecure-no-auth contradicts"}},
		{"idle timeout 0", func(o *Options) { o.IdleTimeout = 0 }, []string{"--idle-timeout must be positive"}},
		{"handshake timeout negative", func(o *Options) { o.HandshakeTimeout = -time.Second }, []string{"--handshake-timeout must be positive"}},
		{"header timeout 0", func(o *Options) { o.Server.HeaderTimeout = 0 }, []string{"--header-timeout must be positive"}},
		{"remote listen rules", func(o *Options) {
			o.AllowRemoteListen = []string{"tcp:0.0.0.0:8022", "key=laptop=tcp:0.0.0.0:9000-9100"}
		}, nil},
		{"bad remote listen rule", func(o *Options) { o.AllowRemoteListen = []string{"tcp:0.0.0.0:port"} }, []string{"--allow-remote-listen"}},
		{"bad remote listen identity", func(o *Options) { o.AllowRemoteListen = []string{"key=laptop="} }, []string{"--allow-remote-listen"}},
		{"dial timeout 0", func(o *Options) { o.Server.DialTimeout = 0 }, []string{"--dial-timeout must be positive"}},
		{"negative keepalive", func(o *Options) { o.KeepAlivePeriod = -1 }, []string{"--keepalive-period and --drain-timeout must not be negative"}},
		{"negative drain", func(o *Options) { o.DrainTimeout = -1 }, []string{"must not be negative"}},
		{"keepalive not below idle", func(o *Options) { o.KeepAlivePeriod = o.IdleTimeout }, []string{"--keepalive-period (1m30s) must be shorter than --idle-timeout (1m30s)"}},
		{"no streams", func(o *Options) { o.MaxStreamsPerConn = 0 }, []string{"--max-streams-per-conn"}},
		{"tail probes 5", func(o *Options) { o.TailProbes = 5 }, []string{"--tail-probes must be 0..4"}},
		{"tail probes negative", func(o *Options) { o.TailProbes = -1 }, []string{"--tail-probes must be 0..4"}},
		{"resume window", func(o *Options) { o.ResumeWindow = 10 * time.Minute }, nil},
		{"resume window negative", func(o *Options) { o.ResumeWindow = -time.Second }, []string{"--resume-window must be 0 (off) .. 24h0m0s"}},
		{"resume window over a day", func(o *Options) { o.ResumeWindow = 25 * time.Hour }, []string{"--resume-window must be 0 (off) .. 24h0m0s"}},
		{"resume buffer 0", func(o *Options) { o.ResumeBufferMiB = 0 }, []string{"--resume-buffer-mib must be 1..1048576"}},
		{"no dials", func(o *Options) { o.Server.MaxConcurrentDials = 0 }, []string{"--max-concurrent-dials"}},
		{"per-destination dials default", func(o *Options) { o.Server.MaxDialsPerDestination = 0 }, nil},
		{"per-destination dials set", func(o *Options) { o.Server.MaxDialsPerDestination = 4 }, nil},
		{"per-destination dials negative", func(o *Options) { o.Server.MaxDialsPerDestination = -1 }, []string{"--max-dials-per-destination must not be negative"}},
		{"per-source limits off", func(o *Options) { o.Server.HandshakesPerSecond, o.Server.MaxConnsPerSource = 0, 0 }, nil},
		{"negative handshake rate", func(o *Options) { o.Server.HandshakesPerSecond = -0.5 }, []string{"--handshake-rate and --max-conns-per-source must not be negative"}},
		{"negative conns per source", func(o *Options) { o.Server.MaxConnsPerSource = -1 }, []string{"--handshake-rate and --max-conns-per-source must not be negative"}},
		{"no connections", func(o *Options) { o.Server.MaxConnections = 0 }, []string{"--max-connections"}},
		{"no TCP handshakes", func(o *Options) { o.Server.MaxTCPHandshakes = 0 }, []string{"--max-tcp-handshakes must be at least 1"}},
		{"TCP handshakes set", func(o *Options) { o.Server.MaxTCPHandshakes = 1024 }, nil},
		{"no unverified streams per conn", func(o *Options) { o.Server.MaxUnverifiedStreamsPerConn = 0 }, []string{"--max-unverified-streams-per-conn"}},
		{"no unverified streams", func(o *Options) { o.Server.MaxUnverifiedStreams = -1 }, []string{"--max-unverified-streams and"}},
		{"unverified streams per source set", func(o *Options) { o.Server.MaxUnverifiedStreamsPerSource = 64 }, nil},
		{"unverified streams per source negative", func(o *Options) { o.Server.MaxUnverifiedStreamsPerSource = -1 },
			[]string{"--max-unverified-streams-per-source must not be negative"}},
		{"unverified streams per source over the budget", func(o *Options) { o.Server.MaxUnverifiedStreamsPerSource = 2000 },
			[]string{"--max-unverified-streams-per-source (2000) must be between --max-unverified-streams-per-conn (16) and --max-unverified-streams (1024)"}},
		{"unverified streams per source under one connection's", func(o *Options) { o.Server.MaxUnverifiedStreamsPerSource = 8 },
			[]string{"--max-unverified-streams-per-source (8) must be between"}},
		{"no replay entries per conn", func(o *Options) { o.Server.MaxReplayEntriesPerConn = 0 }, []string{"--max-replay-entries-per-conn must be at least 1"}},
		{"auth timeout 0", func(o *Options) { o.Server.AuthTimeout = 0 }, []string{"--auth-timeout and --idle-auth-timeout must be positive"}},
		{"idle auth timeout 0", func(o *Options) { o.Server.IdleAuthTimeout = 0 }, []string{"--auth-timeout and --idle-auth-timeout must be positive"}},
		{"udp flow limits", func(o *Options) { o.Server.MaxUDPFlowsPerConn = 0; o.UDPIdleTimeout = -1 },
			[]string{"--max-udp-flows and --max-udp-flows-per-conn must be at least 1", "--udp-idle-timeout must be positive"}},
		{"udp flows per identity set", func(o *Options) { o.Server.MaxUDPFlowsPerIdentity = 512 }, nil},
		{"udp flows per identity negative", func(o *Options) { o.Server.MaxUDPFlowsPerIdentity = -1 },
			[]string{"--max-udp-flows-per-identity must not be negative"}},
		{"udp flows per identity over the server's", func(o *Options) { o.Server.MaxUDPFlowsPerIdentity = 2000 },
			[]string{"--max-udp-flows-per-identity (2000) must be between --max-udp-flows-per-conn (256) and --max-udp-flows (1024)"}},
		{"udp flows per identity under one connection's", func(o *Options) { o.Server.MaxUDPFlowsPerIdentity = 100 },
			[]string{"--max-udp-flows-per-identity (100) must be between"}},
		{"remote listeners set", func(o *Options) {
			o.Server.MaxRemoteListens, o.Server.MaxRemoteListensPerConn, o.Server.MaxRemoteListensPerIdentity = 1024, 8, 64
		}, nil},
		{"remote listeners per identity default", func(o *Options) { o.Server.MaxRemoteListensPerIdentity = 0 }, nil},
		{"remote listeners per identity equal to the total", func(o *Options) { o.Server.MaxRemoteListensPerIdentity = 256 }, nil},
		{"no remote listeners", func(o *Options) { o.Server.MaxRemoteListens = 0 },
			[]string{"--max-remote-listeners and --max-remote-listeners-per-conn must be at least 1"}},
		{"no remote listeners per conn", func(o *Options) { o.Server.MaxRemoteListensPerConn = -1 },
			[]string{"--max-remote-listeners and --max-remote-listeners-per-conn must be at least 1"}},
		{"remote listeners per identity negative", func(o *Options) { o.Server.MaxRemoteListensPerIdentity = -1 },
			[]string{"--max-remote-listeners-per-identity must not be negative"}},
		{"remote listeners per identity over the server's", func(o *Options) { o.Server.MaxRemoteListensPerIdentity = 300 },
			[]string{"--max-remote-listeners-per-identity (300) must be between --max-remote-listeners-per-conn (16) and --max-remote-listeners (256)"}},
		{"remote listeners per identity under one connection's", func(o *Options) { o.Server.MaxRemoteListensPerIdentity = 8 },
			[]string{"--max-remote-listeners-per-identity (8) must be between"}},
		{"udp rules", func(o *Options) { o.Allow = []string{"dns=udp:10.0.0.53:53"}; o.Deny = []string{"udp:10.9.0.0/16:*"} }, nil},
		{"admin listener beyond loopback needs a token", func(o *Options) { o.HTTPDListenOn = "0.0.0.0:8086" }, []string{"--httpd-token-file"}},
		{"every error at once", func(o *Options) {
			*o = Options{Allow: []string{"bogus"}, TokenParserPlugin: "Nope", CertFile: "/c", DaemonFlags: cli.DaemonFlags{KeepAlivePeriod: -1}}
		}, []string{
			"--listen-on", "--allow", "--token-parser-plugin", "--cert-file and --key-file",
			"client authentication is required", "--idle-timeout", "--handshake-timeout", "--header-timeout",
			"--dial-timeout", "must not be negative", "--max-streams-per-conn", "--max-concurrent-dials",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := validOptions()
			tc.mutate(o)
			err := o.Validate()
			testutil.RequireErrorContains(t, err, tc.wantErr)
			if len(tc.wantErr) > 1 {
				assert.GreaterOrEqual(t, strings.Count(err.Error(), "\n")+1, len(tc.wantErr), "one line per problem")
			}
		})
	}
}

func TestNewOptionsDefaults(t *testing.T) {
	t.Parallel()
	o := NewOptions()
	q := transport.DefaultQUICOptions()
	assert.Equal(t, q.IdleTimeout, o.IdleTimeout)
	assert.Equal(t, q.MaxIncomingStreams, o.MaxStreamsPerConn)
	assert.Equal(t, "127.0.0.1:8086", o.HTTPDListenOn, "admin API on loopback by default")
	assert.NotEmpty(t, o.Allow, "loopback-only allow list by default")
	assert.False(t, o.InsecureNoAuth)
	assert.False(t, o.EnablePprof)
	def := server.DefaultConfig()
	assert.Equal(t, def.MaxConnections, o.Server.MaxConnections)
	assert.Equal(t, def.AuthTimeout, o.Server.AuthTimeout)
	assert.Equal(t, def.IdleAuthTimeout, o.Server.IdleAuthTimeout)
	assert.Equal(t, def.MaxUnverifiedStreamsPerConn, o.Server.MaxUnverifiedStreamsPerConn)
	assert.Equal(t, def.MaxUnverifiedStreams, o.Server.MaxUnverifiedStreams)
	assert.Equal(t, 16384, o.Server.MaxReplayEntriesPerConn)
	err := o.Validate()
	require.Error(t, err, "defaults alone need an auth choice")
	assert.Contains(t, err.Error(), "client authentication is required")
}

// execute runs a fresh quictun-server command in-process.
func execute(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return testutil.Execute(t, NewCommand(), args...)
}

// clearEnv unsets every QUICTUN_* variable for the test (restored afterwards).
func clearEnv(t *testing.T) { t.Helper(); testutil.ClearEnv(t, cli.EnvPrefix) }

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	return testutil.WriteFile(t, name, content)
}

func effective(t *testing.T, args ...string) map[string]any {
	t.Helper()
	out, err := execute(t, append(args, "--write-config")...)
	require.NoError(t, err)
	m := map[string]any{}
	require.NoError(t, yaml.Unmarshal([]byte(out), &m), out)
	return m
}

func TestCommandWriteAndCheckConfigRoundTrip(t *testing.T) {
	clearEnv(t)
	secret := writeFile(t, "secret", "0123456789abcdef0123\n")
	args := []string{
		"--listen-on", "127.0.0.1:7601", "--secret-file", secret,
		"--allow", "ssh=tcp:127.0.0.1:22,tcp:10.0.0.0/8:5432", "--idle-timeout", "45s",
		"--max-concurrent-dials", "9", "--disable-0rtt",
	}
	first, err := execute(t, append(args, "--write-config")...)
	require.NoError(t, err)
	m := map[string]any{}
	require.NoError(t, yaml.Unmarshal([]byte(first), &m))
	assert.Equal(t, "127.0.0.1:7601", m["listen-on"])
	assert.Equal(t, "45s", m["idle-timeout"])
	assert.Equal(t, 9, m["max-concurrent-dials"])
	assert.Equal(t, true, m["disable-0rtt"])
	assert.Len(t, m["allow"], 2)
	for _, k := range []string{"config", "write-config", "check-config", "help"} {
		assert.NotContains(t, m, k)
	}

	file := writeFile(t, "server.yaml", first)
	second, err := execute(t, "--config", file, "--write-config")
	require.NoError(t, err)
	assert.Equal(t, first, second, "the written config loads back to the same config")

	out, err := execute(t, "--config", file, "--check-config")
	require.NoError(t, err)
	assert.Equal(t, "config OK\n", out)

	// The defaults alone are not a valid server config.
	_, err = execute(t, "--check-config")
	require.ErrorIs(t, err, cli.ErrUsage)
	assert.Contains(t, err.Error(), "--secret-file")
}

// TestCommandPrecedence is one smoke case on the server's own flags (the
// precedence table runs once, in cli's TestPrecedence): the file, the
// environment and the command line each set something, in one start.
func TestCommandPrecedence(t *testing.T) {
	clearEnv(t)
	file := writeFile(t, "c.yaml", "listen-on: 127.0.0.1:1\nsecret-file: /s\ndial-timeout: 3s\nheader-timeout: 4s\n")
	t.Setenv("QUICTUN_LISTEN_ON", "127.0.0.1:2")
	t.Setenv("QUICTUN_ALLOW", "tcp:127.0.0.1:22,tcp:127.0.0.1:80")
	t.Setenv("QUICTUN_HEADER_TIMEOUT", "2s")
	m := effective(t, "--config", file, "--listen-on", "127.0.0.1:3")
	assert.Equal(t, "127.0.0.1:3", m["listen-on"], "flag over env over file")
	assert.Equal(t, "2s", m["header-timeout"], "env over file")
	assert.Equal(t, "3s", m["dial-timeout"], "file over default")
	assert.Equal(t, "/s", m["secret-file"])
	assert.Equal(t, []any{"tcp:127.0.0.1:22", "tcp:127.0.0.1:80"}, m["allow"])
}

func TestCommandUnknownKey(t *testing.T) {
	clearEnv(t)
	file := writeFile(t, "typo.yaml", "secret-file: /s\nlisten-on: 127.0.0.1:1\nlisten-onn: 127.0.0.1:2\n")
	_, err := execute(t, "--config", file, "--check-config")
	require.ErrorIs(t, err, cli.ErrUsage)
	require.ErrorIs(t, err, config.ErrUnknownKey)
	assert.Contains(t, err.Error(), file+":3")
	assert.Contains(t, err.Error(), `"listen-onn"`)
}

func TestCommandVersionAndFingerprint(t *testing.T) {
	clearEnv(t)
	out, err := execute(t, "version")
	require.NoError(t, err)
	assert.Equal(t, "quictun-server "+version.String()+"\n", out)

	dir := filepath.Join(t.TempDir(), "state")
	out, err = execute(t, "fingerprint", "--state-dir", dir)
	require.NoError(t, err)
	st, err := transport.LoadOrCreateState(dir, "", "")
	require.NoError(t, err)
	assert.False(t, st.Generated, "the fingerprint command created the state")
	assert.Equal(t, st.Fingerprint()+"\n", out)
	_, err = transport.ParseFingerprint(strings.TrimSpace(out))
	require.NoError(t, err)

	_, err = execute(t, "unexpected-arg")
	require.Error(t, err)

	out, err = execute(t, "--help")
	require.NoError(t, err)
	for _, g := range flagGroups {
		assert.Contains(t, out, g.Title+":")
	}
	assert.NotContains(t, out, "\nOther:", "every flag is in a group")
}

func TestValidateListenAddress(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"garbage", "0.0.0.0", "0.0.0.0:http-alt", "0.0.0.0:70000"} {
		o := validOptions()
		o.ListenOn = addr
		err := o.Validate()
		require.Error(t, err, addr)
		assert.Contains(t, err.Error(), "--listen-on", addr)
	}
}

func TestValidateCertFileWithoutStateDir(t *testing.T) {
	t.Parallel()
	src := filepath.Join(t.TempDir(), "src")
	_, err := transport.LoadOrCreateState(src, "", "")
	require.NoError(t, err)
	o := validOptions()
	o.StateDir = ""
	o.CertFile = filepath.Join(src, transport.CertFileName)
	o.KeyFile = filepath.Join(src, transport.KeyFileName)
	if o.Validate() == nil {
		_, err := transport.LoadOrCreateState(o.StateDir, o.CertFile, o.KeyFile)
		require.NoError(t, err, "Validate accepted a config that Run cannot start with")
	}
}

func TestFingerprintUsesConfigFile(t *testing.T) {
	clearEnv(t)
	dir := filepath.Join(t.TempDir(), "state")
	st, err := transport.LoadOrCreateState(dir, "", "")
	require.NoError(t, err)
	file := writeFile(t, "server.yaml", "state-dir: "+dir+"\nsecret-file: /s\n")
	out, err := execute(t, "fingerprint", "--config", file)
	require.NoError(t, err)
	assert.Equal(t, st.Fingerprint()+"\n", out)
}

func TestFingerprintAcceptsWrittenConfig(t *testing.T) {
	clearEnv(t)
	dir := filepath.Join(t.TempDir(), "state")
	secret := writeFile(t, "secret", strings.Repeat("s", 32))
	// The documented way to make a config file: --write-config. It includes
	// every flag of the daemon, the logging flags (v, vmodule) too.
	written, err := execute(t, "--state-dir", dir, "--secret-file", secret, "--write-config")
	require.NoError(t, err)
	require.Contains(t, written, "\nv: ")
	file := writeFile(t, "server.yaml", written)

	out, err := execute(t, "fingerprint", "--config", file)
	require.NoError(t, err, "fingerprint must accept the daemon's own config file")
	st, err := transport.LoadOrCreateState(dir, "", "")
	require.NoError(t, err)
	assert.Equal(t, st.Fingerprint()+"\n", out)

	// The environment overrides the file, as for the daemon.
	other := filepath.Join(t.TempDir(), "other")
	ost, err := transport.LoadOrCreateState(other, "", "")
	require.NoError(t, err)
	t.Setenv("QUICTUN_STATE_DIR", other)
	out, err = execute(t, "fingerprint", "--config", file)
	require.NoError(t, err)
	assert.Equal(t, ost.Fingerprint()+"\n", out)
}
