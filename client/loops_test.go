package client

import (
	"context"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/tcpmux"
)

// tcpFake is a fake TCP connection: it lives until closed (or its
// server is killed).
type tcpFake struct {
	fakeConn
	cancel context.CancelFunc
}

func (f *tcpFake) CloseWithError(quic.ApplicationErrorCode, string) error { f.cancel(); return nil }
func (*tcpFake) Transport() string                                        { return TransportTCP }

// fakeDialer dials fake TCP connections after took; a server marked down
// refuses them. It records each dial's server and time.
type fakeDialer struct {
	took    time.Duration
	tookFor map[string]time.Duration // by server label, instead of took
	mu      sync.Mutex
	down    map[string]bool
	live    map[string]*tcpFake
	dials   []string
	times   []time.Time // when each dial ended
}

func newFakeDialer(took time.Duration) *fakeDialer {
	return &fakeDialer{took: took, down: map[string]bool{}, live: map[string]*tcpFake{}}
}

func (d *fakeDialer) dialTCP(ctx context.Context, s *server) (ingress.Conn, *tcpmux.Conn, error) {
	took := d.took
	if v, ok := d.tookFor[s.label]; ok {
		took = v
	}
	sleep(ctx, took)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dials = append(d.dials, s.label)
	d.times = append(d.times, time.Now())
	if d.down[s.label] {
		return nil, nil, net.ErrClosed
	}
	cctx, cancel := context.WithCancel(ctx)
	f := &tcpFake{fakeConn{cctx}, cancel}
	d.live[s.label] = f
	return f, nil, nil
}

// kill stops server label: its TCP connection ends, new dials fail.
func (d *fakeDialer) kill(label string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down[label] = true
	if f, ok := d.live[label]; ok {
		f.cancel()
	}
}

func (d *fakeDialer) revive(label string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down[label] = false
}

func (d *fakeDialer) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.dials)
}

// runLoops starts c's TCP links on d in the bubble; the returned stop
// ends them and waits.
func runLoops(t *testing.T, c *Client, d *fakeDialer) (stop func()) {
	t.Helper()
	c.tcpDialer = d
	c.cfg.Backoff = DefaultBackoff()
	c.cfg.SessionWait = time.Minute
	c.SetSecret(nil)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { c.runTCP(ctx) })
	return func() { cancel(); wg.Wait() }
}

// placed places a new tunnel as ingress does (waitSession) and returns
// its session and how long it waited.
func placed(t *testing.T, c *Client) (*session, time.Duration) {
	t.Helper()
	start := time.Now()
	s, release, err := c.waitSession(t.Context())
	require.NoError(t, err)
	release()
	return s, time.Since(start)
}

// quicDown marks every QUIC row of c down since now, as quicLink.connect
// does when it starts dialing a server that never answers.
func quicDown(c *Client) {
	for _, m := range c.members {
		c.markRow(m, func(m *member) { m.downSince = time.Now() })
	}
}

// TestLoopTCPWhenQUICNeverAnswers: QUIC dials to the server never answer
// (UDP blocked): the TCP link dials once the fallback delay has passed,
// not before, and a tunnel waiting meanwhile goes over TCP.
func TestLoopTCPWhenQUICNeverAnswers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a")
		c.cfg.FallbackDelay = time.Second
		d := newFakeDialer(20 * time.Millisecond)
		quicDown(c)
		stop := runLoops(t, c, d)
		defer stop()

		time.Sleep(900 * time.Millisecond)
		synctest.Wait()
		assert.Zero(t, d.count(), "no TCP dial within the fallback delay")
		s, waited := placed(t, c)
		assert.Equal(t, TransportTCP, s.Transport())
		assert.Equal(t, 120*time.Millisecond, waited, "placed as the TCP connection came up: delay + dial")
		assert.Equal(t, []string{"a"}, d.dials)
	})
}

