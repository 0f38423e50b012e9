package backoff

import (
	"context"
	"math"
	"math/rand/v2"
	"time"
)

// Defaults used for zero-valued Backoff fields.
const (
	// DefaultInitial is the delay ceiling of the first attempt.
	DefaultInitial = time.Second
	// DefaultMax caps the delay ceiling.
	DefaultMax = 30 * time.Second
	// DefaultMultiplier is the growth factor of the ceiling per attempt.
	DefaultMultiplier = 2.0
	// DefaultStableAfter is how long a connection must have lasted for a
	// disconnect to reset the attempt count.
	DefaultStableAfter = 30 * time.Second
)

// maxExponent bounds the exponent so the ceiling computation cannot overflow;
// with any multiplier > 1 the ceiling has long reached Max by then.
const maxExponent = 64

// Clock is the source of time used by Backoff.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that fires once after d.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer, as returned by Clock.NewTimer.
type Timer interface {
	// C returns the channel on which the time is delivered when the timer fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it stopped it.
	Stop() bool
}

// RealClock returns a Clock backed by package time.
func RealClock() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time                 { return time.Now() }
func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }

// Backoff produces reconnect delays: attempt n (from 0) waits a uniformly
// random duration in [floor, min(Max, Initial*Multiplier^n)] ("full jitter"),
// where floor is Initial/10, so a reconnect loop never spins. Zero-valued
// fields take the Default* values; a nil Clock is RealClock and a nil Rand is
// math/rand/v2.Float64.
//
// A Backoff is owned by one goroutine (the reconnect supervisor) and is not
// safe for concurrent use.
type Backoff struct {
	// Initial is the ceiling of the first delay.
	Initial time.Duration
	// Max caps every delay.
	Max time.Duration
	// Multiplier is the growth factor of the ceiling per attempt (values
	// below 1 are treated as 1).
	Multiplier float64
	// StableAfter is how long a connection must last (Success to Failure)
	// for the next Failure to reset the attempt count to 0.
	StableAfter time.Duration
	// Clock provides time for Wait.
	Clock Clock
	// Rand returns a random number in [0, 1).
	Rand func() float64

	attempts    int
	connected   bool
	connectedAt time.Time
}

func (b *Backoff) initial() time.Duration {
	if b.Initial > 0 {
		return b.Initial
	}
	return DefaultInitial
}

func (b *Backoff) max() time.Duration {
	m := b.Max
	if m <= 0 {
		m = DefaultMax
	}
	return max(m, b.initial())
}

func (b *Backoff) multiplier() float64 {
	switch {
	case b.Multiplier == 0 || math.IsNaN(b.Multiplier):
		return DefaultMultiplier
	case b.Multiplier < 1:
		return 1
	default:
		return b.Multiplier
	}
}

func (b *Backoff) stableAfter() time.Duration {
	if b.StableAfter > 0 {
		return b.StableAfter
	}
	return DefaultStableAfter
}

func (b *Backoff) clock() Clock {
	if b.Clock != nil {
		return b.Clock
	}
	return RealClock()
}

func (b *Backoff) rand() float64 {
	f := rand.Float64
	if b.Rand != nil {
		f = b.Rand
	}
	r := f()
	if !(r >= 0) { // also catches NaN
		return 0
	}
	return min(r, 1)
}

// Ceiling returns the upper bound of the delay for the next attempt.
func (b *Backoff) Ceiling() time.Duration {
	maxD := b.max()
	n := min(b.attempts, maxExponent)
	c := float64(b.initial()) * math.Pow(b.multiplier(), float64(n))
	if math.IsInf(c, 0) || math.IsNaN(c) || c >= float64(maxD) {
		return maxD
	}
	return time.Duration(c)
}

// Floor returns the smallest delay Next returns (Initial/10).
func (b *Backoff) Floor() time.Duration {
	return max(b.initial()/10, 1)
}

// Next returns the delay before the next attempt and counts the attempt.
func (b *Backoff) Next() time.Duration {
	ceil := b.Ceiling()
	b.attempts++
	d := time.Duration(b.rand() * float64(ceil))
	return min(max(d, b.Floor()), ceil)
}

// Wait sleeps for Next() on the Clock, or returns ctx.Err() as soon as ctx
// is done (without counting an attempt if ctx was already done).
func (b *Backoff) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := b.clock().NewTimer(b.Next())
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}

// Success records that a connection was established at time at.
func (b *Backoff) Success(at time.Time) {
	b.connected = true
	b.connectedAt = at
}

// Failure records a disconnect (or failed attempt) at time at. If the last
// connection, recorded by Success, lasted at least StableAfter, the attempt
// count is reset to 0, so the next delay is short again.
func (b *Backoff) Failure(at time.Time) {
	if b.connected && at.Sub(b.connectedAt) >= b.stableAfter() {
		b.attempts = 0
	}
	b.connected = false
}

// Reset sets the attempt count to 0 and forgets any recorded connection.
func (b *Backoff) Reset() {
	b.attempts = 0
	b.connected = false
	b.connectedAt = time.Time{}
}

// Attempts returns the number of delays handed out by Next since the last
// reset.
func (b *Backoff) Attempts() int { return b.attempts }
