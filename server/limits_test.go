package server

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/metrics"
)

func TestSourceLimiterHandshakeRate(t *testing.T) {
	t.Parallel()
	l := newSourceLimiter(10, 0, 0) // burst 20
	now := time.Unix(1000, 0)
	for i := range 20 {
		assert.True(t, l.allowHandshake("192.0.2.1", now), "handshake %d within the burst", i)
	}
	assert.False(t, l.allowHandshake("192.0.2.1", now), "burst used up")
	assert.True(t, l.suspicious("192.0.2.1", now))
	assert.True(t, l.allowHandshake("192.0.2.2", now), "other sources are not affected")
	assert.False(t, l.suspicious("192.0.2.2", now))
	later := now.Add(500 * time.Millisecond) // 5 tokens back
	for range 5 {
		assert.True(t, l.allowHandshake("192.0.2.1", later))
	}
	assert.False(t, l.allowHandshake("192.0.2.1", later))
	assert.True(t, newSourceLimiter(0, 0, 0).allowHandshake("x", now), "0 disables the rate")
}

func TestSourceLimiterOpenConnections(t *testing.T) {
	t.Parallel()
	l := newSourceLimiter(0, 2, 0)
	now := time.Now()
	assert.True(t, l.open("a", now))
	assert.True(t, l.open("a", now))
	assert.False(t, l.open("a", now), "third connection over the cap")
	assert.True(t, l.open("b", now))
	l.closed("a", now)
	assert.True(t, l.open("a", now), "a closed connection frees its place")
	l.closed("unknown", now) // no panic
}

func TestSourceLimiterForgetsSourcesThatLeft(t *testing.T) {
	t.Parallel()
	l := newSourceLimiter(20, 4, 0)
	now := time.Now()
	for _, ip := range []string{"a", "b"} {
		require.True(t, l.allowHandshake(ip, now))
		require.True(t, l.open(ip, now))
		require.True(t, l.open(ip, now))
	}
	l.closed("a", now)
	l.closed("a", now)
	assert.Contains(t, l.sources, "a", "its bucket is not full yet: a new entry would hand it a whole burst")
	later := now.Add(time.Minute)
	l.closed("b", later)
	assert.Contains(t, l.sources, "b", "one connection still open")
	l.closed("b", later)
	assert.NotContains(t, l.sources, "b", "the last connection closed and the bucket is full: nothing to remember")
}

func TestSourceIP(t *testing.T) {
	t.Parallel()
	udp := func(ip string) net.Addr { return &net.UDPAddr{IP: net.ParseIP(ip), Port: 5} }
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{udp("192.0.2.7"), "192.0.2.7"},
		{udp("::ffff:192.0.2.7"), "192.0.2.7"}, // IPv4-mapped: the IPv4 address
		{udp("::1"), "::/64"},
		{udp("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::/64"},
		{&net.IPAddr{IP: net.ParseIP("2001:db8:1:2::9")}, "2001:db8:1:2::/64"},
		{fakeAddr("[2001:db8:1:2::9]:443"), "2001:db8:1:2::/64"},
		{fakeAddr("198.51.100.1:443"), "198.51.100.1"},
		{fakeAddr("not-an-address"), "not-an-address"},
	} {
		assert.Equal(t, tc.want, sourceIP(tc.addr), "%s", tc.addr)
	}
}

type fakeAddr string

func (a fakeAddr) Network() string { return "udp" }
func (a fakeAddr) String() string  { return string(a) }

// TestSourceLimiterIPv6Prefix: the addresses of one IPv6 /64 share the
// per-source limits; another /64 has its own.
func TestSourceLimiterIPv6Prefix(t *testing.T) {
	t.Parallel()
	l := newSourceLimiter(1, 2, 0) // burst 2 handshakes, 2 open connections
	now := time.Unix(1000, 0)
	a := func(ip string) string { return sourceIP(&net.UDPAddr{IP: net.ParseIP(ip), Port: 1}) }
	assert.True(t, l.open(a("2001:db8:0:1::1"), now))
	assert.True(t, l.open(a("2001:db8:0:1::2"), now))
	assert.False(t, l.open(a("2001:db8:0:1:ffff::3"), now), "a third address of the same /64 is over the cap")
	assert.True(t, l.open(a("2001:db8:0:2::1"), now), "another /64 is not affected")

	assert.True(t, l.allowHandshake(a("2001:db8:0:7::1"), now))
	assert.True(t, l.allowHandshake(a("2001:db8:0:7::2"), now))
	assert.False(t, l.allowHandshake(a("2001:db8:0:7::3"), now), "one handshake bucket per /64")
}

