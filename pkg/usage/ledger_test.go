package usage

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newClock() *fakeClock { return &fakeClock{t: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)} }

// TestTrackCountsLiveAndClosedTunnels: an account's totals are its closed
// tunnels' final bytes plus its live tunnels' counters as they are now,
// each byte counted once.
func TestTrackCountsLiveAndClosedTunnels(t *testing.T) {
	t.Parallel()
	l, err := New(Config{})
	require.NoError(t, err)
	a := l.Get("key=alice")
	require.Same(t, a, l.Get("key=alice"), "one account per identity")
	var up1, down1, up2, down2 atomic.Int64
	done1 := a.Track(&up1, &down1)
	done2 := a.Track(&up2, &down2)
	up1.Add(100)
	down1.Add(1000)
	up2.Add(5)
	u, ok := l.Identity("key=alice")
	require.True(t, ok)
	assert.Equal(t, int64(105), u.BytesUpstream)
	assert.Equal(t, int64(1000), u.BytesDownstream)
	assert.Equal(t, int64(2), u.ActiveTunnels)
	done1()
	done1()          // once
	up1.Add(1 << 20) // after its end: not counted
	down2.Add(7)
	done2()
	u, _ = l.Identity("key=alice")
	assert.Equal(t, Usage{Identity: "key=alice", BytesUpstream: 105, BytesDownstream: 1007, Tunnels: 2}, u)
}

// TestAnonymousAndMaxIdentities: the empty identity is Anonymous; past
// MaxIdentities new identities share Other's account.
func TestAnonymousAndMaxIdentities(t *testing.T) {
	t.Parallel()
	l, err := New(Config{MaxIdentities: 2})
	require.NoError(t, err)
	assert.Equal(t, Anonymous, l.Get("").Name())
	assert.Equal(t, "key=a", l.Get("key=a").Name())
	assert.Equal(t, Other, l.Get("key=b").Name(), "past MaxIdentities")
	assert.Equal(t, "key=a", l.Get("key=a").Name(), "known ones keep theirs")
	l.Get("key=b").Refused()
	snap := l.Snapshot()
	require.Len(t, snap, 3)
	assert.Equal(t, Other, snap[2].Identity, "other last")
	assert.Equal(t, int64(1), snap[2].RefusedDestinations)
}

// TestSeriesBoundedLabels: metrics series exist for the labeled identities
// only; every other identity is summed under other (always present).
func TestSeriesBoundedLabels(t *testing.T) {
	t.Parallel()
	l, err := New(Config{Labeled: []string{"key=alice"}})
	require.NoError(t, err)
	for i, id := range []string{"key=alice", "key=bob", "CN=carol", ""} {
		var up, down atomic.Int64
		up.Add(int64(10 * (i + 1)))
		l.Get(id).Track(&up, &down)()
		l.Get(id).ConnOpened()
	}
	series := l.Series()
	require.Len(t, series, 2)
	assert.Equal(t, "key=alice", series[0].Identity)
	assert.Equal(t, int64(10), series[0].BytesUpstream)
	assert.Equal(t, Other, series[1].Identity)
	assert.Equal(t, int64(20+30+40), series[1].BytesUpstream)
	assert.Equal(t, int64(3), series[1].Connections)
	assert.Equal(t, int64(3), series[1].ActiveConnections)

	empty, err := New(Config{})
	require.NoError(t, err)
	assert.Equal(t, []Usage{{Identity: Other}}, empty.Series(), "other exists from the start")
}

// TestRates: the tick turns the bytes moved since the last one into rates.
func TestRates(t *testing.T) {
	t.Parallel()
	clk := newClock()
	l, err := New(Config{Now: clk.Now})
	require.NoError(t, err)
	a := l.Get("key=alice")
	var up, down atomic.Int64
	defer a.Track(&up, &down)()
	a.tick(clk.Now(), Quota{})
	clk.Add(2 * time.Second)
	up.Add(2000)
	down.Add(8000)
	a.tick(clk.Now(), Quota{})
	u, _ := l.Identity("key=alice")
	assert.InDelta(t, 1000, u.UpstreamBytesPerSec, 0.01)
	assert.InDelta(t, 4000, u.DownBytesPerSec, 0.01)
}