// TestLoopFailoverTwoServers: with UDP blocked each server has its own TCP
// row; new tunnels go to the first, even when the second's TCP handshake
// ends first; when it dies they go to the second at once, and back to the
// first once it is up again (its row redials).
func TestLoopFailoverTwoServers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a", "b")
		d := newFakeDialer(20 * time.Millisecond)
		d.tookFor = map[string]time.Duration{"b": 5 * time.Millisecond} // b's handshake ends first
		quicDown(c)
		stop := runLoops(t, c, d)
		defer stop()

		s, _ := placed(t, c) // waits for the rows
		synctest.Wait()
		d.mu.Lock()
		a, b := d.live["a"], d.live["b"]
		d.mu.Unlock()
		require.NotNil(t, a, "a's row dialed")
		require.NotNil(t, b, "b's row dialed: a warm standby")
		assert.Same(t, a, s.Conn, "failover: the first server")

		d.kill("a")
		synctest.Wait()
		s, waited := placed(t, c)
		assert.Same(t, b, s.Conn, "a died: b")
		assert.Zero(t, waited, "at once")

		d.revive("a")
		time.Sleep(15 * time.Second) // a's row redials within its backoff
		synctest.Wait()
		s, _ = placed(t, c)
		d.mu.Lock()
		a = d.live["a"]
		d.mu.Unlock()
		assert.Same(t, a, s.Conn, "a back: the first server again")
	})
}

// TestLoopBlackoutGrace: a TCP connection that came up while a QUIC link
// that was up has only gone silent holds new tunnels back for quicGrace:
// a QUIC link that answers within it takes them (and the TCP connection,
// no longer wanted and unused, is closed); one that stays silent hands
// them to TCP when the grace ends.
func TestLoopBlackoutGrace(t *testing.T) {
	t.Parallel()
	const heartbeat, took = 200 * time.Millisecond, 50 * time.Millisecond
	grace := quicGrace(heartbeat, took) // 450 ms
	for _, tc := range []struct {
		name      string
		answersAt time.Duration // 0: stays silent
		transport string
		waited    time.Duration
	}{
		{name: "QUIC answers within the grace", answersAt: 100 * time.Millisecond, transport: TransportQUIC, waited: 100 * time.Millisecond},
		{name: "QUIC stays silent", transport: TransportTCP, waited: grace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				c := fakeClient(t, ModeFailover, 1, "a")
				c.cfg.HeartbeatInterval = heartbeat
				d := newFakeDialer(took)
				l, _ := up(t, c, c.members[0], time.Now())
				stop := runLoops(t, c, d)
				defer stop()

				synctest.Wait()
				assert.Zero(t, d.count(), "QUIC answers: no TCP")
				l.suspect.Store(true) // the path went silent (watch.suspect)
				c.sessionsChanged()
				time.Sleep(took) // the TCP connection comes up at once
				synctest.Wait()
				require.Equal(t, 1, d.count())
				if tc.answersAt > 0 {
					go func() {
						time.Sleep(tc.answersAt)
						l.suspect.Store(false) // an echo (watch.echoSeen)
						c.sessionsChanged()
					}()
				}
				s, waited := placed(t, c)
				assert.Equal(t, tc.transport, s.Transport())
				assert.Equal(t, tc.waited, waited)
				if tc.answersAt > 0 {
					time.Sleep(2 * time.Second)
					synctest.Wait()
					d.mu.Lock()
					closed := d.live["a"].ctx.Err() != nil
					d.mu.Unlock()
					assert.True(t, closed, "TCP no longer wanted and unused: closed")
				}
			})
		})
	}
}

// TestLoopPlacement: a tunnel that arrives before any row is live waits
// and goes on the first that comes up; once a QUIC link answers, new
// tunnels go over QUIC, not over the TCP row that carried them.
func TestLoopPlacement(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a")
		c.cfg.FallbackDelay = time.Second
		d := newFakeDialer(10 * time.Millisecond)
		quicDown(c)
		stop := runLoops(t, c, d)
		defer stop()

		s, waited := placed(t, c)
		assert.Equal(t, TransportTCP, s.Transport(), "UDP blocked: TCP")
		assert.Equal(t, 1010*time.Millisecond, waited)

		l, _ := up(t, c, c.members[0], time.Now())
		s, waited = placed(t, c)
		assert.Same(t, l.session, s, "QUIC answers: QUIC at once")
		assert.Zero(t, waited)
	})
}

