package client

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/backoff"
	"github.com/quictun/quictun/pkg/ingress"
)

// fakeConn is a link's connection in the steering tests: it lives until
// its context is cancelled, and carries no streams.
type fakeConn struct {
	ctx context.Context
}

func (fakeConn) OpenStream() (ingress.Stream, error) { return nil, net.ErrClosed }
func (fakeConn) OpenStreamSync(context.Context) (ingress.Stream, error) {
	return nil, net.ErrClosed
}

func (fakeConn) AcceptStream(context.Context) (ingress.Stream, error) {
	return nil, net.ErrClosed
}
func (f fakeConn) Context() context.Context                             { return f.ctx }
func (fakeConn) CloseWithError(quic.ApplicationErrorCode, string) error { return nil }
func (fakeConn) Transport() string                                      { return TransportQUIC }
func (fakeConn) QUIC() *quic.Conn                                       { return nil }

// fakeClient is a Client with servers named by labels, n connection
// slots each and no links yet; it dials nothing.
func fakeClient(t *testing.T, mode Mode, n int, labels ...string) *Client {
	t.Helper()
	c := &Client{cfg: Config{Mode: mode, FailbackAfter: 10 * time.Second, Metrics: NewMetrics(prometheus.NewRegistry())},
		changed: make(chan struct{}), logger: klog.Background(), tcpTickets: tls.NewLRUClientSessionCache(0)}
	for i, l := range labels {
		c.servers = append(c.servers, &server{idx: i, addr: l, label: l})
	}
	c.members = newMembers(c.servers, n, DefaultBackoff())
	c.cfg.Transport = TransportAuto
	for _, s := range c.servers {
		s.tcp = &tcpRow{}
	}
	return c
}

// up gives m a live link whose handshake completed at readyAt; its cancel
// ends it.
func up(t *testing.T, c *Client, m *member, readyAt time.Time) (*link, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	l := c.setSession(m, &session{Conn: fakeConn{ctx}}, nil)
	l.readyAt.Store(readyAt.UnixNano())
	c.sessionsChanged() // as quicLink.up does
	return l, cancel
}

// place picks the link a new tunnel goes on, as waitSession does.
func place(c *Client, now time.Time) *link {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, l, _ := c.pick(now)
	return l
}

func activeServer(c *Client) string {
	for _, s := range c.ServerStats() {
		if s.Active {
			return s.Label
		}
	}
	return ""
}

// TestPlaceFailover: in failover mode new tunnels go to the first healthy
// server; a stalled one passes the role on at once, and takes it back only
// after it has been healthy for FailbackAfter.
func TestPlaceFailover(t *testing.T) {
	t.Parallel()
	c := fakeClient(t, ModeFailover, 1, "a", "b")
	start := time.Now()
	la, _ := up(t, c, c.members[0], start)
	lb, _ := up(t, c, c.members[1], start)
	assert.Same(t, la, place(c, start))
	assert.Same(t, la, place(c, start), "failover: not spread by streams")

	la.stalled.Store(true)
	c.servers[0].markBad(start.Add(time.Second))
	assert.Same(t, lb, place(c, start.Add(time.Second)), "a stalled: b")
	assert.Equal(t, uint64(1), c.Switches())

	la.stalled.Store(false) // a answers again
	assert.Same(t, lb, place(c, start.Add(5*time.Second)), "a healthy for 4 s: not yet")
	assert.Same(t, la, place(c, start.Add(12*time.Second)), "a healthy for FailbackAfter: back")
	assert.Equal(t, uint64(2), c.Switches())
}

// TestPlaceSpread: in spread mode each new tunnel goes to the healthy link
// with the fewest active tunnels, of any server; a link that ended takes
// none.
func TestPlaceSpread(t *testing.T) {
	t.Parallel()
	c := fakeClient(t, ModeSpread, 2, "a", "b")
	now := time.Now()
	var ends []context.CancelFunc
	for _, m := range c.members {
		_, end := up(t, c, m, now)
		ends = append(ends, end)
	}
	counts := map[*link]int{}
	for range 8 {
		counts[place(c, now)]++
	}
	require.Len(t, counts, 4)
	for l, n := range counts {
		assert.Equal(t, 2, n, l.m.label)
	}
	ends[0]()
	for range 4 {
		l := place(c, now)
		assert.NotSame(t, c.members[0], l.m, "an ended link takes no tunnel")
	}
}

