package client

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/liveness"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/tunnel"
)

// quicFake is a fake QUIC connection (a quicConn and its streams): its
// handshake is done when it is dialed, it lives until closed or its
// server dies, it answers each hello with its server's reply, and it
// echoes heartbeats (and acknowledges anything sent) while its path is
// not dark. Its new paths (a rescue) validate once the server's path
// is back (quicServers.heal).
type quicFake struct {
	fakeConn
	cancel context.CancelCauseFunc
	srv    *fakeQUICServer
	in     chan []byte
	rx     atomic.Uint64
	hs     chan struct{}
}

func (f *quicFake) CloseWithError(code quic.ApplicationErrorCode, msg string) error {
	f.cancel(&quic.ApplicationError{ErrorCode: code, ErrorMessage: msg})
	return nil
}

func (*quicFake) Transport() string                    { return TransportQUIC }
func (f *quicFake) HandshakeComplete() <-chan struct{} { return f.hs }
func (f *quicFake) LocalAddr() net.Addr                { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000} }
func (f *quicFake) RemoteAddr() net.Addr               { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 7500} }
func (f *quicFake) streams() ingress.Conn              { return f }
func (f *quicFake) ConnectionState() quic.ConnectionState {
	var s quic.ConnectionState
	s.SupportsDatagrams.Remote = true
	return s
}

func (f *quicFake) ConnectionStats() quic.ConnectionStats {
	return quic.ConnectionStats{PacketsReceived: f.rx.Load(), SmoothedRTT: 10 * time.Millisecond}
}

func (f *quicFake) nextConnection(context.Context) (quicConn, error) {
	return nil, errors.New("no 0-RTT on a fake")
}

// SendDatagram: while the path answers, a heartbeat is echoed and any
// datagram acknowledged (a packet received).
func (f *quicFake) SendDatagram(b []byte) error {
	if f.ctx.Err() != nil {
		return net.ErrClosed
	}
	if f.srv.dark.Load() {
		return nil
	}
	f.rx.Add(1)
	if len(b) > 0 && b[0] == liveness.TypeHeartbeat {
		select {
		case f.in <- append([]byte{liveness.TypeEcho}, b[1:]...):
		default:
		}
	}
	return nil
}

func (f *quicFake) ReceiveDatagram(ctx context.Context) ([]byte, error) {
	select {
	case b := <-f.in:
		return b, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-f.ctx.Done():
		return nil, net.ErrClosed
	}
}

// OpenStreamSync opens a stream whose server answers a header (a hello)
// with its server's reply.
func (f *quicFake) OpenStreamSync(context.Context) (ingress.Stream, error) {
	if f.ctx.Err() != nil {
		return nil, net.ErrClosed
	}
	var b bytes.Buffer
	_ = proto.WriteReply(&b, f.srv.reply)
	if f.srv.reply == proto.CodeAuthFailed { // the server closes the connection too
		f.cancel(&quic.ApplicationError{Remote: true, ErrorCode: proto.CodeAuthFailed.ApplicationErrorCode()})
	}
	return &replyStream{&b}, nil
}

func (f *quicFake) addPath(*quic.Transport) (quicPath, error) {
	f.srv.paths.Add(1)
	return &fakePath{f}, nil
}

// fakePath is a new path of a quicFake: it validates while the server's
// path answers again (heal), and switching to it ends the blackout.
type fakePath struct{ f *quicFake }

