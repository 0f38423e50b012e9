package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quictun/quictun/internal/testutil"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/pkg/config"
	"github.com/quictun/quictun/pkg/version"
)

const (
	testFingerprint  = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	otherFingerprint = "sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
)

func validOptions() *Options {
	o := NewOptions()
	o.ServerEndpoint = []string{"server.example.com:7500"}
	o.TokenSource = "tcp:127.0.0.1:22"
	o.ServerFingerprint = []string{testFingerprint}
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
		{"required fields set", func(*Options) {}, nil},
		{"CA instead of fingerprint", func(o *Options) { o.ServerFingerprint, o.CAFile = nil, "/ca.pem" }, nil},
		{"explicit insecure", func(o *Options) { o.ServerFingerprint, o.InsecureSkipVerify = nil, true }, nil},
		{"mTLS instead of secret", func(o *Options) { o.SecretFile, o.CertFile, o.KeyFile = "", "/c", "/k" }, nil},
		{"explicit no auth", func(o *Options) { o.SecretFile, o.InsecureNoAuth = "", true }, nil},
		{"IPv6 endpoint", func(o *Options) { o.ServerEndpoint = []string{"[2001:db8::1]:7500"} }, nil},
		{"several listeners", func(o *Options) { o.ListenOn = []string{"tcp:127.0.0.1:1", "unix:/tmp/a.sock"} }, nil},
		{"heartbeats off, rescue anything", func(o *Options) { o.Client.HeartbeatInterval, o.Client.RescueAfter = 0, 0 }, nil},
		{"rescue exactly twice heartbeat", func(o *Options) { o.Client.HeartbeatInterval, o.Client.RescueAfter = time.Second, 2*time.Second }, nil},
		{"keepalive off", func(o *Options) { o.KeepAlivePeriod = 0 }, nil},
		{"localhost and ::1 listeners", func(o *Options) { o.ListenOn = []string{"tcp:localhost:1", "tcp:[::1]:2"} }, nil},
		{"non-loopback with opt-in", func(o *Options) { o.ListenOn, o.ListenNonLoopback = []string{"tcp:0.0.0.0:6500"}, true }, nil},
		{"base64 fixed token", func(o *Options) { o.TokenSource = "dGNwOjEyNy4wLjAuMToyMg==" }, nil},
		{"file token source not read here", func(o *Options) { o.TokenSourcePlugin, o.TokenSource = "File", "/no/such/file" }, nil},

		{"all addresses without opt-in", func(o *Options) { o.ListenOn = []string{"tcp:127.0.0.1:1", "tcp:0.0.0.0:6500"} },
			[]string{"--listen-on tcp:0.0.0.0:6500 is not loopback", "add --listen-non-loopback"}},
		{"IPv6 any without opt-in", func(o *Options) { o.ListenOn = []string{"tcp:[::]:6500"} }, []string{"add --listen-non-loopback"}},
		{"LAN address without opt-in", func(o *Options) { o.ListenOn = []string{"tcp:192.168.1.5:6500"} }, []string{"add --listen-non-loopback"}},
		{"placeholder fingerprint", func(o *Options) { o.ServerFingerprint = []string{"sha256:" + strings.Repeat("0", 64)} },
			[]string{"all-zero placeholder", "quictun-server fingerprint"}},
		{"fixed token not an endpoint", func(o *Options) { o.TokenSource = "tcp:bad" }, []string{`--token-source: bad token source: fixed token: "tcp:bad" is not tcp:HOST:PORT`}},

		{"no listener", func(o *Options) { o.ListenOn = nil }, []string{"--listen-on needs at least one listener"}},
		{"bad listener", func(o *Options) { o.ListenOn = []string{"tcp:127.0.0.1:1", "udp:1.2.3.4:5"} }, []string{`--listen-on "udp:1.2.3.4:5"`}},
		{"no server endpoint", func(o *Options) { o.ServerEndpoint = nil }, []string{"--server-endpoint is required"}},
		{"endpoint without port", func(o *Options) { o.ServerEndpoint = []string{"server.example.com"} }, []string{`--server-endpoint "server.example.com"`}},
		{"no token source", func(o *Options) { o.TokenSource = "" }, []string{"--token-source is required"}},
		{"no verification", func(o *Options) { o.ServerFingerprint = nil }, []string{"server verification is required"}},
		{"two verifications", func(o *Options) { o.CAFile = "/ca.pem" }, []string{"choose one of"}},
		{"three verifications", func(o *Options) { o.CAFile, o.InsecureSkipVerify = "/ca.pem", true }, []string{"choose one of"}},
		{"bad fingerprint", func(o *Options) { o.ServerFingerprint = []string{"sha256:abcd"} }, []string{"--server-fingerprint", "64 hex digits"}},
		{"pins per server", func(o *Options) {
			o.ServerEndpoint = []string{"a.example:7500", "b.example:7500"}
			o.ServerFingerprint = []string{"a.example:7500=" + testFingerprint, "b.example:7500=" + otherFingerprint}
		}, nil},
		{"own pin beside the shared one", func(o *Options) {
			o.ServerEndpoint = []string{"a.example:7500", "b.example:7500"}
			o.ServerFingerprint = []string{testFingerprint, "b.example:7500=" + otherFingerprint}
		}, nil},
		{"pin for an endpoint not listed", func(o *Options) {
			o.ServerFingerprint = []string{testFingerprint, "other.example.com:7500=" + otherFingerprint}
		}, []string{"names other.example.com:7500, which is not a --server-endpoint (server.example.com:7500)", "write the endpoint exactly as in --server-endpoint"}},
		{"a server without a pin", func(o *Options) {
			o.ServerEndpoint = []string{"a.example:7500", "b.example:7500"}
			o.ServerFingerprint = []string{"a.example:7500=" + testFingerprint}
		}, []string{"--server-endpoint b.example:7500 has no pin: add --server-fingerprint b.example:7500=sha256:HEX"}},
		{"pin per server with a colon", func(o *Options) { o.ServerFingerprint = []string{"server.example.com:7500:" + testFingerprint} },
			[]string{"HOST:PORT=sha256:HEX"}},
		{"forwards alone, no token source", func(o *Options) {
			o.TokenSource, o.Forward = "", []string{"tcp:127.0.0.1:2222=tcp:127.0.0.1:22", "unix:/tmp/q.sock=tcp:10.0.0.5:5432"}
		}, nil},
		{"forward beside the single form", func(o *Options) { o.Forward = []string{"tcp:127.0.0.1:2222=tcp:127.0.0.1:22"} }, nil},
		{"forward without =", func(o *Options) { o.Forward = []string{"tcp:127.0.0.1:2222"} }, []string{"--forward", "LISTEN=DESTINATION"}},
		{"forward to a bad destination", func(o *Options) { o.Forward = []string{"tcp:127.0.0.1:2222=tcp:bad"} }, []string{"--forward tcp:127.0.0.1:2222=tcp:bad: destination: invalid endpoint"}},
		{"forward beyond loopback", func(o *Options) { o.Forward = []string{"tcp:0.0.0.0:2222=tcp:127.0.0.1:22"} },
			[]string{"--forward tcp:0.0.0.0:2222 is not loopback", "--listen-non-loopback"}},
		{"no token source and no forward", func(o *Options) { o.TokenSource = "" }, []string{"--token-source is required", "--forward"}},
		{"udp forward", func(o *Options) { o.Forward = []string{"udp:127.0.0.1:5353=udp:127.0.0.1:53"} }, nil},
		{"udp to tcp forward", func(o *Options) { o.Forward = []string{"udp:127.0.0.1:5353=tcp:127.0.0.1:53"} },
			[]string{"a udp: listener forwards to a udp: destination"}},
		{"tcp to udp forward", func(o *Options) { o.Forward = []string{"tcp:127.0.0.1:5353=udp:127.0.0.1:53"} },
			[]string{"a udp: listener forwards to a udp: destination"}},
		{"udp forward beyond loopback", func(o *Options) { o.Forward = []string{"udp:0.0.0.0:5353=udp:127.0.0.1:53"} },
			[]string{"--forward udp:0.0.0.0:5353 is not loopback"}},
		{"udp listen-on", func(o *Options) { o.ListenOn = []string{"udp:127.0.0.1:5353"} }, []string{"UDP is forwarded with --forward"}},
		{"udp idle timeout", func(o *Options) { o.UDPIdleTimeout = 0 }, []string{"--udp-idle-timeout must be positive"}},
		{"proxies alone", func(o *Options) {
			o.TokenSource, o.Proxy = "", []string{"socks5:127.0.0.1:1080", "http-connect:127.0.0.1:8080"}
		}, nil},
		{"unknown proxy kind", func(o *Options) { o.Proxy = []string{"socks4:127.0.0.1:1080"} }, []string{"--proxy \"socks4:127.0.0.1:1080\": want socks5:HOST:PORT or http-connect:HOST:PORT"}},
		{"proxy beyond loopback", func(o *Options) { o.Proxy = []string{"socks5:0.0.0.0:1080"} }, []string{"--proxy tcp:0.0.0.0:1080 is not loopback"}},
		{"cert without key", func(o *Options) { o.CertFile = "/c" }, []string{"--cert-file and --key-file go together"}},
		{"no auth", func(o *Options) { o.SecretFile = "" }, []string{"client authentication is required"}},
		{"no auth contradiction", func(o *Options) { o.InsecureNoAuth = true }, []string{"--insecure-no-auth contradicts"}},
		{"idle 0", func(o *Options) { o.IdleTimeout = 0 }, []string{"--idle-timeout must be positive"}},
		{"handshake 0", func(o *Options) { o.HandshakeTimeout = 0 }, []string{"--handshake-timeout must be positive"}},
		{"session wait 0", func(o *Options) { o.Client.SessionWait = 0 }, []string{"--session-wait-timeout must be positive"}},
		{"stream open 0", func(o *Options) { o.Client.StreamOpenTimeout = 0 }, []string{"--stream-open-timeout must be positive"}},
		{"reconnect max 0", func(o *Options) { o.ReconnectMax = 0 }, []string{"--reconnect-max-delay must be positive"}},
		{"negative drain", func(o *Options) { o.DrainTimeout = -time.Second }, []string{"must not be negative"}},
		{"keepalive above idle", func(o *Options) { o.KeepAlivePeriod = 2 * o.IdleTimeout }, []string{"--keepalive-period (3m0s) must be shorter"}},
		{"negative heartbeat", func(o *Options) { o.Client.HeartbeatInterval = -1 }, []string{"--heartbeat-interval must not be negative"}},
		{"remote forward", func(o *Options) {
			o.RemoteForward = []string{"tcp:0.0.0.0:8022=tcp:127.0.0.1:22", "udp:0.0.0.0:5353=udp:127.0.0.1:53"}
		}, nil},
		{"remote forward without destination", func(o *Options) { o.RemoteForward = []string{"tcp:0.0.0.0:8022"} }, []string{"--remote-forward \"tcp:0.0.0.0:8022\": want LISTEN=DESTINATION"}},
		{"remote forward udp to tcp", func(o *Options) { o.RemoteForward = []string{"udp:0.0.0.0:53=tcp:127.0.0.1:53"} }, []string{"a udp: listener forwards to a udp: destination"}},
		{"remote forward bad destination", func(o *Options) { o.RemoteForward = []string{"tcp:0.0.0.0:8022=tcp:nohost"} }, []string{"--remote-forward tcp:0.0.0.0:8022=tcp:nohost: destination"}},
		{"tail probes 5", func(o *Options) { o.TailProbes = 5 }, []string{"--tail-probes must be 0..4"}},
		{"resume window", func(o *Options) { o.ResumeWindow = 10 * time.Minute }, nil},
		{"resume window negative", func(o *Options) { o.ResumeWindow = -time.Second }, []string{"--resume-window must be 0 (off) .. 24h0m0s"}},
		{"resume window over a day", func(o *Options) { o.ResumeWindow = 25 * time.Hour }, []string{"--resume-window must be 0 (off) .. 24h0m0s"}},
		{"resume buffer 0", func(o *Options) { o.ResumeBufferMiB = 0 }, []string{"--resume-buffer-mib must be 1..1048576"}},
		{"rescue too soon", func(o *Options) {
			o.Client.HeartbeatInterval, o.Client.RescueAfter = time.Second, 1999*time.Millisecond
		}, []string{"--rescue-after (1.999s) must be at least twice --heartbeat-interval (1s)"}},
		{"no connections", func(o *Options) { o.Client.MaxConnections = 0 }, []string{"--max-connections must be at least 1"}},
		{"admin listener beyond loopback needs a token", func(o *Options) { o.HTTPDListenOn = "0.0.0.0:8087" }, []string{"--httpd-token-file"}},
		{"every error at once", func(o *Options) {
			*o = Options{ServerFingerprint: []string{"xx"}, CAFile: "/ca", KeyFile: "/k", Client: client.Config{HeartbeatInterval: time.Second}}
		}, []string{
			"--listen-on", "--server-endpoint is required", "--token-source is required", "choose one of",
			`--server-fingerprint "xx"`, "--cert-file and --key-file", "client authentication is required",
			"--idle-timeout", "--handshake-timeout", "--session-wait-timeout", "--stream-open-timeout",
			"--reconnect-max-delay", "--rescue-after", "--max-connections",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := validOptions()
			tc.mutate(o)
			testutil.RequireErrorContains(t, o.Validate(), tc.wantErr)
		})
	}
}

