package liveness_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quictun/quictun/pkg/liveness"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errClosed = errors.New("connection closed")

// fakeConn delivers datagrams from in and records what is sent.
type fakeConn struct {
	in      chan []byte
	mu      sync.Mutex
	sent    [][]byte
	sentAt  []time.Time
	sendErr error
}

func newFakeConn() *fakeConn { return &fakeConn{in: make(chan []byte)} }

func (c *fakeConn) ReceiveDatagram(ctx context.Context) ([]byte, error) {
	select {
	case b, ok := <-c.in:
		if !ok {
			return nil, errClosed
		}
		return b, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *fakeConn) SendDatagram(b []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sendErr != nil {
		return c.sendErr
	}
	c.sent = append(c.sent, bytes.Clone(b))
	c.sentAt = append(c.sentAt, time.Now())
	return nil
}

func (c *fakeConn) sentCopy() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.sent...)
}

func (c *fakeConn) times() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.sentAt...)
}

func heartbeat(seq uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{liveness.TypeHeartbeat}, seq)
}

// startReceiver runs a Receiver in the current synctest bubble; the returned
// func stops it and waits for Run to return.
func startReceiver(t *testing.T, c *fakeConn, echo bool, maxEchoes int, st *liveness.Stats) (*liveness.Receiver, func()) {
	t.Helper()
	r := liveness.NewReceiver(c, echo, maxEchoes, st)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	return r, func() {
		cancel()
		<-done
	}
}

func TestReceiverEchoesHeartbeats(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c, st := newFakeConn(), &liveness.Stats{}
		_, stop := startReceiver(t, c, true, 100, st)
		defer stop()
		for seq := range uint64(3) {
			c.in <- heartbeat(seq + 7)
		}
		synctest.Wait()
		sent := c.sentCopy()
		require.Len(t, sent, 3)
		for i, b := range sent {
			want := binary.BigEndian.AppendUint64([]byte{liveness.TypeEcho}, uint64(i)+7)
			assert.Equal(t, want, b, "echo %d carries the heartbeat's payload", i)
		}
		assert.Equal(t, uint64(3), st.EchoesSent.Load())
		assert.Zero(t, st.Invalid.Load())
		assert.Zero(t, st.EchoesReceived.Load())
	})
}

func TestReceiverRateLimitsEchoes(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c, st := newFakeConn(), &liveness.Stats{}
		_, stop := startReceiver(t, c, true, 3, st)
		defer stop()
		for i := range 10 {
			c.in <- heartbeat(uint64(i))
		}
		synctest.Wait()
		assert.Len(t, c.sentCopy(), 3, "at most 3 echoes in the first second")
		assert.Zero(t, st.Invalid.Load(), "rate-limited heartbeats are not invalid")

		time.Sleep(500 * time.Millisecond)
		c.in <- heartbeat(100)
		synctest.Wait()
		assert.Len(t, c.sentCopy(), 3, "still the same second")

		time.Sleep(600 * time.Millisecond) // a new one-second window
		for i := range 5 {
			c.in <- heartbeat(200 + uint64(i))
		}
		synctest.Wait()
		sent := c.sentCopy()
		require.Len(t, sent, 6)
		assert.Equal(t, binary.BigEndian.AppendUint64([]byte{liveness.TypeEcho}, 200), sent[3])
		assert.Equal(t, uint64(6), st.EchoesSent.Load())
	})
}

func TestReceiverDoesNotCountFailedEchoes(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c, st := newFakeConn(), &liveness.Stats{}
		c.sendErr = errors.New("datagram queue full")
		_, stop := startReceiver(t, c, true, 10, st)
		defer stop()
		c.in <- heartbeat(1)
		synctest.Wait()
		assert.Zero(t, st.EchoesSent.Load())
	})
}