// TestSuspend: a suspension holds until its end, can be lifted, and is
// refused to no other identity.
func TestSuspend(t *testing.T) {
	t.Parallel()
	clk := newClock()
	l, err := New(Config{Now: clk.Now})
	require.NoError(t, err)
	until := l.Suspend("key=alice", 10*time.Minute)
	assert.Equal(t, clk.Now().Add(10*time.Minute), until)
	assert.Equal(t, until, l.Suspended("key=alice"))
	assert.True(t, l.Suspended("key=bob").IsZero())
	clk.Add(10 * time.Minute)
	assert.True(t, l.Suspended("key=alice").IsZero(), "over at its end")
	l.Suspend("key=alice", time.Hour)
	l.Suspend("key=alice", 0)
	assert.True(t, l.Suspended("key=alice").IsZero(), "lifted")
}

// TestSaveAndReload: the totals (not the rates or active counts) and the
// suspensions still running survive a restart; the file is private.
func TestSaveAndReload(t *testing.T) {
	t.Parallel()
	clk := newClock()
	path := filepath.Join(t.TempDir(), "usage.json")
	l, err := New(Config{Path: path, Now: clk.Now})
	require.NoError(t, err)
	var up, down atomic.Int64
	done := l.Get("key=alice").Track(&up, &down)
	up.Add(123)
	down.Add(456)
	l.Get("key=alice").ConnOpened()
	l.Get("CN=bob").Refused()
	l.Suspend("CN=bob", time.Hour)
	l.Suspend("key=alice", time.Minute)
	require.NoError(t, l.Save()) // a live tunnel's bytes so far are saved
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	done()

	clk.Add(2 * time.Minute) // alice's suspension is over, bob's is not
	l2, err := New(Config{Path: path, Now: clk.Now})
	require.NoError(t, err)
	a, ok := l2.Identity("key=alice")
	require.True(t, ok)
	assert.Equal(t, Usage{Identity: "key=alice", BytesUpstream: 123, BytesDownstream: 456, Tunnels: 1, Connections: 1}, a)
	b, _ := l2.Identity("CN=bob")
	assert.Equal(t, int64(1), b.RefusedDestinations)
	assert.Equal(t, clk.Now().Add(58*time.Minute), b.SuspendedUntil)

	// Counting continues from the loaded totals.
	var up2, down2 atomic.Int64
	up2.Add(7)
	l2.Get("key=alice").Track(&up2, &down2)()
	a, _ = l2.Identity("key=alice")
	assert.Equal(t, int64(130), a.BytesUpstream)
}

// TestLoadErrors: a state file that is not ours is an error, never reset.
func TestLoadErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct{ name, content, want string }{
		{"garbage", "not json", "move it away"},
		{"other version", `{"version": 9}`, "format version 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := filepath.Join(dir, tc.name)
			require.NoError(t, os.WriteFile(p, []byte(tc.content), 0o600))
			_, err := New(Config{Path: p})
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := New(Config{Path: filepath.Join(dir, "missing")})
	require.NoError(t, err, "no file yet: start from zero")
}

// TestRunSavesPeriodicallyAndAtEnd: Run writes the file every SaveInterval
// and once more when ctx ends.
func TestRunSavesPeriodicallyAndAtEnd(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "usage.json")
	l, err := New(Config{Path: path, SaveInterval: time.Second})
	require.NoError(t, err)
	var up, down atomic.Int64
	defer l.Get("key=alice").Track(&up, &down)()
	up.Add(1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, Hooks{SaveFailed: func(err error) { t.Error(err) }}) }()
	read := func() int64 {
		b, err := os.ReadFile(path)
		if err != nil {
			return -1
		}
		var st state
		require.NoError(t, json.Unmarshal(b, &st))
		for _, u := range st.Identities {
			if u.Identity == "key=alice" {
				return u.BytesUpstream
			}
		}
		return -1
	}
	require.Eventually(t, func() bool { return read() == 1 }, 10*time.Second, 50*time.Millisecond, "saved while running")
	up.Add(41)
	cancel()
	require.NoError(t, <-done)
	assert.Equal(t, int64(42), read(), "saved at the end")
}

