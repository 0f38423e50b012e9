package egress

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/proto"
)

var replayT0 = time.Date(2026, 11, 23, 5, 0, 0, 0, time.UTC)

func hdr(n byte, at time.Time) *proto.Header {
	h := &proto.Header{Time: at}
	h.Nonce[0] = n
	h.Nonce[proto.NonceLen-1] = n
	return h
}

// newTestReplayCache is a cache for tests that pass their own times: its
// sweeper, which runs on the real clock, is off.
func newTestReplayCache(window time.Duration, max int) *replayCache {
	c := newReplayCache(window, max)
	c.stop()
	return c
}

func TestReplayCacheSweeperEmptiesIdleCache(t *testing.T) {
	t.Parallel()
	// Entries go when their window ends although no header comes after
	// them (every client left), and the map their crowd grew is made anew.
	const w = 2 * time.Second
	c := newReplayCache(w, 4000)
	defer c.stop()
	var sizes atomic.Int64
	sizes.Store(-1)
	c.onSize = func(n int) { sizes.Store(int64(n)) }
	at := time.Now().Add(-w + w/4) // expires 1.5 s from now
	for i := range 2000 {
		h := &proto.Header{Time: at}
		h.Nonce[0], h.Nonce[1] = byte(i), byte(i>>8)
		require.Equal(t, proto.CodeOK, c.check(h, time.Now()))
	}
	require.Equal(t, 2000, c.len())
	require.Eventually(t, func() bool { return c.len() == 0 }, 10*time.Second, 50*time.Millisecond)
	c.mu.Lock()
	peak, armed := c.peak, c.sweeper != nil
	c.mu.Unlock()
	assert.Zero(t, peak, "map made anew")
	assert.False(t, armed, "no sweeper once empty")
	assert.Zero(t, sizes.Load(), "the gauge was told")
}

func TestReplayCacheWindow(t *testing.T) {
	t.Parallel()
	const w = time.Minute
	for _, tc := range []struct {
		name   string
		offset time.Duration // header time minus now
		want   proto.Code
	}{
		{"now", 0, proto.CodeOK},
		{"a bit old", -30 * time.Second, proto.CodeOK},
		{"exactly window old", -w, proto.CodeOK},
		{"just too old", -w - time.Nanosecond, proto.CodeReplay},
		{"far too old", -time.Hour, proto.CodeReplay},
		{"a bit ahead (clock skew)", 30 * time.Second, proto.CodeOK},
		{"exactly window ahead", w, proto.CodeOK},
		{"too far ahead", w + time.Second, proto.CodeReplay},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newTestReplayCache(w, 10)
			assert.Equal(t, tc.want, c.check(hdr(1, replayT0.Add(tc.offset)), replayT0))
			if tc.want != proto.CodeOK {
				assert.Empty(t, c.seen, "rejected headers are not remembered")
			}
		})
	}
}

func TestReplayCacheSameNonce(t *testing.T) {
	t.Parallel()
	const w = time.Minute
	c := newTestReplayCache(w, 10)
	h := hdr(1, replayT0)
	require.Equal(t, proto.CodeOK, c.check(h, replayT0))
	assert.Equal(t, proto.CodeReplay, c.check(h, replayT0), "immediate replay")
	assert.Equal(t, proto.CodeReplay, c.check(h, replayT0.Add(w)), "replay at the end of the window")
	assert.Equal(t, proto.CodeReplay, c.check(h, replayT0.Add(w+time.Second)), "outside the window it is too old anyway")
	assert.Equal(t, proto.CodeOK, c.check(hdr(2, replayT0), replayT0.Add(time.Second)), "another nonce is fine")

	// The same nonce with another timestamp is still a replay.
	assert.Equal(t, proto.CodeReplay, c.check(hdr(1, replayT0.Add(10*time.Second)), replayT0.Add(20*time.Second)))
}

