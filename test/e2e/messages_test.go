package e2e

import (
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// What a new user sees at the default log level (-v 0), from the built
// binaries: each problem once, with what to do about it.

// defaultLevel makes a daemon log at -v 0, as an operator runs it (the
// harness's -v 4 comes first; the last -v wins).
var defaultLevel = []string{"-v", "0"}

// count returns how many lines of log contain every one of subs.
func count(log string, subs ...string) int {
	n := 0
next:
	for _, line := range strings.Split(log, "\n") {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		n++
	}
	return n
}

// TestRefusedDestinationLoggedAtDefaultLevel: a destination the server
// refuses is only a reset to the application; both ends say at -v 0 why and
// what to change, once however often the application retries, and before
// any application connects: the client checks its fixed destinations with
// the server when it connects (proto.KindCheck), which counts no tunnel but
// a refused destination.
func TestRefusedDestinationLoggedAtDefaultLevel(t *testing.T) {
	checkLeaks(t)
	allowed, other, denied := testutil.EchoServer(t), testutil.EchoServer(t), testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + allowed, "tcp:" + denied}, Args: append([]string{"--deny", "tcp:" + denied}, defaultLevel...)})
	for _, tc := range []struct {
		name, dest string
		server     []string // in the server's line
	}{
		{"no allow rule", other, []string{
			"Refused destination: no --allow rule admits it; if clients should reach it, add allowRule to the server's --allow",
			`reason="not_allowed"`, `allowRule="tcp:` + other + `"`,
		}},
		{"deny rule", denied, []string{"Refused destination: a --deny rule matches it", `reason="denied"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refused := func() (streams, dests float64) {
				m := scrape(t, srv)
				return m.val("quictun_server_streams_total", "result", "refused"),
					m.val("quictun_server_refused_destinations_total", "network", "tcp", "reason", "not_allowed") +
						m.val("quictun_server_refused_destinations_total", "network", "tcp", "reason", "denied")
			}
			streams0, dests0 := refused() // the previous cases'
			cl := startClient(t, srv, clientOpts{Token: "tcp:" + tc.dest, Args: defaultLevel})
			dest := `destination="tcp:` + tc.dest + `"`
			waitFor(t, ioTimeout, "the check's refusal in both logs, before any application", func() bool {
				return count(cl.log(), "Server refuses a destination this client forwards to", dest) == 1 &&
					count(srv.log(), append(tc.server, dest, "check=true")...) == 1
			})
			streams, dests := refused()
			assert.Equal(t, streams0, streams, "a check is no tunnel")
			assert.Equal(t, dests0+1, dests, "but a refused destination in the metrics, once (issue 30 I2)")
			for range 3 {
				err := echoVia(t, cl.Addr, "refused")
				require.Error(t, err)
				assert.True(t, isReset(err), "the application sees a reset: %v", err)
			}
			waitFor(t, ioTimeout, "the refusal in both logs", func() bool {
				return count(srv.log(), append(tc.server, dest)...) > 0 &&
					count(cl.log(), "Server refused the destination", "allow it on the server (its log names the rule to add)", dest) > 0
			})
			waitMetric(t, cl, ioTimeout, eq(3), "quictun_client_streams_total", "result", "refused")
			assert.Equal(t, 1, count(srv.log(), "Refused destination", dest), "once a minute per destination (the check's line): %s", srv.log())
			assert.Equal(t, 1, count(cl.log(), "Server refuses a destination this client forwards to"), cl.log())
			assert.Equal(t, 1, count(cl.log(), "Server refused the destination", dest), "once a minute per destination: %s", cl.log())
			assert.Equal(t, 1, count(srv.log(), "Refused destination", `remoteAddress="127.0.0.1:`, dest), "the server names the client")
		})
	}
}