// TestActive: an identity is active while it has a connection or a tunnel
// open (what the cap table asks before dropping its budgets).
func TestActive(t *testing.T) {
	t.Parallel()
	l, err := New(Config{})
	require.NoError(t, err)
	assert.False(t, l.Active("key=nobody"))
	a := l.Get("key=a")
	assert.False(t, l.Active("key=a"), "no connection yet")
	closed := a.ConnOpened()
	assert.True(t, l.Active("key=a"))
	var up, down atomic.Int64
	done := a.Track(&up, &down)
	closed()
	assert.True(t, l.Active("key=a"), "a tunnel still open")
	done()
	assert.False(t, l.Active("key=a"))
}

// TestDeferredLoadInUpgrade (issue 34): a new process's ledger (Deferred)
// counts before it reads the state file and saves nothing until then; the
// old process's last totals (SaveFinal, after which it saves nothing) add
// up with what it counted; a tunnel handed over is counted from where the
// old process stopped (TrackFrom), and not as a new tunnel.
func TestDeferredLoadInUpgrade(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "usage.json")
	oldL, err := New(Config{Path: path})
	require.NoError(t, err)
	var up, down atomic.Int64 // a tunnel the upgrade hands over: its relay's counters
	doneOld := oldL.Get("key=alice").Track(&up, &down)
	up.Add(1000)
	down.Add(2000)
	require.NoError(t, oldL.Save()) // a periodic save

	newL, err := New(Config{Path: path, Deferred: true})
	require.NoError(t, err)
	var up2, down2 atomic.Int64
	newL.Get("key=alice").Track(&up2, &down2)() // a new tunnel on the new process, before the handover
	up2.Add(5)
	require.NoError(t, newL.Save())
	saved := readState(t, path)
	assert.Equal(t, int64(1000), saved["key=alice"].BytesUpstream, "the new process wrote nothing before it read the file")

	up.Add(500) // after the periodic save, before the handover
	doneOld()   // the tunnel handed over: ended here
	require.NoError(t, oldL.SaveFinal())
	require.NoError(t, newL.LoadDeferred())
	doneNew := newL.Get("key=alice").TrackFrom(&up, &down, up.Load(), down.Load())
	up.Add(10)
	doneNew()
	require.NoError(t, newL.Save())
	require.NoError(t, oldL.Save()) // the old process's exit, after: frozen, it does not overwrite
	u, _ := newL.Identity("key=alice")
	assert.Equal(t, Usage{Identity: "key=alice", BytesUpstream: 1510, BytesDownstream: 2000, Tunnels: 2}, u,
		"each byte once: 1,500 counted by the old process, 10 by the new; the handed-over tunnel counted once")
	saved = readState(t, path)
	assert.Equal(t, int64(1510), saved["key=alice"].BytesUpstream)
	assert.NoError(t, newL.LoadDeferred(), "once")
	u, _ = newL.Identity("key=alice")
	assert.Equal(t, int64(1510), u.BytesUpstream, "not loaded twice")
}

// readState reads the state file's identities.
func readState(t *testing.T, path string) map[string]Usage {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var st state
	require.NoError(t, json.Unmarshal(b, &st))
	out := map[string]Usage{}
	for _, u := range st.Identities {
		out[u.Identity] = u
	}
	return out
}