func (p *fakePath) Probe(ctx context.Context) error {
	if p.f.srv.healed.Load() {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (p *fakePath) Switch() error {
	p.f.srv.dark.Store(false)
	return nil
}

func (*fakePath) Close() error { return nil }

// replyStream is a stream whose writes are dropped and whose reads return
// the server's reply.
type replyStream struct {
	*bytes.Buffer
}

func (*replyStream) Write(b []byte) (int, error)      { return len(b), nil }
func (*replyStream) Close() error                     { return nil }
func (*replyStream) CancelRead(quic.StreamErrorCode)  {}
func (*replyStream) CancelWrite(quic.StreamErrorCode) {}
func (*replyStream) StreamID() quic.StreamID          { return 0 }
func (*replyStream) SetReadDeadline(time.Time) error  { return nil }
func (*replyStream) SetWriteDeadline(time.Time) error { return nil }

// fakeQUICServer is one server as quicServers fakes it.
type fakeQUICServer struct {
	down atomic.Bool // dials time out (after handshakeTimeout)
	dark atomic.Bool // the path drops everything (a blackout)
	// healed: a new path validates (the blackout is on the old path only).
	healed atomic.Bool
	paths  atomic.Int64 // paths added (rescues, moves)
	reply  proto.Code   // its answer to a hello
}

// quicServers is a quicDialer of fake connections: a dial to a server
// marked down fails after handshakeTimeout (as over a blocked path);
// each dial's server and end time are recorded.
type quicServers struct {
	tookFor map[string]time.Duration // a handshake's time by server (default 10 ms)
	mu      sync.Mutex
	srv     map[string]*fakeQUICServer
	live    map[string]*quicFake
	dials   []string
	times   []time.Time
}

const handshakeTimeout = 3 * time.Second

func newQUICServers(labels ...string) *quicServers {
	q := &quicServers{srv: map[string]*fakeQUICServer{}, live: map[string]*quicFake{}}
	for _, l := range labels {
		q.srv[l] = &fakeQUICServer{reply: proto.CodeOK}
	}
	return q
}

func (q *quicServers) dialQUIC(ctx context.Context, _ *quic.Transport, m *member) (quicConn, error) {
	s := q.srv[m.srv.label]
	if s.down.Load() {
		sleep(ctx, handshakeTimeout)
	} else if took, ok := q.tookFor[m.srv.label]; ok {
		sleep(ctx, took)
	} else {
		sleep(ctx, 10*time.Millisecond) // one round trip
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.dials = append(q.dials, m.srv.label)
	q.times = append(q.times, time.Now())
	if s.down.Load() || ctx.Err() != nil {
		return nil, &quic.HandshakeTimeoutError{}
	}
	cctx, cancel := context.WithCancelCause(ctx)
	hs := make(chan struct{})
	close(hs)
	f := &quicFake{fakeConn: fakeConn{cctx}, cancel: cancel, srv: s, in: make(chan []byte, 16), hs: hs}
	q.live[m.srv.label] = f
	return f, nil
}

// kill stops server label: its connection ends (no answer: an idle
// timeout), dials to it time out.
func (q *quicServers) kill(label string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.srv[label].down.Store(true)
	if f := q.live[label]; f != nil {
		f.cancel(&quic.IdleTimeoutError{})
	}
}

func (q *quicServers) revive(label string) { q.srv[label].down.Store(false) }

// conn is server label's last connection.
func (q *quicServers) conn(label string) *quicFake {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.live[label]
}

func (q *quicServers) count(label string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, d := range q.dials {
		if d == label {
			n++
		}
	}
	return n
}

// runLinks starts c's QUIC links on q and its TCP links on d in the
// bubble, as Run does (tr: the main socket's transport, nil when no
// rescue runs), with heartbeats every 200 ms, RescueAfter 1 s, a shared
// secret (each connection's hello) and backoff delays at their ceiling;
// the returned stop ends them and waits.
func runLinks(t *testing.T, c *Client, q quicDialer, d *fakeDialer, tr *quic.Transport) (stop func()) {
	t.Helper()
	c.quicDialer = q
	c.cfg.Registry = tunnel.NewRegistry()
	c.cfg.HeartbeatInterval, c.cfg.RescueAfter, c.cfg.IdleAfter = 200*time.Millisecond, time.Second, 5*time.Second
	for _, m := range c.members {
		m.bo.Rand = func() float64 { return 1 }
	}
	stopTCP := runLoops(t, c, d)
	c.SetSecret([]byte("secret"))
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for _, m := range c.members {
		wg.Go(func() { c.supervise(ctx, tr, m) })
	}
	return func() { cancel(); wg.Wait(); stopTCP() }
}

// eventually polls cond every millisecond of virtual time for up to
// limit, lets the rest of that instant run (synctest.Wait: goroutines of
// one instant run in any order) and requires cond then.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(limit); !cond() && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	synctest.Wait()
	require.True(t, cond(), what)
}

// quicOnly makes c a --transport quic client (no TCP rows).
func quicOnly(c *Client) {
	c.cfg.Transport = TransportQUIC
	for _, s := range c.servers {
		s.tcp = nil
	}
}

// TestQUICLoopServeLostRedial: the QUIC link loop on a fake connection,
// dial -> hello -> serve -> lost -> backoff: a tunnel waiting for the
// link goes on it as its handshake ends, the hello makes the client
// ready; a connection lost after a minute up (a server restart) is
// redialed at once, one lost right after it came up only after the
// backoff.
func TestQUICLoopServeLostRedial(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a")
		quicOnly(c)
		q := newQUICServers("a")
		stop := runLinks(t, c, q, newFakeDialer(0), nil)
		defer stop()
		met := c.cfg.Metrics

		s, waited := placed(t, c)
		assert.Same(t, q.conn("a"), s.Conn, "the tunnel goes on the QUIC link")
		assert.Equal(t, 10*time.Millisecond, waited, "as its handshake ends")
		synctest.Wait()
		assert.True(t, c.Ready(), "the server accepted our hello")
		assert.Equal(t, 1.0, promtest.ToFloat64(met.DialsTotal.WithLabelValues("ok")))
		assert.Equal(t, 1.0, promtest.ToFloat64(met.SessionUp))

		time.Sleep(time.Minute)
		q.conn("a").cancel(&quic.StatelessResetError{}) // the server restarted
		synctest.Wait()
		assert.False(t, c.Ready(), "no link")
		s, waited = placed(t, c)
		assert.Same(t, q.conn("a"), s.Conn, "the new connection")
		assert.Equal(t, 10*time.Millisecond, waited, "redialed at once")
		assert.Equal(t, 1.0, promtest.ToFloat64(met.ReconnectsTotal))

		q.conn("a").cancel(&quic.StatelessResetError{}) // at once after it came up
		s, waited = placed(t, c)
		assert.Same(t, q.conn("a"), s.Conn)
		assert.Equal(t, 110*time.Millisecond, waited, "the backoff (100 ms), then the dial")
		assert.Equal(t, 3, q.count("a"))
	})
}