// TestPlaceSpreadShortTunnels: tunnels that each end before the next
// opens (every link at 0 active) go round the links, not all to the
// first (as they did when ties went to the first link in order).
func TestPlaceSpreadShortTunnels(t *testing.T) {
	t.Parallel()
	c := fakeClient(t, ModeSpread, 1, "a", "b", "c")
	now := time.Now()
	for _, m := range c.members {
		up(t, c, m, now)
	}
	counts := map[*link]int{}
	for range 9 {
		l := place(c, now)
		counts[l]++
		l.active.Add(-1) // the tunnel ends
	}
	require.Len(t, counts, 3)
	for l, n := range counts {
		assert.Equal(t, 3, n, l.m.label)
	}
}

// TestServerActiveFollowsHealth: failover's active server (server_active,
// the failover line) moves as links come and go, with no tunnel placed.
func TestServerActiveFollowsHealth(t *testing.T) {
	t.Parallel()
	c := fakeClient(t, ModeFailover, 1, "a", "b")
	now := time.Now()
	assert.Empty(t, activeServer(c), "no link yet")
	_, endA := up(t, c, c.members[0], now)
	_, _ = up(t, c, c.members[1], now)
	assert.Equal(t, "a", activeServer(c))
	endA()
	c.servers[0].markBad(time.Now())
	c.setSession(c.members[0], nil, nil)
	assert.Equal(t, "b", activeServer(c), "a's link ended: b is active before any tunnel")
	assert.Equal(t, uint64(1), c.Switches())
}

// TestSteerWaitsForFirstOutcome: before any choice, a later server whose
// handshake finished first does not take the role while the first has no
// outcome yet; once the first fails, it does.
func TestSteerWaitsForFirstOutcome(t *testing.T) {
	t.Parallel()
	c := fakeClient(t, ModeFailover, 1, "a", "b")
	_, _ = up(t, c, c.members[1], time.Now())
	c.resteer()
	assert.Nil(t, c.active, "a has not answered nor failed yet")
	c.servers[0].markBad(time.Now())
	c.resteer()
	require.NotNil(t, c.active)
	assert.Equal(t, "b", c.active.label)
	assert.Zero(t, c.Switches(), "the first choice is no switch")
}

// TestTransportGaugeFollowsHealth: the transport gauge says TCP as soon as
// the TCP connection is up and QUIC as soon as a QUIC connection is usable
// without one, with no tunnel placed.
func TestTransportGaugeFollowsHealth(t *testing.T) {
	t.Parallel()
	c := fakeClient(t, ModeFailover, 1, "a")
	gauge := func(tr string) float64 { return promtest.ToFloat64(c.cfg.Metrics.Transport.WithLabelValues(tr)) }
	_, endTCP := tcpUp(t, c, c.servers[0], time.Time{})
	assert.Equal(t, 1.0, gauge(TransportTCP), "TCP up")
	assert.Zero(t, gauge(TransportQUIC))
	endTCP()
	_, _ = up(t, c, c.members[0], time.Now())
	assert.Equal(t, 1.0, gauge(TransportQUIC), "QUIC usable")
	assert.Zero(t, gauge(TransportTCP))
}

// TestAuthBackoffPace: after refusals of our credentials the redials are
// paced from 2 s up to 30 s, each delay at least half its ceiling: even
// with the shortest delays the jitter can draw, a minute holds at most 8
// attempts (the target: 10).
func TestAuthBackoffPace(t *testing.T) {
	t.Parallel()
	base := DefaultBackoff()
	base.Rand = func() float64 { return 0 } // the shortest delays
	bo := authBackoff(base)
	var elapsed time.Duration
	attempts := 1
	for elapsed += bo.Next(); elapsed < time.Minute; elapsed += bo.Next() {
		attempts++
	}
	assert.LessOrEqual(t, attempts, 8)
	assert.Equal(t, 30*time.Second, bo.Ceiling())

	quick := authBackoff(&backoff.Backoff{Initial: time.Millisecond, Max: 50 * time.Millisecond})
	assert.Equal(t, 2*time.Second, quick.Ceiling(), "never faster than 2 s, whatever --reconnect-max-delay says")
}
