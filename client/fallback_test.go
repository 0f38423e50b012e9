package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestFallbackWanted: when a TCP connection is kept, by mode and by what
// the supervisor reported about QUIC.
func TestFallbackWanted(t *testing.T) {
	t.Parallel()
	now := time.Now()
	delay := time.Second
	for _, tc := range []struct {
		name      string
		mode      string
		downSince time.Time
		quicUp    bool
		suspect   bool
		want      bool
		lookAt    time.Time
	}{
		{name: "tcp mode", mode: TransportTCP, want: true},
		{name: "quic mode, QUIC down for long", mode: TransportQUIC, downSince: now.Add(-time.Hour)},
		{name: "auto, before any dial", mode: TransportAuto},
		{name: "auto, QUIC dialing for less than the delay", mode: TransportAuto, downSince: now, lookAt: now.Add(delay)},
		{name: "auto, QUIC down for the delay", mode: TransportAuto, downSince: now.Add(-delay), want: true},
		{name: "auto, QUIC up", mode: TransportAuto, quicUp: true},
		{name: "auto, QUIC up but its path silent", mode: TransportAuto, quicUp: true, suspect: true, want: true},
	} {
		// connection 1 of several (a member: a server, --connections)
		f := newFallback(nil, tc.mode, "", delay)
		f.downSince = tc.downSince
		if tc.quicUp {
			f.up[1] = true
		}
		if tc.suspect {
			f.suspect[1] = true
		}
		got, at := f.wantedLocked(now)
		assert.Equal(t, tc.want, got, tc.name)
		assert.Equal(t, tc.lookAt, at, tc.name)
	}
}

// TestFallbackSeveralConnections: QUIC is usable while one of the client's
// connections (servers, --connections) is up with a path that answers.
func TestFallbackSeveralConnections(t *testing.T) {
	t.Parallel()
	f := newFallback(nil, TransportAuto, "", time.Second)
	f.quicDialing()
	f.quicUsable("a", true)
	f.quicUsable("b", true)
	want := func() bool { w, _ := f.wantedLocked(time.Now()); return w }
	assert.False(t, want(), "two connections up")
	f.quicSuspect("a", true)
	assert.False(t, want(), "b still answers")
	f.quicSuspect("b", true)
	assert.True(t, want(), "every path silent")
	f.quicSuspect("a", false)
	assert.False(t, want(), "a answers again")
	f.quicUsable("a", false)
	assert.True(t, want(), "a ended, b silent")
	f.quicUsable("b", false)
	assert.False(t, want(), "all ended: wait for the delay first")
	f.downSince = time.Now().Add(-2 * time.Second)
	assert.True(t, want(), "all ended for longer than the delay")
	f.quicUsable("b", true)
	assert.False(t, want(), "b back")
	assert.True(t, f.downSince.IsZero())
}

type fakeRx uint64

func (r *fakeRx) PacketsReceived() uint64 { return uint64(*r) }

// TestFallbackWaitsForAnsweringHandshake: a QUIC handshake the server
// answers over UDP (a slow server, not a blocked path) holds the TCP
// fallback back for answeringGrace past the delay; a silent one does not.
func TestFallbackWaitsForAnsweringHandshake(t *testing.T) {
	t.Parallel()
	f := newFallback(nil, TransportAuto, "", time.Second)
	f.quicDialing()
	var rx fakeRx
	f.quicPending("a", &rx)
	start := f.downSince
	got, at := f.wantedLocked(start.Add(500 * time.Millisecond))
	assert.False(t, got, "within the delay")
	assert.Equal(t, start.Add(time.Second), at)

	got, _ = f.wantedLocked(start.Add(1500 * time.Millisecond))
	assert.True(t, got, "nothing came back over UDP: blocked, TCP")

	rx = 3 // the server answered the handshake
	now := start.Add(1500 * time.Millisecond)
	got, at = f.wantedLocked(now)
	assert.False(t, got, "UDP gets through: wait for the handshake")
	assert.Equal(t, now.Add(answeringPoll), at, "and look again soon")
	got, _ = f.wantedLocked(start.Add(time.Second + answeringGrace))
	assert.True(t, got, "not for longer than answeringGrace")

	f.quicUsable("a", false) // the attempt ended: no longer pending
	assert.Empty(t, f.pending)
}

// TestFallbackWaitsForQUICAfterBlackout: when the TCP connection comes up
// while a QUIC connection that was up has only gone silent (a blackout,
// which TCP crossed as the link came back), new tunnels wait for QUIC
// for the grace, then take TCP (UDP blocked); a QUIC connection that
// answers is taken at once. Without a QUIC connection that was up (UDP
// blocked from the start) TCP is taken at once.
func TestFallbackWaitsForQUICAfterBlackout(t *testing.T) {
	t.Parallel()
	f := newFallback(nil, TransportAuto, "", time.Second)
	f.heartbeat = 200 * time.Millisecond
	now := time.Now()
	f.quicDialing()
	assert.Equal(t, TransportTCP, f.pickLocked(true, true, now), "QUIC never up: TCP at once")

	f.quicUsable("a", true)
	f.quicSuspect("a", true)
	f.quicGraceUntil = now.Add(f.quicGrace(100 * time.Millisecond))
	assert.Equal(t, 500*time.Millisecond, f.quicGrace(100*time.Millisecond), "two heartbeats and the TCP handshake")
	assert.Equal(t, 400*time.Millisecond, f.quicGrace(0))
	f.heartbeat = 0
	assert.Equal(t, minQUICGrace, f.quicGrace(0))
	f.heartbeat = 200 * time.Millisecond
	assert.Empty(t, f.pickLocked(true, true, now), "silent QUIC, TCP just up: wait")
	assert.Equal(t, TransportTCP, f.pickLocked(true, true, now.Add(500*time.Millisecond)), "QUIC still silent after the grace: TCP")
	assert.Equal(t, TransportQUIC, f.pickLocked(true, false, now), "no TCP: the silent QUIC connection")
	f.quicSuspect("a", false)
	assert.Equal(t, TransportQUIC, f.pickLocked(true, true, now), "QUIC answers: QUIC")
	assert.Empty(t, f.pickLocked(false, false, now), "nothing")
}
