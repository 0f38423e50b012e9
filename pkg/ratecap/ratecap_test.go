package ratecap

import (
	"strconv"
	"sync"
	"testing"
	"time"

	qc "github.com/quic-go/quic-go/congestion"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want Rate
		err  string
	}{
		{"20Mbit", Rate{Down: 2.5e6, Up: 2.5e6}, ""},
		{"20Mbit/5Mbit", Rate{Down: 2.5e6, Up: 625e3}, ""},
		{"1MiB/0", Rate{Down: 1 << 20}, ""},
		{"0/1GB", Rate{Up: 1e9}, ""},
		{"1.5Gbit", Rate{Down: 187.5e6, Up: 187.5e6}, ""},
		{"100kB", Rate{Down: 1e5, Up: 1e5}, ""},
		{"20", Rate{}, "a number and a unit"},
		{"-1Mbit", Rate{}, "a number and a unit"},
		{"4bit", Rate{}, "at least 8kbit"},
		{"20Mbit/x", Rate{}, `rate "x"`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseRate(tc.in)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.InDelta(t, tc.want.Down, got.Down, 1e-6)
			assert.InDelta(t, tc.want.Up, got.Up, 1e-6)
		})
	}
	r, err := ParseRule("CN=a,key=b=1Mbit")
	require.NoError(t, err)
	assert.Equal(t, "CN=a,key=b", r.Identity, "the last = splits")
	_, err = ParseRule("1Mbit")
	require.ErrorContains(t, err, "want IDENTITY=DOWN[/UP]")
}

// TestGCRA: a budget lets a burst go, then one rate's worth per second.
func TestGCRA(t *testing.T) {
	t.Parallel()
	var g Bucket
	g.SetRate(1e6) // 1 MB/s: 1 µs a byte; burst 12 KB (8 packets) > 5 ms
	tau := g.rate.Load().tau
	now := int64(time.Hour)
	sent := 0
	for g.ready(now) {
		g.sent(now, 1500)
		sent += 1500
	}
	assert.Equal(t, 13500, sent, "the burst: up to tau ahead")
	assert.Equal(t, now+int64(13500*time.Microsecond)-tau, g.next())
	// Over a second, the rate.
	for t := now; t < now+int64(time.Second); t += int64(time.Millisecond) {
		for g.ready(t) {
			g.sent(t, 1500)
			sent += 1500
		}
	}
	assert.InDelta(t, 1e6+13500, sent, 3000)
	g.SetRate(0)
	assert.True(t, g.ready(now), "no cap")
	assert.Zero(t, g.next())
	assert.Zero(t, g.delay(now, 1<<20))
}

// TestBucketChunk: a capped stream moves at most a burst's worth at once,
// and never less than maxRead.
func TestBucketChunk(t *testing.T) {
	t.Parallel()
	var b Bucket
	for _, tc := range []struct {
		rate float64
		want int
	}{
		{20e6 / 8, maxRead},     // 5 ms = 12,500 B
		{100e6 / 8, 62_500},     // 5 ms at 100 Mbit/s
		{100e9 / 8, 62_500_000}, // 5 ms at 100 Gbit/s
		{1e3, maxRead},          // the 8-packet minimum burst, 12 KB
	} {
		b.SetRate(tc.rate)
		assert.Equal(t, tc.want, b.chunk(), "rate %.0f B/s", tc.rate)
	}
	b.SetRate(0)
	assert.Greater(t, b.chunk(), 1<<30, "no cap: no bound")
}

// TestBucketConcurrent: bookings from many goroutines at once all count.
func TestBucketConcurrent(t *testing.T) {
	t.Parallel()
	var b Bucket
	b.SetRate(1e9) // 1 ns a byte
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				b.sent(0, 1000)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(8*1000*1000), b.tat.Load(), "no booking lost")
}

