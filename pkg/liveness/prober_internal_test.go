package liveness

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// countConn counts the datagrams sent on it.
type countConn struct{ sent atomic.Int64 }

func (c *countConn) SendDatagram([]byte) error { c.sent.Add(1); return nil }

func (c *countConn) ReceiveDatagram(ctx context.Context) ([]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestHeardEndsTheAnsweredRound: an answer ends the pending round at once,
// its timer stopped (no firing only to find the answer), and the next
// request starts a round of its own that still probes when unanswered.
func TestHeardEndsTheAnsweredRound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const delay = 5 * time.Millisecond
		c := &countConn{}
		p := NewTailProber(c, 1, delay, &Stats{})
		defer p.timer.Stop()

		p.Kick()
		assert.True(t, p.armed.Load())
		time.Sleep(time.Millisecond)
		p.Heard()
		assert.False(t, p.armed.Load(), "the answered round ended at the answer")
		assert.False(t, p.timer.Stop(), "its timer is stopped")

		p.Kick() // the next request, never answered
		assert.True(t, p.armed.Load())
		time.Sleep(time.Second)
		assert.Equal(t, int64(1), c.sent.Load(), "the unanswered request is probed")
	})
}

// TestHeardRacingKicks: answers and writes of many goroutines at once (run
// with -race); a write after the last answer is always probed.
func TestHeardRacingKicks(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := &countConn{}
		p := NewTailProber(c, 1, time.Millisecond, &Stats{})
		defer p.timer.Stop()
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 200 {
					if (i+g)%2 == 0 {
						p.Kick()
					} else {
						p.Heard()
					}
					if i%16 == 0 {
						time.Sleep(100 * time.Microsecond)
					}
				}
			})
		}
		wg.Wait()
		time.Sleep(time.Second)
		before := c.sent.Load()
		p.Kick()
		time.Sleep(time.Second)
		assert.Equal(t, before+1, c.sent.Load(), "the last write is probed")
		assert.False(t, p.armed.Load(), "no round left pending")
	})
}
