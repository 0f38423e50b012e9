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