func TestReplayCacheCapacity(t *testing.T) {
	t.Parallel()
	const w = 10 * time.Second
	c := newTestReplayCache(w, 3)
	for i := range 3 {
		require.Equal(t, proto.CodeOK, c.check(hdr(byte(i), replayT0), replayT0), "entry %d", i)
	}
	assert.Equal(t, proto.CodeOverloaded, c.check(hdr(9, replayT0), replayT0))
	assert.Equal(t, proto.CodeReplay, c.check(hdr(0, replayT0), replayT0), "a replay is still a replay when full")
	assert.Len(t, c.seen, 3, "the refused nonce is not stored")

	// Entries expire at header time + window + 1 s; then the GC makes room.
	later := replayT0.Add(w + time.Second)
	assert.Equal(t, proto.CodeOverloaded, c.check(hdr(9, later), later), "not expired yet at the exact expiry")
	later = later.Add(time.Second + time.Millisecond) // a full cache is swept at most once a second
	assert.Equal(t, proto.CodeOK, c.check(hdr(9, later), later), "expired entries are freed")
	assert.Len(t, c.seen, 1)
}

func TestReplayCachePeriodicGC(t *testing.T) {
	t.Parallel()
	const w = 8 * time.Second
	c := newTestReplayCache(w, 1000)
	for i := range 10 {
		require.Equal(t, proto.CodeOK, c.check(hdr(byte(i), replayT0), replayT0))
	}
	require.Len(t, c.seen, 10)
	// Past the entries' expiry and more than window/4 since the last GC: swept
	// although the cache is far from full.
	now := replayT0.Add(w + 2*time.Second)
	require.Equal(t, proto.CodeOK, c.check(hdr(100, now), now))
	assert.Len(t, c.seen, 1, "expired entries swept")

	// A GC less than window/4 after the last one does not run.
	require.Equal(t, proto.CodeOK, c.check(hdr(101, now), now.Add(w/8)))
	assert.Len(t, c.seen, 2)
}

func TestReplayCacheConcurrent(t *testing.T) {
	t.Parallel()
	c := newTestReplayCache(time.Minute, 1<<16)
	const workers, per = 8, 200
	var ok atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				h := &proto.Header{Time: replayT0}
				h.Nonce[0], h.Nonce[1] = byte(w), byte(i)
				if c.check(h, replayT0) == proto.CodeOK {
					ok.Add(1)
				}
				// Every worker also replays one shared nonce; exactly one wins.
				if c.check(hdr(255, replayT0), replayT0) == proto.CodeOK {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(workers*per+1), ok.Load())
}

// BenchmarkReplayCacheCheck measures one check on a cache that is half full
// and one that is full of unexpired nonces (every check then sweeps the map).
func BenchmarkReplayCacheCheck(b *testing.B) {
	for _, tc := range []struct {
		name string
		fill int
	}{{"half_full", 1 << 15}, {"full", 1 << 16}} {
		b.Run(tc.name, func(b *testing.B) {
			c := newTestReplayCache(time.Minute, 1<<16)
			for i := range tc.fill {
				h := &proto.Header{Time: replayT0}
				h.Nonce[0], h.Nonce[1], h.Nonce[2] = byte(i), byte(i>>8), 1
				c.check(h, replayT0)
			}
			b.ResetTimer()
			for i := range b.N {
				h := &proto.Header{Time: replayT0}
				h.Nonce[0], h.Nonce[1], h.Nonce[2], h.Nonce[3] = byte(i), byte(i>>8), byte(i>>16), 2
				c.check(h, replayT0)
				if len(c.seen) > tc.fill { // keep the fill level
					delete(c.seen, h.Nonce)
				}
			}
		})
	}
}

