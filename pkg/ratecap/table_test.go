package ratecap

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/usage"
)

// TestTableBounded: 10,000 distinct hooked identities, each taking its
// budgets, opening a connection (counted by a usage.Ledger, the Table's
// SetLive) and closing it, one every 100 ms of the Table's clock, leave the
// Table bounded; a live identity keeps its one budget, capped, through it
// all, and so does one that left with more booked than the time since frees; a
// dropped identity's budgets, made again, are full ones with its caps.
func TestTableBounded(t *testing.T) {
	t.Parallel()
	ledger, err := usage.New(usage.Config{})
	require.NoError(t, err)
	tb := NewTable(nil, Rate{})
	var now int64 = 1e12
	tb.now = func() int64 { return now }
	tb.SetLive(ledger.Active)
	const rate = 1e6 // B/s: 1 µs a byte

	tb.SetHooked("key=live", Rate{Down: rate, Up: rate}, true)
	live := tb.For("key=live")
	closeLive := ledger.Get("key=live").ConnOpened()
	tb.SetHooked("key=debt", Rate{Down: rate}, true)
	debt := tb.For("key=debt")
	debt.Down.sent(now, 2e9) // 2,000 s of budget booked (the churn lasts 1,000 s), then it leaves

	const n = 10_000
	most := 0
	for i := range n {
		id := fmt.Sprintf("key=user-%05d", i)
		tb.SetHooked(id, Rate{Down: rate}, true)
		s := tb.For(id)
		closed := ledger.Get(id).ConnOpened()
		s.Down.sent(now, 1500)
		now += int64(100 * time.Millisecond)
		closed()
		most = max(most, tb.Len())
	}
	t.Logf("identities held: %d at the end, %d at most, of %d seen", tb.Len(), most, n+2)
	// Within IdleAfter (600 identities at this pace) they are kept; a sweep
	// comes at twice what the last one kept, at least minSweep.
	assert.LessOrEqual(t, most, 2*minSweep, "bounded")
	assert.Less(t, tb.Hooked(), 2*minSweep)

	assert.Same(t, live, tb.For("key=live"), "a live identity keeps its one budget")
	assert.True(t, live.Down.Capped() && live.Up.Capped(), "and its caps")
	live.Down.sent(now, 1e6)
	assert.False(t, live.Down.ready(now), "its cap holds")
	assert.Same(t, debt, tb.For("key=debt"), "one that left owing more than the time since frees is kept")
	assert.False(t, debt.Down.ready(now), "and still owes")

	closeLive()
	now += int64(IdleAfter + 2*time.Second) // live's budgets full again
	for i := range 2 * minSweep {           // new identities bring a sweep
		tb.For(fmt.Sprintf("key=later-%05d", i))
	}
	again := tb.For("key=live")
	assert.NotSame(t, live, again, "left and idle: dropped")
	assert.False(t, again.Down.Capped(), "without its hook's answer, the default (none)")
	tb.SetHooked("key=live", Rate{Down: rate, Up: rate}, true) // its next lookup
	assert.True(t, again.Down.Capped())
	assert.True(t, again.Down.ready(now), "a fresh budget: full")
	again.Down.sent(now, minBurstBytes+1)
	assert.False(t, again.Down.ready(now), "but no more than one burst")
}

// TestTableWithoutLiveKeepsBudgets: without SetLive a Table cannot tell
// which identities are gone, so it never drops budgets (only a hook's caps
// that no budget uses).
func TestTableWithoutLiveKeepsBudgets(t *testing.T) {
	t.Parallel()
	tb := NewTable(nil, Rate{})
	var now int64 = 1e12
	tb.now = func() int64 { return now }
	first := tb.For("key=a")
	for i := range 3 * minSweep {
		tb.SetHooked(fmt.Sprintf("key=hooked-%05d", i), Rate{Down: 1e6}, true)
		now += int64(time.Second)
	}
	assert.Same(t, first, tb.For("key=a"))
	assert.Less(t, tb.Len(), 2*minSweep)
}
