package endpoint

import (
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckAllocations: checking a tunnel's IP destination against the
// reserved addresses (unspecified, metadata, multicast: each through forms)
// allocates nothing, and authorizing one allocates only its result: these
// run for every tunnel.
func TestCheckAllocations(t *testing.T) {
	a, err := ParseAllowList([]string{"tcp:127.0.0.1:*", "tcp:10.0.0.0/8:22"})
	require.NoError(t, err)
	ap := netip.MustParseAddrPort("127.0.0.1:7000")
	dest, err := Parse("tcp:127.0.0.1:7000")
	require.NoError(t, err)
	check := testing.AllocsPerRun(100, func() {
		if err := a.CheckDial("tcp", ap); err != nil {
			t.Fatal(err)
		}
	})
	authorize := testing.AllocsPerRun(100, func() {
		if _, _, err := a.Authorize(context.Background(), nil, dest); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("allocations: CheckDial %v, Authorize %v", check, authorize)
	require.Zero(t, check, "allocations per CheckDial")
	require.LessOrEqual(t, authorize, 4.0, "allocations per Authorize")
}