func TestReplayCacheOneRTT(t *testing.T) {
	t.Parallel()
	const w = time.Minute
	c := newTestReplayCache(w, 8) // 1-RTT nonces are recorded up to 6
	var sizes []int
	c.onSize = func(n int) { sizes = append(sizes, n) }

	// A 1-RTT header is recorded, so any later copy (0-RTT or 1-RTT) is a replay.
	h := hdr(1, replayT0)
	code, why := c.admit(h, replayT0, false, nil)
	require.Equal(t, proto.CodeOK, code)
	assert.Empty(t, why)
	assert.Equal(t, proto.CodeReplay, c.check(h, replayT0.Add(time.Second)), "0-RTT copy")
	code, _ = c.admit(h, replayT0.Add(time.Second), false, nil)
	assert.Equal(t, proto.CodeReplay, code, "1-RTT copy on another connection")

	// The window holds for 1-RTT streams too, and stale headers are not stored.
	code, _ = c.admit(hdr(2, replayT0.Add(-2*w)), replayT0, false, nil)
	assert.Equal(t, proto.CodeReplay, code, "too old")
	code, _ = c.admit(hdr(3, replayT0.Add(2*w)), replayT0, false, nil)
	assert.Equal(t, proto.CodeReplay, code, "too far ahead")
	assert.Equal(t, 1, c.len())

	// 1-RTT streams stop recording at three quarters, and go on unrecorded;
	// the last quarter is left to 0-RTT streams.
	for i := range 5 {
		code, why := c.admit(hdr(byte(10+i), replayT0), replayT0, false, nil)
		require.Equal(t, proto.CodeOK, code)
		require.Empty(t, why, "entry %d", i)
	}
	require.Equal(t, 6, c.len())
	code, why = c.admit(hdr(20, replayT0), replayT0, false, nil)
	assert.Equal(t, proto.CodeOK, code, "a 1-RTT stream is served unrecorded")
	assert.Equal(t, ReplayUnrecordedCacheFull, why)
	assert.Equal(t, 6, c.len())
	assert.Equal(t, proto.CodeOK, c.check(hdr(21, replayT0), replayT0), "0-RTT still has room")
	assert.Equal(t, proto.CodeOK, c.check(hdr(22, replayT0), replayT0))
	assert.Equal(t, proto.CodeOverloaded, c.check(hdr(23, replayT0), replayT0), "now full for 0-RTT too")
	assert.Equal(t, []int{1, 2, 3, 4, 5, 6, 7, 8}, sizes, "the size callback follows every insert")

	// Recorded entries expire like checked ones.
	later := replayT0.Add(w + 2*time.Second)
	code, _ = c.admit(hdr(30, later), later, false, nil)
	assert.Equal(t, proto.CodeOK, code)
	assert.Equal(t, 1, c.len(), "expired nonces were swept")
	assert.Equal(t, 1, sizes[len(sizes)-1])
}

func TestReplayCacheConnQuota(t *testing.T) {
	t.Parallel()
	const w = 30 * time.Second
	c := newTestReplayCache(w, 100)
	q := newReplayQuota(3, replayT0)
	for i := range 3 {
		code, why := c.admit(hdr(byte(i), replayT0), replayT0, false, q)
		require.Equal(t, proto.CodeOK, code)
		require.Empty(t, why)
	}
	code, why := c.admit(hdr(10, replayT0), replayT0, false, q)
	assert.Equal(t, proto.CodeOK, code, "a 1-RTT stream over its connection's quota is served")
	assert.Equal(t, ReplayUnrecordedConnQuota, why, "but not recorded")
	code, why = c.admit(hdr(11, replayT0), replayT0, true, q)
	assert.Equal(t, proto.CodeOverloaded, code, "an early stream over the quota is refused")
	assert.Equal(t, ReplayUnrecordedConnQuota, why)
	assert.Equal(t, 3, c.len())

	other := newReplayQuota(3, replayT0)
	code, why = c.admit(hdr(12, replayT0), replayT0, true, other)
	assert.Equal(t, proto.CodeOK, code, "another connection has its own quota")
	assert.Empty(t, why)

	// The quota refills over one window: 3 per 30 s, one every 10 s.
	code, why = c.admit(hdr(13, replayT0), replayT0.Add(10*time.Second), false, q)
	assert.Equal(t, proto.CodeOK, code)
	assert.Empty(t, why)
	_, why = c.admit(hdr(14, replayT0), replayT0.Add(10*time.Second), false, q)
	assert.Equal(t, ReplayUnrecordedConnQuota, why)
}