func TestReceiverRecordsLastEcho(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c, st := newFakeConn(), &liveness.Stats{}
		start := time.Now()
		r, stop := startReceiver(t, c, false, 0, st)
		defer stop()
		assert.True(t, r.LastEcho().Equal(start), "LastEcho starts at creation")

		time.Sleep(5 * time.Second)
		c.in <- []byte{liveness.TypeEcho, 0, 0, 0, 0, 0, 0, 0, 1}
		synctest.Wait()
		assert.True(t, r.LastEcho().Equal(start.Add(5*time.Second)), "LastEcho %v", r.LastEcho().Sub(start))
		assert.Equal(t, uint64(1), st.EchoesReceived.Load())

		time.Sleep(time.Second)
		c.in <- []byte{liveness.TypeTail}
		synctest.Wait()
		assert.True(t, r.LastEcho().Equal(start.Add(5*time.Second)), "only echoes move LastEcho")
		assert.Empty(t, c.sentCopy(), "a client never echoes")
	})
}

func TestReceiverInvalidDatagrams(t *testing.T) {
	t.Parallel()
	long := append([]byte{liveness.TypeHeartbeat}, make([]byte, 64)...)   // 65 bytes
	maxLen := append([]byte{liveness.TypeHeartbeat}, make([]byte, 63)...) // 64 bytes
	for _, tc := range []struct {
		name        string
		server      bool
		dgram       []byte
		wantInvalid uint64
		wantSent    int
		wantEchoRx  uint64
	}{
		{"server: empty", true, []byte{}, 1, 0, 0},
		{"server: unknown type", true, []byte("Xhello"), 1, 0, 0},
		{"server: echo from client", true, []byte{liveness.TypeEcho, 1}, 1, 0, 0},
		{"server: oversized heartbeat", true, long, 1, 0, 0},
		{"server: 64-byte heartbeat is fine", true, maxLen, 0, 1, 0},
		{"server: tail probe ignored", true, []byte{liveness.TypeTail}, 0, 0, 0},
		{"server: bare heartbeat type", true, []byte{liveness.TypeHeartbeat}, 0, 1, 0},
		{"client: empty", false, nil, 1, 0, 0},
		{"client: heartbeat from server", false, heartbeat(1), 1, 0, 0},
		{"client: unknown type", false, []byte{0}, 1, 0, 0},
		{"client: tail probe ignored", false, []byte{liveness.TypeTail, 9, 9}, 0, 0, 0},
		{"client: echo", false, []byte{liveness.TypeEcho}, 0, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				c, st := newFakeConn(), &liveness.Stats{}
				_, stop := startReceiver(t, c, tc.server, 10, st)
				defer stop()
				c.in <- tc.dgram
				synctest.Wait()
				assert.Equal(t, tc.wantInvalid, st.Invalid.Load(), "invalid")
				assert.Len(t, c.sentCopy(), tc.wantSent, "sent")
				assert.Equal(t, tc.wantEchoRx, st.EchoesReceived.Load(), "echoes received")
			})
		})
	}
}

func TestReceiverRunReturns(t *testing.T) {
	t.Parallel()
	t.Run("ctx cancelled", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			c := newFakeConn()
			_, stop := startReceiver(t, c, true, 1, &liveness.Stats{})
			stop() // waits for Run to return
		})
	})
	t.Run("connection closed", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			c := newFakeConn()
			r := liveness.NewReceiver(c, true, 1, &liveness.Stats{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				r.Run(context.Background())
			}()
			close(c.in)
			<-done
		})
	})
}

func TestSendHeartbeat(t *testing.T) {
	t.Parallel()
	c, st := newFakeConn(), &liveness.Stats{}
	require.NoError(t, liveness.SendHeartbeat(c, 0x0102030405060708, st))
	// Padded to 40 bytes so the QUIC packet is long enough to draw a stateless reset.
	want := append([]byte{liveness.TypeHeartbeat, 1, 2, 3, 4, 5, 6, 7, 8}, make([]byte, 31)...)
	assert.Equal(t, [][]byte{want}, c.sentCopy())
	assert.Equal(t, uint64(1), st.HeartbeatsSent.Load())

	c.sendErr = errors.New("too large")
	require.ErrorIs(t, liveness.SendHeartbeat(c, 2, st), c.sendErr)
	assert.Equal(t, uint64(1), st.HeartbeatsSent.Load(), "failed sends are not counted")
}