// TestQUICLoopFailoverFailback: two servers, both QUIC links on fakes in
// failover mode: tunnels go to the first; it dies: the next tunnel goes
// to the second at once; it comes back: its link redials, and tunnels go
// back to it only once it has been healthy for FailbackAfter.
func TestQUICLoopFailoverFailback(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a", "b")
		quicOnly(c)
		q := newQUICServers("a", "b")
		stop := runLinks(t, c, q, newFakeDialer(0), nil)
		defer stop()

		// Both handshakes end at one instant; a tunnel placed before a's
		// link is up goes on b's (TestQUICLoopRoleAtStart).
		eventually(t, time.Second, "both links up", func() bool {
			return c.current(c.members[0]).healthy() && c.current(c.members[1]).healthy()
		})
		s, _ := placed(t, c)
		assert.Same(t, q.conn("a"), s.Conn, "the first server")
		time.Sleep(time.Minute)
		q.kill("a")
		synctest.Wait()
		s, waited := placed(t, c)
		assert.Same(t, q.conn("b"), s.Conn, "a died: b")
		assert.Zero(t, waited, "at once")
		assert.Equal(t, "b", activeServer(c))

		time.Sleep(10 * time.Second)
		q.revive("a")
		a := c.servers[0].members[0]
		eventually(t, 15*time.Second, "a's link redials within its backoff", func() bool { return c.current(a).healthy() })
		upAt := time.Unix(0, c.current(a).readyAt.Load())
		time.Sleep(time.Until(upAt.Add(c.cfg.FailbackAfter - time.Millisecond)))
		s, _ = placed(t, c)
		assert.Same(t, q.conn("b"), s.Conn, "a healthy for less than FailbackAfter: still b")
		time.Sleep(time.Millisecond)
		s, _ = placed(t, c)
		assert.Same(t, q.conn("a"), s.Conn, "a healthy for FailbackAfter: back to a")
		assert.Equal(t, uint64(2), c.Switches(), "over and back")
	})
}

