package ratecap

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLinkPacer: without a link rate an uncapped identity's traffic is
// paced by nothing; with one, by the rest; a capped identity's always by
// its own budget; a reload that takes the link rate away frees the rest.
func TestLinkPacer(t *testing.T) {
	t.Parallel()
	tb := NewTable([]Rule{{Identity: "key=a", Rate: Rate{Down: 2e6, Up: 2e6}}}, Rate{})
	a, u := tb.For("key=a"), tb.For("key=u")
	now := int64(time.Hour)
	assert.Nil(t, u.Down.pacer(now), "no link rate, no cap: nothing paces")
	assert.Same(t, &a.Down, a.Down.pacer(now))
	tb.SetLink(Rate{Down: 10e6, Up: 5e6})
	assert.Equal(t, Rate{Down: 10e6, Up: 5e6}, tb.Link())
	assert.Same(t, &tb.restDown.rest, u.Down.pacer(now), "the rest paces the uncapped")
	assert.Same(t, &tb.restUp.rest, u.Up.pacer(now))
	assert.Same(t, &a.Down, a.Down.pacer(now), "a cap of its own wins")
	assert.InDelta(t, 10e6, tb.Rest().Down, 1, "the whole link before a refresh")
	tb.SetLink(Rate{})
	assert.Nil(t, u.Down.pacer(now), "reloaded without a link rate")
}

// TestLinkRestLeavesCappedTheirUse: the rest's rate is the link's less what
// the capped identities booked, doubled and at most their cap, refreshed
// every refreshEvery; at least restFloor of the link.
func TestLinkRestLeavesCappedTheirUse(t *testing.T) {
	t.Parallel()
	tb := NewTable([]Rule{
		{Identity: "key=a", Rate: Rate{Down: 2e6}},
		{Identity: "key=b", Rate: Rate{Down: 4e6}},
	}, Rate{})
	tb.SetLink(Rate{Down: 10e6})
	a, b, u := tb.For("key=a"), tb.For("key=b"), tb.For("key=u")
	now := int64(time.Hour)
	step := int64(refreshEvery)
	u.Down.pacer(now) // the first refresh starts the interval
	// key=a at its cap, key=b at a tenth of its: a's whole cap and twice
	// b's use are left to them.
	a.Down.sent(now, int(2e6*step/1e9))
	b.Down.sent(now, int(4e5*step/1e9))
	now += step
	u.Down.pacer(now)
	assert.InDelta(t, 10e6-2e6-8e5, tb.Rest().Down, 1e3)
	// Within refreshEvery nothing changes.
	a.Down.sent(now, 1e6)
	u.Down.pacer(now + step/2)
	assert.InDelta(t, 10e6-2e6-8e5, tb.Rest().Down, 1e3)
	// Both idle: the whole link.
	u.Down.pacer(now + 3*step)
	u.Down.pacer(now + 5*step)
	assert.InDelta(t, 10e6, tb.Rest().Down, 1e3, "idle capped identities leave all of it")
	// Caps adding up past the link: the floor.
	tb.SetLink(Rate{Down: 5e6})
	now += 6 * step
	u.Down.pacer(now)
	a.Down.sent(now, int(2e6*step/1e9))
	b.Down.sent(now, int(4e6*step/1e9))
	u.Down.pacer(now + step)
	assert.InDelta(t, restFloor*5e6, tb.Rest().Down, 1e3)
}

// TestLinkSendsNoMoreThanTheLink: a capped identity sending at its cap and a
// greedy uncapped one, both through their pacers on a simulated clock, send
// together no more than the link's rate (the server never builds the
// link's queue), the capped one its whole cap and the uncapped the rest.
// Without the link rate the uncapped one sends all it can.
func TestLinkSendsNoMoreThanTheLink(t *testing.T) {
	t.Parallel()
	const link, capRate = 12.5e6, 2.5e6 // 100 and 20 Mbit/s
	tb := NewTable([]Rule{{Identity: "key=capped", Rate: Rate{Down: capRate}}}, Rate{})
	tb.SetLink(Rate{Down: link})
	c, u := tb.For("key=capped"), tb.For("key=uncapped")
	const pkt, dur = 1200, int64(2 * time.Second)
	start := int64(time.Hour)
	var sentC, sentU int
	for now := start; now < start+dur; now += int64(100 * time.Microsecond) {
		if p := c.Down.pacer(now); p.ready(now) {
			p.sent(now, pkt)
			sentC += pkt
		}
		for range 4 { // greedy: up to 4 packets a tick, 48 MB/s
			p := u.Down.pacer(now)
			require.NotNil(t, p)
			if !p.ready(now) {
				break
			}
			p.sent(now, pkt)
			sentU += pkt
		}
	}
	secs := float64(dur) / 1e9
	total := float64(sentC+sentU) / secs
	assert.InDelta(t, capRate, float64(sentC)/secs, capRate*0.02, "the capped identity gets its cap")
	assert.LessOrEqual(t, total, link*1.02, "together no more than the link")
	assert.Greater(t, float64(sentU)/secs, (link-capRate)*0.95, "the uncapped one the rest")
}
