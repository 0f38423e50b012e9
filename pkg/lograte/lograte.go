package lograte

import (
	"sync"
	"time"
)

// Overflow is the kind an event is counted under when MaxKinds other kinds
// were logged within the interval: such events share one line per interval.
const Overflow = "\x00overflow"

// Limiter decides which events are logged. Safe for concurrent use.
type Limiter struct {
	interval time.Duration
	maxKinds int
	// now reads the clock (time.Now; tests replace it).
	now func() time.Time

	mu    sync.Mutex
	kinds map[string]*kind
}

type kind struct {
	last       time.Time // when an event of this kind was last logged
	suppressed int       // events not logged since
}

// New returns a Limiter that logs an event of a kind when none of that kind
// was logged within interval, and keeps at most maxKinds kinds (more within
// an interval are counted as Overflow).
func New(interval time.Duration, maxKinds int) *Limiter {
	return &Limiter{interval: interval, maxKinds: max(maxKinds, 1), now: time.Now, kinds: map[string]*kind{}}
}

// Allow reports whether an event of kind k is to be logged now, and how many
// events of k were not logged since the last one that was (the caller logs it
// as "suppressed"). When k cannot be tracked (too many kinds), the decision is
// Overflow's, and logged reports false only if Overflow's line is due later.
func (l *Limiter) Allow(k string) (logged bool, suppressed int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.kinds[k]
	if e == nil {
		if len(l.kinds) >= l.maxKinds {
			l.prune(now)
		}
		if len(l.kinds) >= l.maxKinds {
			if e = l.kinds[Overflow]; e == nil {
				e = &kind{}
				l.kinds[Overflow] = e // the one kind beyond maxKinds
			}
		} else {
			e = &kind{}
			l.kinds[k] = e
			e.last = now
			return true, 0
		}
	}
	if !e.last.IsZero() && now.Sub(e.last) < l.interval {
		e.suppressed++
		return false, 0
	}
	n := e.suppressed
	e.last, e.suppressed = now, 0
	return true, n
}

// prune forgets the kinds with nothing left to report: logged longer than an
// interval ago with no event since.
func (l *Limiter) prune(now time.Time) {
	for k, e := range l.kinds {
		if e.suppressed == 0 && now.Sub(e.last) >= l.interval {
			delete(l.kinds, k)
		}
	}
}
