package congestion_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/congestion"
	"github.com/quictun/quictun/pkg/ratecap"
)

// TestTailCopiesThroughRateCaps: a server with caps (or an auth hook)
// wraps its controllers in ratecap's (ratecap.Factory); quic-go asks the
// wrapper for tail copies, so the wrapper must pass bbr's on. Before, it
// hid them: such a server sent none at any loss.
func TestTailCopiesThroughRateCaps(t *testing.T) {
	if testing.Short() {
		t.Skip("a hundred exchanges through quic-go")
	}
	spec := linkSpec{rateBitsPerSecond: 100e6, oneWay: 50 * time.Millisecond, queuePackets: 1000, loss: 0.3}
	capped := ratecap.Factory(congestion.Factory(congestion.BBR, congestion.Options{}))
	mean, copies := exchanges(t, spec, capped, 30, 50)
	t.Logf("30%% loss, RTT 100 ms, controllers wrapped for caps: exchange mean %v, %d tail copies sent", mean, copies)
	require.NotZero(t, copies, "tail copies through the rate caps' controller")
}
