package ingress

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The Handler's behaviour is exercised end to end by test/integration and
// test/e2e (every tunnel goes through Serve); here only its construction.
func TestNewRequiresItsDependencies(t *testing.T) {
	t.Parallel()
	_, err := New(Config{}, Links{})
	require.ErrorContains(t, err, "required")
}

// TestLogDestinationOfReverseForwards: a reverse forward's log lines name
// the address it was bound to, not its internal token; a forward's name
// its token.
func TestLogDestinationOfReverseForwards(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reverse bool
		want    string
	}{{reverse: true, want: "udp:127.0.0.1:5353"}, {reverse: false, want: "bound/1/7"}} {
		h := &Handler{cfg: Config{Reverse: tc.reverse}}
		require.Equal(t, tc.want, h.logDestination("bound/1/7", "udp:127.0.0.1:5353"))
	}
}