// TestWrongSecretLoggedAtDefaultLevel: a client with a wrong secret shows in
// the server's default log, with its address and the fix, once however
// often it reconnects; the reason agrees with auth_failures_total.
func TestWrongSecretLoggedAtDefaultLevel(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: defaultLevel})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, SecretFile: newSecretFile(t), NoWait: true,
		Args: append([]string{"--reconnect-max-delay", "200ms"}, defaultLevel...)})
	waitMetric(t, srv, ioTimeout, ge(3), "quictun_server_auth_failures_total", "reason", "unknown_key")
	line := []string{"Refused client: authentication failed; the client's secret is none of the server's", `remoteAddress="127.0.0.1:`, `reason="unknown_key"`}
	assert.Equal(t, 1, count(srv.log(), line...), "once a minute per client address: %s", srv.log())
	assert.Contains(t, cl.log(), "Server rejected our credentials")
}

// TestLostConnectionLoggedAtDefaultLevel: a server restart shows in the
// client's default log: the lost connection and the new one, once each.
func TestLostConnectionLoggedAtDefaultLevel(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: defaultLevel})
	require.NoError(t, echoVia(t, cl.Addr, "before"))
	assert.Equal(t, 1, count(cl.log(), "Connected to server"))

	srv.kill(t)
	startServer(t, serverOpts{StateDir: srv.StateDir, SecretFile: srv.SecretFile, UDPPort: srv.udpPort, AdminPort: srv.adminPort,
		Allow: []string{"tcp:" + echo}})
	waitFor(t, ioTimeout, "the reconnect in the client's log", func() bool { return count(cl.log(), "Reconnected to server") > 0 })
	require.NoError(t, echoVia(t, cl.Addr, "after"))
	assert.Equal(t, 1, count(cl.log(), "Lost connection to server; reconnecting"), cl.log())
	assert.Equal(t, 1, count(cl.log(), "Reconnected to server"), cl.log())
	assert.Equal(t, 1, count(cl.log(), "Connected to server"), cl.log())
}

// TestUsageErrors: mistakes on the command line are plain messages (no log
// prefix) that name what was meant, and say where help is.
func TestUsageErrors(t *testing.T) {
	checkLeaks(t)
	for _, tc := range []struct {
		bin  string
		args []string
		want string
	}{
		{bins.client, []string{"--lisen-on", "tcp:127.0.0.1:1"}, "quictun-client: unknown flag: --lisen-on (did you mean --listen-on?)"},
		{bins.client, []string{"-server-endpoint", "x:1"}, "quictun-client: unknown shorthand flag: 's' in -server-endpoint (did you mean --server-endpoint?)"},
		{bins.server, []string{"--alow", "tcp:127.0.0.1:22"}, "quictun-server: unknown flag: --alow (did you mean --allow?)"},
		{bins.server, []string{"fingerprint", "--stat-dir", "x"}, "quictun-server fingerprint: unknown flag: --stat-dir (did you mean --state-dir?)"},
		{bins.server, []string{"verison"}, `quictun-server: unknown command "verison" (did you mean version?)`},
		{bins.server, []string{"fingerprint", "extra"}, `quictun-server fingerprint: unexpected argument "extra"`},
		{bins.client, []string{"-v", "x"}, `quictun-client: invalid argument "x" for "-v, --v" flag`},
		{bins.client, []string{"--listen-on", "bad"}, "quictun-client: invalid configuration:\n--listen-on \"bad\""},
	} {
		r := run(t, nil, tc.bin, tc.args...)
		assert.Equal(t, 1, r.code, "%v", tc.args)
		assert.True(t, strings.HasPrefix(r.stderr, tc.want), "%v: want a plain message starting %q, got:\n%s", tc.args, tc.want, r.stderr)
		assert.Contains(t, r.stderr, "Run '", "%v: says where help is", tc.args)
		assert.NotContains(t, r.stderr, ".go:", "%v: no log line", tc.args)
	}
}