// startProber runs p in the current bubble; the returned func stops it and waits.
func startProber(p *liveness.TailProber) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

func TestTailProberSendsCountProbesAfterKick(t *testing.T) {
	t.Parallel()
	for _, count := range []int{1, 2, 4} {
		t.Run("count="+strconv.Itoa(count), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const delay = 5 * time.Millisecond
				c, st := newFakeConn(), &liveness.Stats{}
				p := liveness.NewTailProber(c, count, delay, st)
				stop := startProber(p)
				defer stop()
				synctest.Wait()
				assert.Empty(t, c.sentCopy(), "nothing before a kick")

				start := time.Now()
				p.Kick()
				time.Sleep(time.Second)
				sent, at := c.sentCopy(), c.times()
				require.Len(t, sent, count)
				for i := range sent {
					assert.Equal(t, []byte{liveness.TypeTail}, sent[i])
					assert.Equal(t, time.Duration(i+1)*delay, at[i].Sub(start), "probe %d timing", i)
				}
				assert.Equal(t, uint64(count), st.TailProbesSent.Load())
			})
		})
	}
}

func TestTailProberCoalescesKicks(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const delay, count = 10 * time.Millisecond, 2
		c, st := newFakeConn(), &liveness.Stats{}
		p := liveness.NewTailProber(c, count, delay, st)
		stop := startProber(p)
		defer stop()
		synctest.Wait()

		p.Kick()
		time.Sleep(3 * time.Millisecond)
		for range 50 {
			p.Kick() // more of the burst before the first probe: the same round covers it
		}
		time.Sleep(time.Second)
		assert.Len(t, c.sentCopy(), count)

		p.Kick()
		time.Sleep(delay + delay/2)
		p.Kick() // after the first probe of a round: its last probe covers it
		time.Sleep(time.Second)
		assert.Len(t, c.sentCopy(), 2*count)
		assert.Equal(t, uint64(2*count), st.TailProbesSent.Load())

		// Failed sends are not counted.
		c.mu.Lock()
		c.sendErr = errors.New("closed")
		c.mu.Unlock()
		p.Kick()
		time.Sleep(time.Second)
		assert.Equal(t, uint64(2*count), st.TailProbesSent.Load())
	})
}

func TestTailProberDisabledAndStop(t *testing.T) {
	t.Parallel()
	t.Run("count 0", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			c := newFakeConn()
			p := liveness.NewTailProber(c, 0, time.Millisecond, &liveness.Stats{})
			p.Kick()
			p.Kick() // never blocks
			p.Run(context.Background())
			assert.Empty(t, c.sentCopy())
		})
	})
	t.Run("nil prober", func(t *testing.T) {
		t.Parallel()
		var p *liveness.TailProber
		assert.NotPanics(t, p.Kick)
	})
	t.Run("stop while probing", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			c := newFakeConn()
			p := liveness.NewTailProber(c, 4, time.Hour, &liveness.Stats{})
			stop := startProber(p)
			p.Kick()
			synctest.Wait()
			stop() // returns although the next probe is an hour away
			assert.Empty(t, c.sentCopy())
		})
	})
	t.Run("stop when done, no goroutine", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			c := newFakeConn()
			p := liveness.NewTailProber(c, 4, 10*time.Millisecond, &liveness.Stats{})
			ctx, cancel := context.WithCancel(context.Background())
			p.StopWhenDone(ctx)
			p.Kick()
			time.Sleep(15 * time.Millisecond)
			synctest.Wait()
			require.Len(t, c.sentCopy(), 1, "probing while ctx lives")
			cancel()
			synctest.Wait()
			time.Sleep(time.Second)
			assert.Len(t, c.sentCopy(), 1, "no probe after ctx is done")
		})
	})
}

