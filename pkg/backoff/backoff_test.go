package backoff

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a manually advanced Clock.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	added  chan time.Duration // receives the duration of each new timer
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Unix(1_700_000_000, 0), added: make(chan time.Duration, 1)}
}

type fakeTimer struct {
	c        chan time.Time
	deadline time.Time
	clock    *fakeClock
	stopped  bool
	fired    bool
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	t := &fakeTimer{c: make(chan time.Time, 1), deadline: c.now.Add(d), clock: c}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	c.added <- d
	return t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		if !t.stopped && !t.fired && !c.now.Before(t.deadline) {
			t.fired = true
			t.c <- c.now
		}
	}
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	was := !t.stopped && !t.fired
	t.stopped = true
	return was
}

func constRand(v float64) func() float64 { return func() float64 { return v } }

func TestNextBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		b     Backoff
		wants []time.Duration // successive Next() results
	}{
		{"max jitter doubles to cap",
			Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2, Rand: constRand(0.999999999)},
			[]time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}},
		{"zero jitter hits floor",
			Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2, Rand: constRand(0)},
			[]time.Duration{10 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond}},
		{"half jitter",
			Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 3, Rand: constRand(0.5)},
			[]time.Duration{50 * time.Millisecond, 150 * time.Millisecond, 450 * time.Millisecond, 500 * time.Millisecond}},
		{"defaults",
			Backoff{Rand: constRand(0.999999999)},
			[]time.Duration{DefaultInitial, 2 * DefaultInitial, 4 * DefaultInitial, 8 * DefaultInitial, 16 * DefaultInitial, DefaultMax}},
		{"multiplier below one is constant",
			Backoff{Initial: time.Second, Max: time.Minute, Multiplier: 0.5, Rand: constRand(0.999999999)},
			[]time.Duration{time.Second, time.Second, time.Second}},
		{"max below initial",
			Backoff{Initial: time.Second, Max: time.Millisecond, Rand: constRand(0.999999999)},
			[]time.Duration{time.Second, time.Second}},
		{"bad rand clamped",
			Backoff{Initial: time.Second, Max: time.Minute, Rand: constRand(7)},
			[]time.Duration{time.Second, 2 * time.Second}},
		{"negative rand clamped to floor",
			Backoff{Initial: time.Second, Max: time.Minute, Rand: constRand(-1)},
			[]time.Duration{100 * time.Millisecond}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := tc.b
			for i, want := range tc.wants {
				got := b.Next()
				assert.InDelta(t, float64(want), float64(got), float64(time.Microsecond), "attempt %d", i)
				assert.Equal(t, i+1, b.Attempts())
			}
		})
	}
}

func TestNextRandomWithinBounds(t *testing.T) {
	t.Parallel()
	b := Backoff{Initial: 50 * time.Millisecond, Max: 3 * time.Second, Multiplier: 1.7}
	for i := 0; i < 2000; i++ {
		ceil := b.Ceiling()
		d := b.Next()
		require.GreaterOrEqual(t, d, 5*time.Millisecond)
		require.LessOrEqual(t, d, ceil)
		require.LessOrEqual(t, d, 3*time.Second)
	}
	assert.Equal(t, 2000, b.Attempts())
	assert.Equal(t, 3*time.Second, b.Ceiling(), "huge attempt counts must not overflow")
}

func TestResetAfterStable(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name      string
		connected bool
		upFor     time.Duration
		wantReset bool
	}{
		{"stable connection resets", true, time.Minute, true},
		{"exactly stable resets", true, 30 * time.Second, true},
		{"short connection keeps count", true, 29 * time.Second, false},
		{"failed attempt keeps count", false, time.Hour, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := Backoff{Initial: time.Second, StableAfter: 30 * time.Second, Rand: constRand(0.5)}
			for range 5 {
				b.Next()
			}
			if tc.connected {
				b.Success(t0)
			}
			b.Failure(t0.Add(tc.upFor))
			if tc.wantReset {
				assert.Equal(t, 0, b.Attempts())
				assert.Equal(t, time.Second, b.Ceiling())
			} else {
				assert.Equal(t, 5, b.Attempts())
			}
		})
	}
}

func TestFailureForgetsConnection(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	b := Backoff{StableAfter: time.Second}
	b.Next()
	b.Success(t0)
	b.Failure(t0) // short connection
	b.Next()
	b.Failure(t0.Add(time.Hour)) // a later failed attempt must not count as a long connection
	assert.Equal(t, 2, b.Attempts())
	b.Reset()
	assert.Equal(t, 0, b.Attempts())
}

func TestWaitUsesClock(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	b := Backoff{Initial: time.Second, Max: time.Minute, Clock: clk, Rand: constRand(0.999999999)}
	done := make(chan error, 1)
	go func() { done <- b.Wait(context.Background()) }()
	d := <-clk.added
	assert.InDelta(t, float64(time.Second), float64(d), float64(time.Microsecond))
	select {
	case err := <-done:
		t.Fatalf("Wait returned before the clock advanced: %v", err)
	default:
	}
	clk.Advance(time.Second)
	require.NoError(t, <-done)
	assert.Equal(t, 1, b.Attempts())
}

func TestWaitCancelled(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	b := Backoff{Clock: clk}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Wait(ctx) }()
	<-clk.added
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	clk.mu.Lock()
	assert.True(t, clk.timers[0].stopped, "timer must be stopped")
	clk.mu.Unlock()

	// Already cancelled: no attempt is counted and no timer is made.
	require.ErrorIs(t, b.Wait(ctx), context.Canceled)
	assert.Equal(t, 1, b.Attempts())
}

func TestRealClock(t *testing.T) {
	t.Parallel()
	b := Backoff{Initial: time.Millisecond, Max: time.Millisecond, Rand: constRand(0)}
	start := time.Now()
	require.NoError(t, b.Wait(context.Background()))
	assert.GreaterOrEqual(t, time.Since(start), b.Floor())
	c := RealClock()
	tm := c.NewTimer(time.Hour)
	assert.True(t, tm.Stop())
	assert.WithinDuration(t, time.Now(), c.Now(), time.Second)
}