// TestQUICLoopRescue: the watch of a QUIC link on a fake whose path goes
// dark: after RescueAfter without an echo or a packet the link is stalled
// and suspect, its server's TCP row is dialed at once, and a tunnel
// opened meanwhile goes over TCP after the grace; a rescue probes a new
// path, switches to it once it validates, the echoes come back: the
// suspicion ends, new tunnels go over QUIC again, and the unused TCP
// connection is closed. The QUIC connection is never redialed.
func TestQUICLoopRescue(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		defer func() { _ = pc.Close() }()
		c := fakeClient(t, ModeFailover, 1, "a")
		q := newQUICServers("a")
		d := newFakeDialer(20 * time.Millisecond)
		stop := runLinks(t, c, q, d, &quic.Transport{Conn: pc})
		defer stop()
		met := c.cfg.Metrics

		s, _ := placed(t, c)
		assert.Same(t, q.conn("a"), s.Conn)
		// Dark within IdleAfter (heartbeats on), between two ticks (at
		// 10 ms + n x 200 ms): the last echo and packet came at the tick
		// before or, as goroutines of one instant run in any order, that
		// tick's packet shows at the next one.
		time.Sleep(2*time.Second + 100*time.Millisecond)
		q.srv["a"].dark.Store(true)
		dark := time.Now()
		l := c.current(c.members[0])
		eventually(t, 5*time.Second, "the link suspect", l.suspect.Load)
		assert.WithinRange(t, time.Now(), dark.Add(time.Second), dark.Add(time.Second+2*c.cfg.HeartbeatInterval),
			"suspect at the first tick after RescueAfter")
		assert.True(t, l.stalled.Load(), "stalled too")
		time.Sleep(20 * time.Millisecond) // the TCP dial
		synctest.Wait()
		require.Equal(t, 1, d.count(), "the TCP row dialed at once")
		s, _ = placed(t, c)
		assert.Equal(t, TransportTCP, s.Transport(), "TCP while the path is dark")
		d.mu.Lock()
		tcpUp := d.times[0]
		d.mu.Unlock()
		assert.Equal(t, tcpUp.Add(quicGrace(c.cfg.HeartbeatInterval, 20*time.Millisecond)), time.Now(),
			"placed once the grace for QUIC ended")

		time.Sleep(time.Second)
		q.srv["a"].healed.Store(true) // a new path gets through
		eventually(t, 5*time.Second, "the suspicion ends", func() bool { return !l.suspect.Load() })
		assert.Equal(t, 1.0, promtest.ToFloat64(met.PathRescuesTotal.WithLabelValues("switched")))
		assert.Equal(t, int64(1), q.srv["a"].paths.Load(), "one rescue")
		assert.False(t, l.stalled.Load(), "echoes again")
		s, _ = placed(t, c)
		assert.Same(t, q.conn("a"), s.Conn, "QUIC again")
		time.Sleep(2 * time.Second)
		d.mu.Lock()
		tcpConn := d.live["a"]
		d.mu.Unlock()
		assert.Error(t, tcpConn.ctx.Err(), "the unused TCP connection is closed")
		assert.Equal(t, 1, q.count("a"), "the same QUIC connection throughout")
	})
}

// TestQUICLoopRoleAtStart: two servers, the second's handshake ends
// first: a tunnel waiting meanwhile goes on the second's link (the only
// one up), but the role waits for the first's outcome: once it is up it
// is the active server with no failover or failback counted (before, the
// second took the role with that tunnel and the first took it back at
// once: a "Failing back" line at every start).
func TestQUICLoopRoleAtStart(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a", "b")
		quicOnly(c)
		q := newQUICServers("a", "b")
		q.tookFor = map[string]time.Duration{"a": 50 * time.Millisecond, "b": 10 * time.Millisecond}
		stop := runLinks(t, c, q, newFakeDialer(0), nil)
		defer stop()

		s, waited := placed(t, c)
		assert.Same(t, q.conn("b"), s.Conn, "the only link up")
		assert.Equal(t, 10*time.Millisecond, waited)
		assert.Empty(t, activeServer(c), "no role before the first server's outcome")
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, "a", activeServer(c))
		s, _ = placed(t, c)
		assert.Same(t, q.conn("a"), s.Conn)
		assert.Zero(t, c.Switches(), "no failover, no failback")
	})
}

// TestQUICLoopHelloRefused: the server completes the handshake but
// refuses our hello (a wrong secret) and closes the connection: in a
// minute the QUIC link makes 3 to 8 attempts (authBackoff), the client
// is never ready, and the TCP row dials nothing (UDP gets through; TCP
// would be refused too).
func TestQUICLoopHelloRefused(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a")
		c.cfg.FallbackDelay = time.Second
		q := newQUICServers("a")
		q.srv["a"].reply = proto.CodeAuthFailed
		d := newFakeDialer(10 * time.Millisecond)
		stop := runLinks(t, c, q, d, nil)
		defer stop()

		ready := false
		for range 600 {
			time.Sleep(100 * time.Millisecond)
			ready = ready || c.Ready()
		}
		assert.False(t, ready, "never ready")
		assert.GreaterOrEqual(t, q.count("a"), 3, "QUIC attempts in a minute")
		assert.LessOrEqual(t, q.count("a"), 8)
		assert.Zero(t, d.count(), "no TCP dial")
		assert.GreaterOrEqual(t, promtest.ToFloat64(c.cfg.Metrics.ReconnectsTotal), 2.0)
	})
}