// TestSourceLimiterUnverifiedShare: a source holds at most its share of
// places for streams awaiting a verified header; releasing one frees it;
// other sources have their own share, and untracked sources share one.
func TestSourceLimiterUnverifiedShare(t *testing.T) {
	t.Parallel()
	l := newSourceLimiter(0, 0, 2)
	now := time.Now()
	require.True(t, l.open("a", now))
	require.True(t, l.open("b", now))
	r1, ok := l.holdUnverified("a")
	require.True(t, ok)
	_, ok = l.holdUnverified("a")
	require.True(t, ok)
	_, ok = l.holdUnverified("a")
	assert.False(t, ok, "a third place is over the share")
	_, ok = l.holdUnverified("b")
	assert.True(t, ok, "another source has its own share")
	r1()
	_, ok = l.holdUnverified("a")
	assert.True(t, ok, "a released place is free again")

	for range 2 {
		_, ok = l.holdUnverified("untracked-1")
		require.True(t, ok)
	}
	_, ok = l.holdUnverified("untracked-2")
	assert.False(t, ok, "untracked sources share one set of places")

	free := newSourceLimiter(0, 0, 0)
	for range 100 {
		_, ok = free.holdUnverified("a")
		require.True(t, ok, "0: no share")
	}
}

// TestTCPSlotsShares: the waiting and handshake phases each have a total
// and a per-source share (a sixteenth, at least 8); a connection moves from
// one to the other without being counted twice, a refused move gives back
// its waiting place, and a source's entry goes with its last connection.
func TestTCPSlotsShares(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                                               string
		handshakes                                         int
		wantWaiting, wantWaitingShare, wantHS, wantHSShare int
	}{
		{"default", 256, 1024, 64, 256, 16},
		{"small: the share is at least 8", 32, 128, 8, 32, 8},
		{"tiny: the share is at most the total", 4, 16, 8, 4, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sl := newTCPSlots(tc.handshakes)
			assert.Equal(t, tc.wantWaiting, sl.maxWaiting)
			assert.Equal(t, tc.wantWaitingShare, sl.maxWaitingPerSource)
			assert.Equal(t, tc.wantHS, sl.maxHandshakes)
			assert.Equal(t, tc.wantHSShare, sl.maxHandshakesPerSource)
		})
	}

	sl := newTCPSlots(32) // 128 waiting, 8 a source; 32 handshakes, 8 a source
	for range 8 {
		require.Empty(t, sl.wait("a"))
	}
	assert.Equal(t, metrics.RefusedTCPWaitingPerSource, sl.wait("a"), "a's share of the waiting places is taken")
	require.Empty(t, sl.wait("b"), "another source has its own share")
	sl.doneWaiting("b")
	assert.NotContains(t, sl.sources, "b", "gone with its last connection")

	for range 8 {
		require.Empty(t, sl.handshake("a"))
	}
	assert.Equal(t, 0, sl.waiting, "moved, not counted twice")
	assert.Equal(t, 8, sl.handshaking)
	require.Empty(t, sl.wait("a"), "its waiting places are free again")
	assert.Equal(t, metrics.RefusedTCPHandshakesPerSource, sl.handshake("a"), "a's share of the handshakes is taken")
	assert.Equal(t, 0, sl.waiting, "the refused connection gave back its waiting place")
	sl.doneHandshake("a")
	require.Empty(t, sl.wait("a"))
	require.Empty(t, sl.handshake("a"), "a finished handshake frees a slot")

	// Fill the server-wide handshakes from other sources: 8 from a, 8
	// each from c, d, e.
	for _, src := range []string{"c", "d", "e"} {
		for range 8 {
			require.Empty(t, sl.wait(src))
			require.Empty(t, sl.handshake(src))
		}
	}
	require.Empty(t, sl.wait("f"))
	assert.Equal(t, metrics.RefusedTCPHandshakes, sl.handshake("f"), "every handshake slot is taken")
	assert.NotContains(t, sl.sources, "f")

	// Fill the server-wide waiting places: 16 sources of 8.
	for i := range 16 {
		for range 8 {
			require.Empty(t, sl.wait(fmt.Sprint("w", i)))
		}
	}
	assert.Equal(t, metrics.RefusedTCPWaiting, sl.wait("g"), "every waiting place is taken")
	assert.NotContains(t, sl.sources, "g", "a refused source leaves no entry")

	for i := range 16 {
		for range 8 {
			sl.doneWaiting(fmt.Sprint("w", i))
		}
	}
	for _, src := range []string{"a", "c", "d", "e"} {
		for range 8 {
			sl.doneHandshake(src)
		}
	}
	sl.doneHandshake("unknown") // no effect
	sl.doneWaiting("unknown")
	assert.Empty(t, sl.sources, "every place given back")
	assert.Zero(t, sl.waiting)
	assert.Zero(t, sl.handshaking)
}