// TestTableReload: a reload changes the rates of the budgets in use.
func TestTableReload(t *testing.T) {
	t.Parallel()
	tb := NewTable([]Rule{{Identity: "key=a", Rate: Rate{Down: 1e6}}}, Rate{Up: 5e5})
	a, other := tb.For("key=a"), tb.For("key=z")
	assert.Same(t, a, tb.For("key=a"), "one budget per identity")
	assert.True(t, a.Down.Capped())
	assert.False(t, a.Up.Capped(), "its own rule, not the default")
	assert.True(t, other.Up.Capped(), "the default")
	tb.Set(nil, Rate{})
	assert.False(t, a.Down.Capped(), "lifted by the reload")
	assert.False(t, other.Up.Capped())
}

// openController is an inner controller that always lets packets go.
type openController struct{}

func (openController) OnPacketSent(qc.SentPacket)   {}
func (openController) OnEvent(*qc.Event)            {}
func (openController) OnAppLimited(int)             {}
func (openController) SetMaxDatagramSize(int)       {}
func (openController) CanSend(int) bool             { return true }
func (openController) HasPacingBudget(qc.Time) bool { return true }
func (openController) TimeUntilSend(int) qc.Time    { return 0 }
func (openController) CongestionWindow() int        { return 1 << 20 }
func (openController) InSlowStart() bool            { return false }
func (openController) InRecovery() bool             { return false }

// tailController is an openController that asks for tail copies.
type tailController struct{ openController }

func (tailController) TailCopies() (int, time.Duration) { return 2, 3 * time.Millisecond }

// TestControllerTailCopies: the wrapper passes on the tail copies the
// controller beneath asks for (quic-go asks the wrapper); before, a server
// with caps or an auth hook sent none, whatever its bbr measured.
func TestControllerTailCopies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		inner  qc.Controller
		copies int
		after  time.Duration
	}{
		{"a tail copier beneath", tailController{}, 2, 3 * time.Millisecond},
		{"none beneath", openController{}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var cc qc.Controller = Wrap(tc.inner)
			copier, ok := cc.(qc.TailCopier)
			require.True(t, ok, "the wrapper is a qc.TailCopier")
			copies, after := copier.TailCopies()
			assert.Equal(t, tc.copies, copies)
			assert.Equal(t, tc.after, after)
		})
	}
}

// linkedBucket returns a bucket capped at rate whose bookings are counted
// (booked: a link rate is set).
func linkedBucket(rate float64) *Bucket {
	b := &Bucket{rest: &linkShare{}}
	b.rest.setLink(1e12)
	b.SetRate(rate)
	return b
}

// TestControllerPrepays: at a high cap the sender books its identity's
// budget a prepay ahead (16 KiB at 100 Gbit/s), so most packets write no
// shared state, and never books less than it sent; at a low cap (1 MB/s:
// 500 B, less than a packet) it books each packet exactly, as before; a
// Bind to another budget books there from its first packet.
func TestControllerPrepays(t *testing.T) {
	t.Parallel()
	const pkt, packets = 1200, 100
	for _, tc := range []struct {
		name     string
		rate     float64
		min, max int64
	}{
		{"100Gbit", farAbove, pkt*packets + 1, pkt*packets + 16<<10}, // ahead: more than sent, at most maxPrepay
		{"1MBps", 1e6, pkt * packets, pkt * packets},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := linkedBucket(tc.rate)
			c := Wrap(openController{})
			c.Bind(b)
			now := qc.Time(time.Hour)
			for i := range packets {
				require.True(t, c.HasPacingBudget(now), "packet %d", i)
				c.OnPacketSent(qc.SentPacket{Time: now, Bytes: pkt, AckEliciting: true})
				now += qc.Time(time.Duration(float64(pkt) * 1e9 / tc.rate))
			}
			booked := b.booked.Load()
			assert.GreaterOrEqual(t, booked, tc.min, "booked at least what was sent (at 100 Gbit/s: ahead of it)")
			assert.LessOrEqual(t, booked, tc.max, "booked at most a prepay ahead")

			other := linkedBucket(tc.rate)
			c.Bind(other)
			c.OnPacketSent(qc.SentPacket{Time: now, Bytes: pkt, AckEliciting: true})
			assert.GreaterOrEqual(t, other.booked.Load(), int64(pkt), "the new budget is charged from its first packet")
		})
	}
}

