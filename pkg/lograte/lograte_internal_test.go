package lograte

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }

func newTest(interval time.Duration, maxKinds int) (*Limiter, *clock) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(interval, maxKinds)
	l.now = c.now
	return l, c
}

type step struct {
	advance    time.Duration
	kind       string
	logged     bool
	suppressed int
}

func TestAllow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		maxKinds int
		steps    []step
	}{
		{"first of each kind, then once per interval with the count left out", 8, []step{
			{0, "a", true, 0},
			{time.Second, "a", false, 0},
			{time.Second, "b", true, 0},
			{time.Second, "a", false, 0},
			{time.Minute, "a", true, 2},
			{0, "a", false, 0},
			{time.Minute, "a", true, 1},
			{time.Minute, "b", true, 0},
		}},
		{"kinds beyond the limit share one line per interval", 2, []step{
			{0, "a", true, 0},
			{0, "b", true, 0},
			{0, "c", true, 0}, // Overflow's first line
			{0, "d", false, 0},
			{0, "c", false, 0},
			{time.Minute, "e", true, 0}, // a and b are forgotten: room again
			{0, "f", true, 2},           // full again: Overflow's line, due after an interval, with what it left out
			{0, "g", false, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, c := newTest(time.Minute, tc.maxKinds)
			for i, s := range tc.steps {
				c.add(s.advance)
				logged, n := l.Allow(s.kind)
				assert.Equal(t, s.logged, logged, "step %d (%s)", i, s.kind)
				assert.Equal(t, s.suppressed, n, "step %d (%s)", i, s.kind)
			}
		})
	}
}

func TestAllowBounded(t *testing.T) {
	t.Parallel()
	l, _ := newTest(time.Minute, 16)
	var wg sync.WaitGroup
	logged := make([]int, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				if ok, _ := l.Allow(fmt.Sprint(g, i)); ok {
					logged[g]++
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for _, n := range logged {
		total += n
	}
	require.Equal(t, 17, total, "16 kinds and one overflow line per interval")
	assert.LessOrEqual(t, len(l.kinds), 17)
}
