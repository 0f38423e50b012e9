package udpflow

import (
	"sync"
	"sync/atomic"
)

// Budget is a number of bytes that many holders draw from: the memory all of
// a daemon's flows may hold, on top of what each one may. Safe for
// concurrent use; a nil *Budget has no limit.
type Budget struct {
	limit int64
	used  atomic.Int64
	gauge Gauge
}

// Gauge is told of every change to a Budget's use (a prometheus.Gauge).
type Gauge interface{ Add(float64) }

// NewBudget returns a Budget of limit bytes whose use gauge, if not nil,
// follows.
func NewBudget(limit int64, gauge Gauge) *Budget { return &Budget{limit: limit, gauge: gauge} }

// Take draws n bytes, or nothing and false if fewer than n are left.
func (b *Budget) Take(n int64) bool {
	if b == nil {
		return true
	}
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			if b.gauge != nil {
				b.gauge.Add(float64(n))
			}
			return true
		}
	}
}

// Return gives back n bytes drawn with Take.
func (b *Budget) Return(n int64) {
	if b != nil && n != 0 {
		b.used.Add(-n)
		if b.gauge != nil {
			b.gauge.Add(float64(-n))
		}
	}
}

// Used is how many bytes are drawn now.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Limit is the Budget's size in bytes (0 for a nil Budget: no limit).
func (b *Budget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit
}

// DefaultQueueBytes bounds the packets one flow holds between its local
// socket and its Sender: about 170 ms at 50 Mbit/s, as much as the 512
// full-size (1200-byte) packets the client's queue held before it was
// bounded in bytes, where 512 packets of 64 KiB were 32 MiB.
const DefaultQueueBytes = 1 << 20

// packetOverhead is what a queued packet costs beyond its payload (its
// slice's header and allocation rounding), charged so that a flood of empty
// packets cannot queue without limit.
const packetOverhead = 64

// Queue holds one flow's packets from its local side until its Sender takes
// them, bounded in bytes for the flow and, through a shared Budget, for all
// flows: a packet that does not fit is dropped, as a router drops what it
// cannot forward, so the local socket is always read and its kernel buffer
// never fills because the peer is slow or stalled. Push is safe for
// concurrent use; Pop has one caller at a time.
type Queue struct {
	limit int64
	total *Budget
	ready chan struct{}

	mu    sync.Mutex
	pkts  [][]byte
	bytes int64
	err   error // set by Close
}

// NewQueue returns a Queue of limit bytes (<= 0: DefaultQueueBytes) that
// also draws on total (nil: no shared limit).
func NewQueue(limit int64, total *Budget) *Queue {
	if limit <= 0 {
		limit = DefaultQueueBytes
	}
	return &Queue{limit: limit, total: total, ready: make(chan struct{}, 1)}
}

// Push queues a copy of p. It returns false, and queues nothing, when the
// flow's queue or the shared budget is full, or the queue is closed.
func (q *Queue) Push(p []byte) bool {
	n := int64(len(p)) + packetOverhead
	q.mu.Lock()
	if q.err != nil || q.bytes+n > q.limit || !q.total.Take(n) {
		q.mu.Unlock()
		return false
	}
	q.pkts = append(q.pkts, append(make([]byte, 0, len(p)), p...))
	q.bytes += n
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return true
}

// Pop returns the oldest packet, waiting for one, or the error given to
// Close once the queue is closed.
func (q *Queue) Pop() ([]byte, error) {
	for {
		q.mu.Lock()
		if q.err != nil {
			err := q.err
			q.mu.Unlock()
			return nil, err
		}
		if len(q.pkts) > 0 {
			p := q.pkts[0]
			q.pkts[0] = nil
			q.pkts = q.pkts[1:]
			n := int64(len(p)) + packetOverhead
			q.bytes -= n
			q.mu.Unlock()
			q.total.Return(n)
			return p, nil
		}
		q.mu.Unlock()
		<-q.ready
	}
}

// Close ends the queue: Pop returns err from now on (err must not be nil),
// and the packets still queued are dropped and their bytes returned. It
// returns how many were dropped; only the first call counts.
func (q *Queue) Close(err error) (dropped int) {
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return 0
	}
	q.err = err
	dropped = len(q.pkts)
	q.total.Return(q.bytes)
	q.pkts, q.bytes = nil, 0
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return dropped
}

// Closed reports whether the queue was closed.
func (q *Queue) Closed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err != nil
}

// Len is the number of packets queued.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pkts)
}
