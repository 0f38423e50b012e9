package udpflow_test

import (
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/udpflow"
)

type gauge struct {
	mu sync.Mutex
	v  float64
}

func (g *gauge) Add(d float64) { g.mu.Lock(); g.v += d; g.mu.Unlock() }

func (g *gauge) get() float64 { g.mu.Lock(); defer g.mu.Unlock(); return g.v }

// TestQueueBoundedInBytes: a flow's queue holds at most its limit in bytes
// (a packet's payload and 64 bytes of overhead), all flows at most their
// shared Budget; what does not fit is refused, and popping or closing
// gives the bytes back.
func TestQueueBoundedInBytes(t *testing.T) {
	t.Parallel()
	g := &gauge{}
	total := udpflow.NewBudget(3000, g)
	a, b := udpflow.NewQueue(2000, total), udpflow.NewQueue(2000, total)
	p := make([]byte, 936) // 1000 bytes with the overhead
	require.True(t, a.Push(p))
	require.True(t, a.Push(p))
	assert.False(t, a.Push(p), "the flow's 2000 bytes are full")
	assert.False(t, a.Push(nil), "an empty packet costs its overhead too")
	require.True(t, b.Push(p))
	assert.False(t, b.Push(p), "the shared 3000 bytes are full")
	assert.Equal(t, int64(3000), total.Used())
	assert.Equal(t, 3000.0, g.get())

	got, err := a.Pop()
	require.NoError(t, err)
	assert.Len(t, got, 936)
	assert.True(t, b.Push(p), "a's popped packet left room")
	assert.Equal(t, 2, b.Close(io.EOF), "closing drops what is queued")
	assert.Zero(t, b.Close(io.EOF), "once")
	_, err = b.Pop()
	require.ErrorIs(t, err, io.EOF)
	assert.False(t, b.Push(p), "a closed queue takes nothing")
	assert.Equal(t, int64(1000), total.Used(), "a's one packet")
	assert.Equal(t, 1000.0, g.get())
	assert.Equal(t, 1, a.Len())
}

// TestQueuePopWaits: Pop waits for a packet, and Close wakes it.
func TestQueuePopWaits(t *testing.T) {
	t.Parallel()
	q := udpflow.NewQueue(0, nil)
	got := make(chan []byte)
	go func() {
		for {
			p, err := q.Pop()
			if err != nil {
				close(got)
				return
			}
			got <- p
		}
	}()
	src := []byte("packet")
	require.True(t, q.Push(src))
	src[0] = 'X' // Push copied it
	assert.Equal(t, []byte("packet"), <-got)
	errDone := errors.New("done")
	q.Close(errDone)
	select {
	case _, ok := <-got:
		assert.False(t, ok)
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake Pop")
	}
}

// bufConn records the buffer sizes asked for.
type bufConn struct {
	mu   sync.Mutex
	rcv  []int
	fail bool
}

func (c *bufConn) SetReadBuffer(n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail {
		return errors.New("no")
	}
	c.rcv = append(c.rcv, n)
	return nil
}

func (c *bufConn) SetWriteBuffer(int) error { return nil }

// TestSizerGrowsWithRateWithinBudget: a flow socket starts small, grows to
// hold 350 ms of its rate in powers of two up to SocketBuffer, never past
// its Budget (as the kernel books it: twice the size), and gives it back.
func TestSizerGrowsWithRateWithinBudget(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	budget := udpflow.NewBudget(2*(1<<20)+udpflow.InitialFlowBuffer, nil) // one flow of 1 MiB, and less than another flow
	c := &bufConn{}
	s, err := udpflow.NewSizer(c, budget, clock)
	require.NoError(t, err)
	assert.Equal(t, []int{udpflow.InitialFlowBuffer}, c.rcv)
	assert.Equal(t, int64(2*udpflow.InitialFlowBuffer), budget.Used())

	// 100 KB in 100 ms: 1 MB/s wants 350 KB, asked as 512 KiB.
	for range 100 {
		s.Observe(1000)
	}
	now = now.Add(100 * time.Millisecond)
	s.Observe(0)
	assert.Equal(t, 512<<10, s.Size())
	assert.Equal(t, int64(2*(512<<10)), budget.Used())

	// 10 MB/s wants 4 MiB; the budget holds 1 MiB.
	for range 1000 {
		s.Observe(1000)
	}
	now = now.Add(100 * time.Millisecond)
	s.Observe(0)
	assert.Equal(t, 1<<20, s.Size(), "the largest step the budget holds")
	assert.Equal(t, []int{udpflow.InitialFlowBuffer, 512 << 10, 1 << 20}, c.rcv)

	_, err = udpflow.NewSizer(&bufConn{}, budget, clock)
	require.ErrorIs(t, err, udpflow.ErrNoSocketMemory, "no room for another flow")
	s.Close()
	assert.Zero(t, budget.Used())
	_, err = udpflow.NewSizer(&bufConn{fail: true}, budget, clock)
	require.Error(t, err)
	assert.Zero(t, budget.Used(), "a socket that refuses gives its share back")

	// A slow flow stays where it started.
	slow, err := udpflow.NewSizer(&bufConn{}, budget, clock)
	require.NoError(t, err)
	for range 50 {
		slow.Observe(100)
		now = now.Add(10 * time.Millisecond)
	}
	assert.Equal(t, udpflow.InitialFlowBuffer, slow.Size())
	slow.Close()
}
