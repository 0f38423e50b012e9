package app

import (
	"bytes"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2/textlogger"

	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/pkg/endpoint"
)

// Deny rules come from the config file, the environment and the command
// line like every list flag (issue 11 item 7).
func TestDenyFromConfigFileEnvAndFlag(t *testing.T) {
	clearEnv(t)
	file := writeFile(t, "s.yaml", "secret-file: /s\nallow: [tcp:0.0.0.0/0:443]\ndeny:\n  - ll=tcp:169.254.0.0/16:*\n  - tcp:fe80::/10:*\n")
	m := effective(t, "--config", file)
	assert.Equal(t, []any{"tcp:0.0.0.0/0:443"}, m["allow"])
	assert.Equal(t, []any{"ll=tcp:169.254.0.0/16:*", "tcp:fe80::/10:*"}, m["deny"])

	bad := writeFile(t, "bad.yaml", "secret-file: /s\ndeny: [tcp:169.254.0.1/16:*]\n")
	_, err := execute(t, "--config", bad, "--check-config")
	require.ErrorIs(t, err, cli.ErrUsage)
	assert.Contains(t, err.Error(), `deny rule 0 "tcp:169.254.0.1/16:*"`)

	// No deny rules by default, and none written.
	m = effective(t, "--secret-file", "/s")
	assert.Empty(t, m["deny"])

	t.Setenv("QUICTUN_DENY", "tcp:10.0.0.0/8:*")
	m = effective(t, "--config", file)
	assert.Equal(t, []any{"tcp:10.0.0.0/8:*"}, m["deny"], "environment over file")
	m = effective(t, "--config", file, "--deny", "tcp:192.168.0.0/16:*", "--deny", "tcp:172.16.0.0/12:*")
	assert.Equal(t, []any{"tcp:192.168.0.0/16:*", "tcp:172.16.0.0/12:*"}, m["deny"], "repeatable flag over environment")

}

// A server started without --allow says at -v 0 what it allows, that its own
// listeners are refused, and how to narrow the list (issue 11 item 2).
func TestLogAllowList(t *testing.T) {
	t.Parallel()
	quicAddr := &net.UDPAddr{IP: net.IPv4zero, Port: 7500}
	for _, tc := range []struct {
		name        string
		allow, deny []string
		want        []string
		notWant     []string
	}{
		{"default", endpoint.DefaultAllowList().Rules(), nil,
			[]string{"no --allow given", "every TCP and UDP port on this host's loopback", `hint="e.g. --allow tcp:127.0.0.1:22`, "udp:0.0.0.0:7500", "loopback4=tcp:127.0.0.0/8:*"}, nil},
		{"explicit", []string{"ssh=tcp:127.0.0.1:22"}, []string{"tcp:169.254.0.0/16:*"},
			[]string{`"Destinations allowed"`, `allow="ssh=tcp:127.0.0.1:22"`, `deny="deny0=tcp:169.254.0.0/16:*"`, "udp:0.0.0.0:7500"}, []string{"hint", "no --allow"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf)))
			o := NewOptions()
			o.Allow, o.Deny = tc.allow, tc.deny
			allow, err := endpoint.ParseRules(o.Allow, o.Deny)
			require.NoError(t, err)
			logAllowList(logger, o, allow, quicAddr, nil)
			for _, w := range tc.want {
				assert.Contains(t, buf.String(), w)
			}
			for _, w := range tc.notWant {
				assert.NotContains(t, buf.String(), w)
			}
			assert.Contains(t, buf.String(), "I", "logged at info level (-v 0)")
		})
	}
}

func TestParseAllowFor(t *testing.T) {
	t.Parallel()
	lists, err := parseAllowFor([]string{"CN=ci-runner=tcp:10.0.0.5:5432", "key=v2=db=tcp:10.0.0.6:5432", "CN=ci-runner=tcp:10.0.0.7:22"}, []string{"tcp:10.0.0.7:22"})
	require.NoError(t, err)
	require.Len(t, lists, 2)
	assert.Equal(t, []string{"rule0=tcp:10.0.0.5:5432", "rule1=tcp:10.0.0.7:22"}, lists["CN=ci-runner"].Rules())
	assert.Equal(t, []string{"deny0=tcp:10.0.0.7:22"}, lists["CN=ci-runner"].DenyRules(), "deny rules go with every identity's list")
	assert.Equal(t, []string{"db=tcp:10.0.0.6:5432"}, lists["key=v2"].Rules())
	for _, tc := range []struct{ spec, want string }{
		{"tcp:10.0.0.5:5432", "want CN=NAME=RULE"},
		{"CN=ci-runner", "want CN=NAME=RULE"},
		{"CN==tcp:1.2.3.4:5", "want CN=NAME=RULE"},
		{"OU=ops=tcp:1.2.3.4:5", "not OU="},
		{"CN=x=tcp:nonsense", "--allow-for CN=x"},
	} {
		_, err := parseAllowFor([]string{tc.spec}, nil)
		require.ErrorContains(t, err, tc.want, tc.spec)
	}
}