// TestForwardErrorsSpeakOfDestinations: a bad --forward value is explained
// in the --forward form's words, never the legacy "token source" (issue 33).
func TestForwardErrorsSpeakOfDestinations(t *testing.T) {
	for _, f := range []string{"tcp:127.0.0.1:2222=bogus", "tcp:127.0.0.1:2222=tcp:host", "tcp:127.0.0.1:2222=foo:bar:1"} {
		o := validOptions()
		o.Forward = []string{f}
		err := o.Validate()
		require.Error(t, err, f)
		require.Contains(t, err.Error(), "--forward "+f+": destination:")
		require.NotContains(t, err.Error(), "token", f)
	}
}

func TestValidateServerEndpointNeedsPort(t *testing.T) {
	t.Parallel()
	for _, ep := range []string{"server.example.com:", ":7500", "server.example.com:0", "server.example.com:http-alt"} {
		o := validOptions()
		o.ServerEndpoint = []string{ep}
		err := o.Validate()
		require.Error(t, err, ep)
		assert.Contains(t, err.Error(), "--server-endpoint", ep)
	}
}

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
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs(append(args, "--write-config"))
	require.NoError(t, cmd.Execute())
	m := map[string]any{}
	require.NoError(t, yaml.Unmarshal(out.Bytes(), &m), out.String())
	return m
}

