package egress

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/endpoint"
)

// TestHookedRulesOfKeyAndCertificate: a stream whose key and certificate
// were both answered by the auth hook reaches what either answer allows,
// each named by its identity; --deny wins over both; the policy in force
// is left without them.
func TestHookedRulesOfKeyAndCertificate(t *testing.T) {
	t.Parallel()
	allow, err := endpoint.ParseRules([]string{"tcp:10.0.0.1:80"}, []string{"tcp:10.0.0.9:22"})
	require.NoError(t, err)
	e := newTestHandler(t, func(c *Config) { c.Allow = allow })
	inForce := e.policy.Load()
	p := inForce.withHooked("key=carol", endpoint.MustParseAllowList("db=tcp:10.0.0.5:5432"))
	p = p.withHooked("CN=ci-runner", endpoint.MustParseAllowList("ci=tcp:10.0.0.6:443", "tcp:10.0.0.9:22"))
	for _, tc := range []struct {
		dest, rule, reason string
	}{
		{dest: "tcp:10.0.0.1:80", rule: "rule0"},
		{dest: "tcp:10.0.0.5:5432", rule: "key=carol:db"},
		{dest: "tcp:10.0.0.6:443", rule: "CN=ci-runner:ci"},
		{dest: "tcp:10.0.0.9:22", reason: endpoint.ReasonDenied},
		{dest: "tcp:10.0.0.7:80", reason: endpoint.ReasonNotAllowed},
	} {
		dest, err := endpoint.Parse(tc.dest)
		require.NoError(t, err)
		_, rule, err := p.authorize(context.Background(), nil, dest, []string{"CN=ci-runner", "key=carol"})
		if tc.reason != "" {
			assert.Equal(t, tc.reason, endpoint.RefusalReason(err), tc.dest)
			continue
		}
		require.NoError(t, err, tc.dest)
		assert.Equal(t, tc.rule, rule, tc.dest)
	}
	assert.Empty(t, inForce.hooked, "the rules are the stream's, not the policy in force")
	dest, _ := endpoint.Parse("tcp:10.0.0.6:443")
	_, _, err = inForce.authorize(context.Background(), nil, dest, []string{"CN=ci-runner"})
	assert.Equal(t, endpoint.ReasonNotAllowed, endpoint.RefusalReason(err))
}