// TestQUICLoopUpgradeRedialsAtOnce: a server's upgrade close
// (proto.UpgradeReason) is redialed at once even right after the
// connection came up, and again after a second one (no backoff: the new
// process serves at once and the tunnels wait to re-attach); a plain
// shutdown close right after the connection came up waits for the
// backoff.
func TestQUICLoopUpgradeRedialsAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := fakeClient(t, ModeFailover, 1, "a")
		quicOnly(c)
		q := newQUICServers("a")
		stop := runLinks(t, c, q, newFakeDialer(0), nil)
		defer stop()
		placed(t, c)
		synctest.Wait()
		closeWith := func(reason string) {
			q.conn("a").cancel(&quic.ApplicationError{Remote: true, ErrorCode: proto.CodeShutdown.ApplicationErrorCode(), ErrorMessage: reason})
		}
		for i := range 2 {
			closeWith(proto.UpgradeReason) // at once after it came up
			s, waited := placed(t, c)
			assert.Same(t, q.conn("a"), s.Conn)
			assert.Equal(t, 10*time.Millisecond, waited, "upgrade %d: redialed at once, no backoff", i+1)
		}
		closeWith(proto.ShutdownReason(0))
		_, waited := placed(t, c)
		assert.Equal(t, 110*time.Millisecond, waited, "a shutdown right after it came up: the backoff (100 ms), then the dial")
	})
}

// halfPipe is one end of a net.Pipe with CloseWrite (a splice.Conn).
type halfPipe struct{ net.Conn }

func (h halfPipe) CloseWrite() error { return h.Close() }

// TestQUICLoopParkedTunnelsRedialSoon: while resumable tunnels wait for a
// connection the path lost (an idle timeout: a blackout), the dials of a
// long outage come at most parkedRedialMax apart after each attempt,
// instead of the backoff grown to its 10 s maximum: the tunnels come back
// within about a second of the path (a 5 min blackout on the bench: 9 s
// before). Without parked tunnels, or when the server reset the connection
// (a restart: every client reconnects), the backoff is unchanged.
func TestQUICLoopParkedTunnelsRedialSoon(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		parked, reset bool
		soon          bool
	}{
		{"no tunnel parked", false, false, false},
		{"parked, path lost", true, false, true},
		{"parked, server reset", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				c := fakeClient(t, ModeFailover, 1, "a")
				quicOnly(c)
				c.cfg.Resume = &ingress.Resume{Table: resume.NewTable()}
				if tc.parked {
					app, _ := net.Pipe()
					p := resume.NewPipe(halfPipe{app}, resume.Config{ID: resume.ID{1}, Window: time.Hour})
					remove, err := c.cfg.Resume.Table.Add(resume.ID{1}, "", p)
					require.NoError(t, err)
					defer func() { remove(); p.Abort(proto.CodeShutdown); <-p.Ended() }()
				}
				q := newQUICServers("a")
				stop := runLinks(t, c, q, newFakeDialer(0), nil)
				defer stop()
				placed(t, c)
				synctest.Wait()
				time.Sleep(time.Minute)
				if tc.reset {
					q.srv["a"].down.Store(true)
					q.conn("a").cancel(&quic.StatelessResetError{})
				} else {
					q.kill("a")
				}
				time.Sleep(3 * time.Minute) // the backoff reaches its maximum
				q.mu.Lock()
				times := slices.Clone(q.times)
				q.mu.Unlock()
				q.revive("a")
				require.Greater(t, len(times), 4)
				gap := times[len(times)-1].Sub(times[len(times)-2])
				if tc.soon {
					assert.LessOrEqual(t, gap, handshakeTimeout+parkedRedialMax, "a failed attempt, then at most parkedRedialMax")
				} else {
					assert.Greater(t, gap, handshakeTimeout+5*time.Second, "a failed attempt, then the backoff's maximum")
				}
				placed(t, c)
			})
		})
	}
}