var requiredArgs = []string{
	"--server-endpoint", "server.example.com:7500", "--token-source", "tcp:127.0.0.1:22",
	"--server-fingerprint", testFingerprint, "--secret-file", "/etc/quictun/secret",
}

func TestCommandWriteAndCheckConfigRoundTrip(t *testing.T) {
	clearEnv(t)
	secret := writeFile(t, "secret", "0123456789abcdef0123\n")
	args := append([]string{
		"--listen-on", "tcp:127.0.0.1:2222,unix:/tmp/quictun-test.sock", "--heartbeat-interval", "250ms",
		"--rescue-after", "2s", "--max-connections", "12",
	}, requiredArgs...)
	args = append(args, "--secret-file", secret) // --check-config reads it
	first, err := execute(t, append(args, "--write-config")...)
	require.NoError(t, err)
	m := map[string]any{}
	require.NoError(t, yaml.Unmarshal([]byte(first), &m))
	assert.Equal(t, []any{"tcp:127.0.0.1:2222", "unix:/tmp/quictun-test.sock"}, m["listen-on"])
	assert.Equal(t, []any{"server.example.com:7500"}, m["server-endpoint"]) // a list flag since issue 23
	assert.Equal(t, []any{testFingerprint}, m["server-fingerprint"])
	assert.Equal(t, "250ms", m["heartbeat-interval"])
	assert.Equal(t, 12, m["max-connections"])

	file := writeFile(t, "client.yaml", first)
	second, err := execute(t, "--config", file, "--write-config")
	require.NoError(t, err)
	assert.Equal(t, first, second)

	out, err := execute(t, "--config", file, "--check-config")
	require.NoError(t, err)
	assert.Equal(t, "config OK\n", out)

	_, err = execute(t, "--check-config")
	require.ErrorIs(t, err, cli.ErrUsage)
	for _, s := range []string{"--server-endpoint", "--token-source", "server verification", "client authentication"} {
		assert.Contains(t, err.Error(), s, "all problems reported at once")
	}
}