// TestAdminPortInUse: a second daemon on the host, on the same admin port,
// says which flag to set.
func TestAdminPortInUse(t *testing.T) {
	checkLeaks(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = busy.Close() }()
	r := run(t, nil, bins.client, "--server-endpoint", "127.0.0.1:1", "--token-source", "tcp:127.0.0.1:22", "--insecure-skip-verify",
		"--insecure-no-auth", "--listen-on", "tcp:127.0.0.1:"+strconv.Itoa(testutil.FreePort(t, "tcp")), "--httpd-listen-on", busy.Addr().String(), "--session-wait-timeout", time.Second.String())
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "address already in use")
	assert.Contains(t, r.stderr, "set --httpd-listen-on to a free address for this one (127.0.0.1:0 picks a free port and logs it)", r.stderr)
}

// TestReloadWithoutChangesAndEntryPointsLogged: a SIGHUP that changes
// nothing says so, on both ends, instead of listing empty changes; the
// client's log names what each entry point is (a forward's destination, a
// proxy's kind).
func TestReloadWithoutChangesAndEntryPointsLogged(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: defaultLevel})
	fwd, socks := testutil.FreePort(t, "tcp"), testutil.FreePort(t, "tcp")
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: append([]string{
		"--forward", "tcp:127.0.0.1:" + strconv.Itoa(fwd) + "=tcp:" + echo, "--proxy", "socks5:127.0.0.1:" + strconv.Itoa(socks),
	}, defaultLevel...)})
	assert.Equal(t, 1, count(cl.log(), "Listening for local connections", `address="tcp:127.0.0.1:`+strconv.Itoa(fwd)+`"`, `forwardTo="tcp:`+echo+`"`), cl.log())
	assert.Equal(t, 1, count(cl.log(), "Listening for local connections", `address="tcp:127.0.0.1:`+strconv.Itoa(socks)+`"`, `proxy="socks5"`), cl.log())
	assert.NotContains(t, cl.log(), "forward=true")

	for _, d := range []*daemon{srv, cl} {
		d.signal(t, syscall.SIGHUP)
		waitFor(t, ioTimeout, d.name+" reloaded", func() bool { return strings.Contains(d.log(), "Configuration reloaded") })
		assert.Equal(t, 1, count(d.log(), "No changes to apply"), d.log())
		assert.NotContains(t, d.log(), "=null", "no empty changes listed")
		assert.NotContains(t, d.log(), "Applied configuration changes")
	}
}

// TestAllowedDestinationsCheckedQuietly: forwards the server allows are
// checked when the client connects without a word at -v 0, and a server that
// allows a refused one at a later connection is reported.
func TestAllowedDestinationsCheckedQuietly(t *testing.T) {
	checkLeaks(t)
	a, b := testutil.EchoServer(t), testutil.EchoServer(t)
	cfg := writeFile(t, "server.yaml", "allow: [tcp:"+a+"]\n")
	srv := startServer(t, serverOpts{Args: append([]string{"--config", cfg}, defaultLevel...)})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + a, Args: append([]string{
		"--forward", "tcp:127.0.0.1:" + strconv.Itoa(testutil.FreePort(t, "tcp")) + "=tcp:" + b,
	}, defaultLevel...)})
	waitFor(t, ioTimeout, "the refused forward reported", func() bool {
		return count(cl.log(), "Server refuses a destination", `destination="tcp:`+b+`"`) == 1
	})
	assert.Zero(t, count(cl.log(), "Server refuses a destination", `destination="tcp:`+a+`"`), cl.log())
	require.NoError(t, echoVia(t, cl.Addr, "allowed"))

	// The server now allows it; each new connection checks again.
	require.NoError(t, os.WriteFile(cfg, []byte("allow: [tcp:"+a+", tcp:"+b+"]\n"), 0o600))
	srv.kill(t)
	startServer(t, serverOpts{StateDir: srv.StateDir, SecretFile: srv.SecretFile, UDPPort: srv.udpPort, AdminPort: srv.adminPort,
		Args: []string{"--config", cfg}})
	waitFor(t, ioTimeout, "the change reported", func() bool {
		return count(cl.log(), "Server now allows a destination it refused before", `destination="tcp:`+b+`"`) == 1
	})
}