// TestLoopNoTCPWhileTheServerAnswersOverUDP: a server that answered over
// UDP is not a blocked path, and its TCP row dials nothing: while it
// refuses our credentials (TCP would be refused too), and while it asked
// us to wait before reconnecting (a restart's spread; the fallback delay
// counts from its end).
func TestLoopNoTCPWhileTheServerAnswersOverUDP(t *testing.T) {
	t.Parallel()
	const spread = 4 * time.Second
	for _, tc := range []struct {
		name   string
		mark   func(m *member)
		spread bool          // the server's close asked us to wait (quicLink.down: waitSpread)
		dialAt time.Duration // 0: never within a minute
	}{
		{name: "credentials refused", mark: func(m *member) { m.refused, m.downSince = true, time.Now() }},
		{name: "reconnect spread", mark: func(m *member) { m.downSince = time.Now() }, spread: true, dialAt: spread + time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				c := fakeClient(t, ModeFailover, 1, "a")
				c.cfg.FallbackDelay = time.Second
				d := newFakeDialer(0)
				c.markRow(c.members[0], tc.mark) // as quicLink.down does
				stop := runLoops(t, c, d)
				defer stop()
				var spreading sync.WaitGroup
				defer spreading.Wait()
				if tc.spread {
					spreading.Go(func() { c.waitSpread(t.Context(), c.members[0], spread) })
				}

				start := time.Now()
				for d.count() == 0 && time.Since(start) < time.Minute {
					time.Sleep(10 * time.Millisecond)
				}
				if tc.dialAt == 0 {
					assert.Zero(t, d.count(), "no TCP dial in a minute")
					return
				}
				d.mu.Lock()
				defer d.mu.Unlock()
				require.NotEmpty(t, d.times, "a TCP dial after the spread")
				assert.Equal(t, tc.dialAt, d.times[0].Sub(start), "the first TCP dial: the fallback delay after the spread")
			})
		})
	}
}

// failingQUIC is a QUIC dialer whose dials fail with err after took, as a
// blocked path (a handshake timeout) or a server that refuses our
// credentials does; it counts them.
type failingQUIC struct {
	took time.Duration
	err  error
	mu   sync.Mutex
	n    int
}

func (f *failingQUIC) dialQUIC(ctx context.Context, _ *quic.Transport, _ *member) (quicConn, error) {
	sleep(ctx, f.took)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	return nil, f.err
}

func (f *failingQUIC) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// runQUIC starts c's QUIC links (supervise) on q in the bubble, beside
// its TCP links on d; the returned stop ends them all and waits.
func runQUIC(t *testing.T, c *Client, q *failingQUIC, d *fakeDialer) (stop func()) {
	t.Helper()
	c.quicDialer = q
	stopTCP := runLoops(t, c, d)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for _, m := range c.members {
		wg.Go(func() { c.supervise(ctx, nil, m) })
	}
	return func() { cancel(); wg.Wait(); stopTCP() }
}

// TestLoopsUDPBlocked: both loops of a server, QUIC and TCP, on fakes: the
// QUIC dials time out (UDP blocked), the TCP row dials once QUIC has been
// down for the fallback delay, and a tunnel goes over TCP then; QUIC is
// tried again in the background, and one TCP connection carries on.
func TestLoopsUDPBlocked(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a")
		c.cfg.FallbackDelay = time.Second
		q := &failingQUIC{took: 3 * time.Second, err: &quic.HandshakeTimeoutError{}}
		d := newFakeDialer(10 * time.Millisecond)
		stop := runQUIC(t, c, q, d)
		defer stop()

		s, waited := placed(t, c)
		assert.Equal(t, TransportTCP, s.Transport())
		assert.Equal(t, 1010*time.Millisecond, waited, "the fallback delay, then the TCP dial")
		time.Sleep(time.Minute)
		assert.GreaterOrEqual(t, q.count(), 3, "QUIC tried again while TCP carries tunnels")
		assert.Equal(t, 1, d.count(), "one TCP connection")
	})
}