// TestCheckConfigPinsPerServer: pins per server in YAML (a list under
// server-fingerprint, as on the command line); --check-config accepts them,
// and names an entry for an endpoint the file does not list, with the fix.
func TestCheckConfigPinsPerServer(t *testing.T) {
	clearEnv(t)
	secret := writeFile(t, "secret", "0123456789abcdef0123\n")
	good := "server-endpoint: [a.example:7500, b.example:7500]\ntoken-source: tcp:127.0.0.1:22\nsecret-file: " + secret +
		"\nserver-fingerprint:\n  - a.example:7500=" + testFingerprint + "\n  - b.example:7500=" + otherFingerprint + "\n"
	out, err := execute(t, "--config", writeFile(t, "good.yaml", good), "--check-config")
	require.NoError(t, err)
	assert.Equal(t, "config OK\n", out)

	bad := strings.Replace(good, "b.example:7500="+otherFingerprint, "c.example:7500="+otherFingerprint, 1)
	_, err = execute(t, "--config", writeFile(t, "bad.yaml", bad), "--check-config")
	require.ErrorIs(t, err, cli.ErrUsage)
	assert.Contains(t, err.Error(), "--server-fingerprint c.example:7500="+otherFingerprint+" names c.example:7500, which is not a --server-endpoint (a.example:7500,b.example:7500)")
	assert.Contains(t, err.Error(), "--server-endpoint b.example:7500 has no pin", "and the server left without one")
}

