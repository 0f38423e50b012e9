package endpoint

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAuthorizeListen(t *testing.T) {
	t.Parallel()
	a, err := ParseRules([]string{"ssh=tcp:0.0.0.0:8022", "tcp:127.0.0.1:9000-9100", "udp:0.0.0.0:5353", "unix:/run/rev/*"},
		[]string{"tcp:127.0.0.1:9050", "unix:/run/rev/no.sock"})
	require.NoError(t, err)
	for _, tc := range []struct {
		listen string
		rule   string
		ok     bool
	}{
		{"tcp:0.0.0.0:8022", "ssh", true},
		{"tcp:127.0.0.1:8022", "", false}, // the rule names 0.0.0.0 itself
		{"tcp:127.0.0.1:9001", "rule1", true},
		{"tcp:127.0.0.1:9050", "", false}, // denied
		{"tcp:127.0.0.1:9200", "", false},
		{"udp:0.0.0.0:5353", "rule2", true},
		{"tcp:0.0.0.0:5353", "", false}, // a udp rule allows no tcp
		{"tcp:[::]:8022", "", false},
		{"unix:/run/rev/a.sock", "rule3", true},
		{"unix:/run/rev/no.sock", "", false},
		{"unix:/run/other.sock", "", false},
		{"tcp:localhost:8022", "", false}, // names are not bound
	} {
		ep, err := Parse(tc.listen)
		require.NoError(t, err, tc.listen)
		rule, err := a.AuthorizeListen(ep)
		if !tc.ok {
			require.ErrorIs(t, err, ErrForbidden, tc.listen)
			continue
		}
		require.NoError(t, err, tc.listen)
		assert.Equal(t, tc.rule, rule, tc.listen)
	}
	empty, err := ParseRules(nil, nil)
	require.NoError(t, err)
	_, err = empty.AuthorizeListen(Endpoint{Network: NetworkTCP, Address: "0.0.0.0:8022"})
	require.ErrorIs(t, err, ErrForbidden, "an empty list admits nothing")
}