func TestTailProberSkipsWhenThePeerAnswered(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const delay = 5 * time.Millisecond
		c, st := newFakeConn(), &liveness.Stats{}
		p := liveness.NewTailProber(c, 2, delay, st)
		stop := startProber(p)
		defer stop()
		p.Kick()
		time.Sleep(time.Millisecond)
		p.Heard() // the answer arrived before the probe was due: the burst was not lost
		time.Sleep(time.Second)
		assert.Empty(t, c.sentCopy())

		p.Kick() // a new burst, no answer: probes go out
		time.Sleep(time.Second)
		assert.Len(t, c.sentCopy(), 2)
		assert.Equal(t, uint64(2), st.TailProbesSent.Load())
	})
}

func TestTailProberAdaptsToShortPaths(t *testing.T) {
	t.Parallel()
	const delay = time.Millisecond
	for _, tc := range []struct {
		name string
		srtt time.Duration
		want time.Duration
	}{
		{"rtt unknown", 0, delay},
		{"loopback", 100 * time.Microsecond, 2200 * time.Microsecond},
		{"LAN", 2 * time.Millisecond, 6 * time.Millisecond}, // the answer usually wins
		{"limit", 4 * time.Millisecond, liveness.ShortPathWait},
		{"above the limit", 5 * time.Millisecond, delay}, // two RTTs would lose to the probe timeout; srtt/8 < delay
		// Longer paths: srtt/8, as soon as quic-go's time threshold
		// (9/8 RTT) would declare a lost burst anyway, at most
		// LongPathWait (the probe timeout counts from the probe).
		{"WAN", 25 * time.Millisecond, 25 * time.Millisecond / 8},
		{"cap", 40 * time.Millisecond, liveness.LongPathWait},
		{"satellite", 600 * time.Millisecond, liveness.LongPathWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				c := newFakeConn()
				p := liveness.NewTailProber(c, 1, delay, &liveness.Stats{}).WithRTT(func() time.Duration { return tc.srtt })
				stop := startProber(p)
				defer stop()
				start := time.Now()
				p.Kick()
				time.Sleep(time.Second)
				at := c.times()
				require.Len(t, at, 1)
				assert.Equal(t, tc.want, at[0].Sub(start))
			})
		})
	}
}

// TestTailProberRequestResponse: in a ping-pong each answer arrives before the
// probe is due and the next request is written right after it, while the
// previous round's timer is still pending. No probe may go out, and the
// last request, never answered, still gets its probe a full wait after it.
func TestTailProberRequestResponse(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const delay = 5 * time.Millisecond
		c, st := newFakeConn(), &liveness.Stats{}
		p := liveness.NewTailProber(c, 1, delay, st)
		stop := startProber(p)
		defer stop()
		for range 100 {
			p.Kick() // request
			time.Sleep(3 * time.Millisecond)
			p.Heard() // its answer
		}
		last := time.Now()
		p.Kick() // the last request is lost
		time.Sleep(time.Second)
		at := c.times()
		require.Len(t, at, 1, "only the unanswered request is probed")
		assert.Equal(t, delay, at[0].Sub(last))
		assert.Equal(t, uint64(1), st.TailProbesSent.Load())
	})
}

// blockingConn's SendDatagram blocks until release is closed, as quic-go's
// does while its datagram queue is full on a congestion-limited connection.
type blockingConn struct {
	fakeConn
	entered chan struct{}
	release chan struct{}
}

func (c *blockingConn) SendDatagram(b []byte) error {
	select {
	case c.entered <- struct{}{}:
	default:
	}
	<-c.release
	return errClosed
}

func TestTailProberStopsWhileASendIsBlocked(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := &blockingConn{fakeConn: *newFakeConn(), entered: make(chan struct{}, 1), release: make(chan struct{})}
		p := liveness.NewTailProber(c, 2, time.Millisecond, &liveness.Stats{})
		stop := startProber(p)
		p.Kick()
		<-c.entered // the probe's send is stuck
		p.Kick()    // never blocks either
		stop()      // returns although the send is still blocked
		close(c.release)
		synctest.Wait()
	})
}