// TestCommandPrecedence is one smoke case on the client's own flags (the
// precedence table runs once, in cli's TestPrecedence): the file, the
// environment and the command line each set something, in one start.
func TestCommandPrecedence(t *testing.T) {
	clearEnv(t)
	// The example of STYLE.md: file a, env b, flag c.
	file := writeFile(t, "c.yaml", "server-endpoint: a:7500\ntoken-source: tcp:127.0.0.1:22\nsession-wait-timeout: 3s\nstream-open-timeout: 4s\n")
	t.Setenv("QUICTUN_SERVER_ENDPOINT", "b:7500")
	t.Setenv("QUICTUN_LISTEN_ON", "tcp:127.0.0.1:1,tcp:127.0.0.1:2")
	t.Setenv("QUICTUN_INSECURE_SKIP_VERIFY", "true")
	t.Setenv("QUICTUN_SESSION_WAIT_TIMEOUT", "5s")
	m := effective(t, "--config", file, "--server-endpoint", "c:7500")
	assert.Equal(t, []any{"c:7500"}, m["server-endpoint"], "flag over env over file")
	assert.Equal(t, "5s", m["session-wait-timeout"], "env over file")
	assert.Equal(t, "4s", m["stream-open-timeout"], "file over default")
	assert.Equal(t, "tcp:127.0.0.1:22", m["token-source"])
	assert.Equal(t, true, m["insecure-skip-verify"])
	assert.Equal(t, []any{"tcp:127.0.0.1:1", "tcp:127.0.0.1:2"}, m["listen-on"])
}

func TestCommandUnknownKey(t *testing.T) {
	clearEnv(t)
	file := writeFile(t, "typo.yaml", "server-endpoint: a:7500\n\n# a comment\nsever-endpoint: b:7500\n")
	_, err := execute(t, "--config", file, "--check-config")
	require.ErrorIs(t, err, cli.ErrUsage)
	require.ErrorIs(t, err, config.ErrUnknownKey)
	assert.Contains(t, err.Error(), file+":4")
	assert.Contains(t, err.Error(), `"sever-endpoint"`)
}

func TestCommandVersionAndHelp(t *testing.T) {
	clearEnv(t)
	out, err := execute(t, "version")
	require.NoError(t, err)
	assert.Equal(t, "quictun-client "+version.String()+"\n", out)

	_, err = execute(t, "extra")
	require.Error(t, err)

	out, err = execute(t, "--help")
	require.NoError(t, err)
	for _, g := range flagGroups {
		assert.Contains(t, out, g.Title+":")
	}
	assert.NotContains(t, out, "\nOther:", "every flag is in a group")
}