// TestControllerSharesBudgetWithStreams: an identity's download budget is
// booked by its QUIC connections' controllers (in quic-go's clock, which
// starts an hour before its package loads) and by its TCP fallback
// streams (Stream.Write): both in one clock, so neither makes the other
// wait for nothing, and bookings add up. Before, a TCP stream beside a
// QUIC connection waited about an hour after the connection's first
// packet.
func TestControllerSharesBudgetWithStreams(t *testing.T) {
	t.Parallel()
	const quicAhead = int64(time.Hour) // quic-go's monotime origin
	qnow := func() qc.Time { return qc.Time(monoNow() + quicAhead) }
	var b Bucket
	b.SetRate(1e6) // 1 MB/s, 1 µs a byte
	c := Wrap(openController{})
	c.Bind(&b)
	require.True(t, c.HasPacingBudget(qnow()))
	c.OnPacketSent(qc.SentPacket{Time: qnow(), Bytes: 1200, AckEliciting: true})
	// A TCP stream of the same identity writes 1,000 B now: it may wait
	// for what the two booked (2.2 ms at 1 MB/s), not an hour.
	d := b.delay(monoNow(), 1000)
	assert.Less(t, d, 50*time.Millisecond, "a stream's wait after a packet booked the budget")
	// Many bytes booked by streams hold the controller back, and its next
	// send time is in quic-go's clock, about when the budget frees.
	b.delay(monoNow(), 100_000) // 100 ms of budget
	assert.False(t, c.HasPacingBudget(qnow()), "the streams' bookings count for the controller")
	until := time.Duration(int64(c.TimeUntilSend(0)) - int64(qnow()))
	assert.InDelta(t, 100*time.Millisecond, until, float64(50*time.Millisecond), "next send in quic-go's clock")
}

// TestTableHooked: caps from an auth hook's answer apply to an identity
// with no rule of its own, at once to its budgets in use; a rule wins over
// them; an answer without caps gives the default back; their number is
// bounded (a full table drops a tenth).
func TestTableHooked(t *testing.T) {
	t.Parallel()
	tb := NewTable([]Rule{{Identity: "key=ruled", Rate: Rate{Down: 1e6}}}, Rate{Down: 5e5})
	carol := tb.For("key=carol")
	assert.Equal(t, Rate{Down: 5e5}, tb.Rate("key=carol"), "the default before an answer")
	tb.SetHooked("key=carol", Rate{Down: 2.5e6, Up: 6.25e5}, true)
	assert.Equal(t, Rate{Down: 2.5e6, Up: 6.25e5}, tb.Rate("key=carol"))
	assert.True(t, carol.Up.Capped(), "the budget in use takes the hook's caps at once")
	tb.SetHooked("key=ruled", Rate{Down: 9e9}, true)
	assert.Equal(t, Rate{Down: 1e6}, tb.Rate("key=ruled"), "the operator's rule wins")
	tb.Set(nil, Rate{})
	assert.Equal(t, Rate{Down: 9e9}, tb.Rate("key=ruled"), "a reload keeps the hook's caps")
	assert.Equal(t, Rate{Down: 2.5e6, Up: 6.25e5}, tb.Rate("key=carol"))
	tb.SetHooked("key=carol", Rate{}, false)
	assert.Equal(t, Rate{}, tb.Rate("key=carol"), "an answer without caps: the default again")
	assert.False(t, carol.Up.Capped())

	for i := range MaxHooked + 1 {
		tb.SetHooked("key=user-"+strconv.Itoa(i), Rate{Down: 1e6}, true)
	}
	assert.LessOrEqual(t, tb.Hooked(), MaxHooked, "bounded")
	assert.Greater(t, tb.Hooked(), MaxHooked*8/10)
}