// TestLoopsWrongSecret: the server refuses our credentials over QUIC (it
// answered over UDP): in a minute the QUIC link makes at most 8 attempts
// (authBackoff) and the TCP row dials nothing (it would be refused too).
func TestLoopsWrongSecret(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a")
		c.cfg.FallbackDelay = time.Second
		refused := &quic.ApplicationError{Remote: true, ErrorCode: proto.CodeAuthFailed.ApplicationErrorCode()}
		q := &failingQUIC{took: time.Millisecond, err: refused}
		d := newFakeDialer(10 * time.Millisecond)
		stop := runQUIC(t, c, q, d)
		defer stop()

		time.Sleep(time.Minute)
		assert.LessOrEqual(t, q.count(), 8, "QUIC attempts in a minute")
		assert.GreaterOrEqual(t, q.count(), 3)
		assert.Zero(t, d.count(), "no TCP dial")
	})
}

// TestLoopTCPFailbackAfter: failover's hysteresis holds over TCP rows as
// over QUIC links: UDP blocked, two servers; the first dies, tunnels go
// to the second; when the first's row is up again, new tunnels go back
// to it only once it has been up for FailbackAfter.
func TestLoopTCPFailbackAfter(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a", "b")
		d := newFakeDialer(20 * time.Millisecond)
		quicDown(c)
		stop := runLoops(t, c, d)
		defer stop()

		s, _ := placed(t, c)
		synctest.Wait()
		d.mu.Lock()
		a, b := d.live["a"], d.live["b"]
		d.mu.Unlock()
		assert.Same(t, a, s.Conn, "the first server")
		time.Sleep(time.Minute)
		d.kill("a")
		synctest.Wait()
		s, _ = placed(t, c)
		assert.Same(t, b, s.Conn, "a died: b")

		d.revive("a")
		var upAt time.Time
		eventually(t, 15*time.Second, "a's row up again", func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			upAt = c.servers[0].tcp.upAt
			return c.servers[0].tcp.liveLocked()
		})
		time.Sleep(time.Until(upAt.Add(c.cfg.FailbackAfter - time.Millisecond)))
		s, _ = placed(t, c)
		assert.Same(t, b, s.Conn, "a up for less than FailbackAfter: still b")
		time.Sleep(time.Millisecond)
		s, _ = placed(t, c)
		d.mu.Lock()
		a = d.live["a"]
		d.mu.Unlock()
		assert.Same(t, a, s.Conn, "a up for FailbackAfter: back to a")
	})
}

// TestLoopTCPRoleFollowsHealth: while TCP carries new tunnels (UDP
// blocked), failover's role is the TCP rows' and follows their health,
// not the next tunnel: server_active names the first server, then, once
// it died and before any tunnel, the second, with the move counted; and
// the first again once its row has been up for FailbackAfter.
func TestLoopTCPRoleFollowsHealth(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a", "b")
		d := newFakeDialer(20 * time.Millisecond)
		quicDown(c)
		stop := runLoops(t, c, d)
		defer stop()

		time.Sleep(time.Minute)
		assert.Equal(t, "a", activeServer(c))
		d.kill("a")
		synctest.Wait()
		assert.Equal(t, uint64(1), c.Switches(), "moved with no tunnel placed nor scrape")
		assert.Equal(t, "b", activeServer(c), "a died: b")
		d.revive("a")
		time.Sleep(time.Minute)
		assert.Equal(t, uint64(2), c.Switches(), "moved back with no tunnel placed nor scrape")
		assert.Equal(t, "a", activeServer(c), "a up again for FailbackAfter")
	})
}

// TestWaitSessionBounds: a tunnel with no link to go on gives up
// SessionWait after it started waiting (the timer is made at its first
// wait, not before: a tunnel placed at once needs none), and one placed
// once a link comes up waits no longer than that.
func TestWaitSessionBounds(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a")
		c.cfg.SessionWait = 3 * time.Second
		start := time.Now()
		_, _, err := c.waitSession(t.Context())
		require.ErrorIs(t, err, ErrNoSession)
		require.Equal(t, 3*time.Second, time.Since(start))

		var wg sync.WaitGroup
		wg.Go(func() {
			time.Sleep(time.Second)
			_, cancel := up(t, c, c.members[0], time.Now())
			t.Cleanup(cancel)
		})
		s, waited := placed(t, c)
		require.NotNil(t, s)
		require.Equal(t, time.Second, waited)
		wg.Wait()
		s, waited = placed(t, c)
		require.NotNil(t, s)
		require.Zero(t, waited)
	})
}