// lockedBuffer is a bytes.Buffer safe for klog's writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestEffectiveConfigLogRedactsToken(t *testing.T) {
	// Not parallel: klog's output and verbosity are global.
	clearEnv(t)
	buf := &lockedBuffer{}
	klog.LogToStderr(false)
	klog.SetOutput(buf)
	var v klog.Level
	t.Cleanup(func() {
		klog.Flush()
		require.NoError(t, v.Set("0"))
		klog.SetOutput(os.Stderr)
		klog.LogToStderr(true)
	})
	const secretToken = "tcp:10.9.8.7:2222"
	// --ca-file does not exist, so Run fails before any network activity, but
	// only after the effective config was logged. Loopback only: no DNS.
	_, err := execute(t, "-v=1", "--server-endpoint", "127.0.0.1:1", "--token-source", secretToken,
		"--ca-file", filepath.Join(t.TempDir(), "missing-ca.pem"), "--secret-file", "/nonexistent/secret",
		"--httpd-listen-on", "", "--listen-on", "tcp:127.0.0.1:1")
	require.ErrorContains(t, err, "CA file")
	klog.Flush()
	out := buf.String()
	require.Contains(t, out, "Effective configuration", "the config was logged at -v=1 (err: %v)", err)
	assert.NotContains(t, out, secretToken)
}

func TestCheckUsesConfiguredServerEndpoint(t *testing.T) {
	clearEnv(t)
	t.Setenv("QUICTUN_SERVER_ENDPOINT", "127.0.0.1:7500") // loopback: no DNS, no traffic
	out, _ := execute(t, "check")                         // the exit status depends on this host
	assert.Contains(t, out, "path-mtu", "the configured server endpoint is checked")

	clearEnv(t)
	file := writeFile(t, "client.yaml", "server-endpoint: 127.0.0.1:7500\n")
	out, _ = execute(t, "check", "--config", file)
	assert.Contains(t, out, "path-mtu")
}

// TestUnknownEnvironmentVariableWarned: a misspelled QUICTUN_* variable is
// logged at the default verbosity with the likely intended name.
func TestUnknownEnvironmentVariableWarned(t *testing.T) {
	// Not parallel: klog's output and the environment are global.
	clearEnv(t)
	buf := &lockedBuffer{}
	klog.LogToStderr(false)
	klog.SetOutput(buf)
	t.Cleanup(func() {
		klog.Flush()
		klog.SetOutput(os.Stderr)
		klog.LogToStderr(true)
	})
	t.Setenv("QUICTUN_SERVER_ENDPONT", "typo.example:7500")
	t.Setenv("QUICTUN_TOKEN_SOURCE", "tcp:127.0.0.1:22")
	_, err := execute(t, "--check-config", "--server-endpoint", "127.0.0.1:7500", "--server-fingerprint", testFingerprint,
		"--insecure-no-auth")
	require.NoError(t, err)
	klog.Flush()
	out := buf.String()
	assert.Contains(t, out, "Ignored an environment variable that names no flag")
	assert.Contains(t, out, "QUICTUN_SERVER_ENDPONT (did you mean QUICTUN_SERVER_ENDPOINT?)")
	assert.NotContains(t, out, "typo.example", "values are not logged")
	assert.NotContains(t, out, "QUICTUN_TOKEN_SOURCE", "known variables are not warned about")
}

// TestEntriesLog: "Tunnel configured" names only the entry points that are
// configured (it printed forwards="" proxies="" for a plain --listen-on).
func TestEntriesLog(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(*Options)
		want   []any
	}{
		{"listen-on only", func(*Options) {}, []any{"serverEndpoint", "server.example.com:7500", "listeners", "tcp:127.0.0.1:6500"}},
		{"forward alone opens no --listen-on", func(o *Options) {
			o.TokenSource, o.Forward = "", []string{"tcp:127.0.0.1:2222=tcp:127.0.0.1:22"}
		}, []any{"serverEndpoint", "server.example.com:7500", "forwards", "tcp:127.0.0.1:2222=tcp:127.0.0.1:22"}},
		{"all three", func(o *Options) {
			o.Forward, o.Proxy = []string{"udp:127.0.0.1:5353=udp:127.0.0.1:53"}, []string{"socks5:127.0.0.1:1080", "http-connect:127.0.0.1:8080"}
		}, []any{"serverEndpoint", "server.example.com:7500", "listeners", "tcp:127.0.0.1:6500",
			"forwards", "udp:127.0.0.1:5353=udp:127.0.0.1:53", "proxies", "socks5:127.0.0.1:1080,http-connect:127.0.0.1:8080"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := validOptions()
			tc.mutate(o)
			assert.Equal(t, tc.want, o.entriesLog())
		})
	}
}
