package client

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tcpUp gives s's TCP row a live session that holds new tunnels back
// until graceUntil; its cancel ends it.
func tcpUp(t *testing.T, c *Client, s *server, graceUntil time.Time) (*session, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	sess := &session{Conn: fakeConn{ctx}}
	c.mu.Lock()
	s.tcp.sess, s.tcp.graceUntil = sess, graceUntil
	c.mu.Unlock()
	c.sessionsChanged()
	return sess, cancel
}

func wanted(c *Client, s *server, now time.Time) (bool, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tcpWantedLocked(s, now)
}

// TestTCPWanted: when a server's TCP row holds a connection, by mode and
// by what its QUIC rows of the table say.
func TestTCPWanted(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		name            string
		mode            string
		downSince       time.Time
		quicUp, suspect bool
		refused         bool
		want            bool
		lookAt          time.Time
	}{
		{name: "tcp mode", mode: TransportTCP, want: true},
		{name: "quic mode, QUIC down for long", mode: TransportQUIC, downSince: now.Add(-time.Hour)},
		{name: "auto, before any dial", mode: TransportAuto},
		{name: "auto, QUIC dialing for less than the delay", mode: TransportAuto, downSince: now, lookAt: now.Add(time.Second)},
		{name: "auto, QUIC down for the delay", mode: TransportAuto, downSince: now.Add(-time.Second), want: true},
		{name: "auto, QUIC up", mode: TransportAuto, quicUp: true},
		{name: "auto, QUIC up but its path silent", mode: TransportAuto, quicUp: true, suspect: true, want: true},
		{name: "auto, credentials refused over QUIC", mode: TransportAuto, downSince: now.Add(-time.Hour), refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := fakeClient(t, ModeFailover, 1, "a")
			c.cfg.Transport = tc.mode
			m := c.members[0]
			m.downSince, m.refused = tc.downSince, tc.refused
			if tc.quicUp {
				l, _ := up(t, c, m, now)
				l.suspect.Store(tc.suspect)
			}
			got, at := wanted(c, c.servers[0], now)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.lookAt, at)
		})
	}
}

// TestTCPWantedPerServer: a server's TCP row is wanted while no QUIC link
// to that server answers, whatever the other server's do; with several
// connections to a server, one that answers is enough.
func TestTCPWantedPerServer(t *testing.T) {
	t.Parallel()
	c := fakeClient(t, ModeFailover, 2, "a", "b")
	now := time.Now()
	a0, _ := up(t, c, c.members[0], now)
	a1, _ := up(t, c, c.members[1], now)
	c.members[2].downSince = now.Add(-time.Hour) // b: QUIC down for long
	want := func(s *server) bool { w, _ := wanted(c, s, now); return w }
	assert.False(t, want(c.servers[0]), "a answers")
	assert.True(t, want(c.servers[1]), "b's QUIC down: TCP for b")
	a0.suspect.Store(true)
	assert.False(t, want(c.servers[0]), "a's second connection still answers")
	a1.suspect.Store(true)
	assert.True(t, want(c.servers[0]), "every path to a silent")
	a1.suspect.Store(false)
	assert.False(t, want(c.servers[0]), "a answers again")
}

// TestTCPWaitsForAnsweringHandshake: a QUIC handshake the server answers
// over UDP (a slow server, not a blocked path) holds the TCP row back for
// answeringGrace past the delay; a silent one does not.
func TestTCPWaitsForAnsweringHandshake(t *testing.T) {
	t.Parallel()
	c := fakeClient(t, ModeFailover, 1, "a")
	start := time.Now()
	m := c.members[0]
	m.downSince = start
	f := &quicFake{fakeConn: fakeConn{t.Context()}, hs: make(chan struct{})} // in its handshake
	c.setSession(m, &session{Conn: f}, f)
	got, at := wanted(c, c.servers[0], start.Add(500*time.Millisecond))
	assert.False(t, got, "within the delay")
	assert.Equal(t, start.Add(time.Second), at)

	got, _ = wanted(c, c.servers[0], start.Add(1500*time.Millisecond))
	assert.True(t, got, "nothing came back over UDP: blocked, TCP")

	f.rx.Store(3) // the server answered the handshake
	now := start.Add(1500 * time.Millisecond)
	got, at = wanted(c, c.servers[0], now)
	assert.False(t, got, "UDP gets through: wait for the handshake")
	assert.Equal(t, now.Add(answeringPoll), at, "and look again soon")
	got, _ = wanted(c, c.servers[0], start.Add(time.Second+answeringGrace))
	assert.True(t, got, "not for longer than answeringGrace")
}

// TestPickWaitsForQUICAfterBlackout: when the TCP row came up while a
// QUIC link that was up has only gone silent (a blackout, which TCP
// crossed as the link came back), new tunnels wait for QUIC until the
// row's grace ends, then take TCP (UDP blocked); a QUIC link that answers
// is taken at once. Without a QUIC link that was up (UDP blocked from the
// start) TCP is taken at once.
func TestPickWaitsForQUICAfterBlackout(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 500*time.Millisecond, quicGrace(200*time.Millisecond, 100*time.Millisecond), "two heartbeats and the TCP handshake")
	assert.Equal(t, minQUICGrace, quicGrace(0, 0))

	c := fakeClient(t, ModeFailover, 1, "a")
	now := time.Now()
	pick := func(at time.Time) (*session, *link, time.Time) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.pick(at)
	}
	grace := now.Add(500 * time.Millisecond)
	tcp, _ := tcpUp(t, c, c.servers[0], grace)
	s, l, _ := pick(now)
	assert.Same(t, tcp, s, "QUIC never up: TCP at once")
	assert.Nil(t, l)

	q, _ := up(t, c, c.members[0], now)
	q.suspect.Store(true)
	s, _, retry := pick(now)
	assert.Nil(t, s, "silent QUIC, TCP just up: wait")
	assert.Equal(t, grace, retry)
	s, _, _ = pick(grace)
	assert.Same(t, tcp, s, "QUIC still silent after the grace: TCP")

	q.suspect.Store(false)
	s, l, _ = pick(now)
	assert.Same(t, q.session, s, "QUIC answers: QUIC")
	assert.Same(t, q, l)
	assert.Equal(t, int64(1), q.active.Load(), "counted on the QUIC link")
}

// TestPickTCPRowsPerServer: with UDP blocked, each server's TCP row is a
// row of the table: failover takes the first live one in order, and the
// next one once the first ends.
func TestPickTCPRowsPerServer(t *testing.T) {
	t.Parallel()
	c := fakeClient(t, ModeFailover, 1, "a", "b")
	now := time.Now()
	ta, endA := tcpUp(t, c, c.servers[0], time.Time{})
	tb, _ := tcpUp(t, c, c.servers[1], time.Time{})
	c.mu.Lock()
	s, _, _ := c.pick(now)
	c.mu.Unlock()
	require.Same(t, ta, s)
	endA()
	c.mu.Lock()
	s, _, _ = c.pick(now)
	c.mu.Unlock()
	assert.Same(t, tb, s, "a's TCP connection ended: b's")
}
