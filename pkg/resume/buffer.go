package resume

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// ChunkSize is the unit a Buffer grows and shrinks by: an idle tunnel whose
// bytes are all confirmed holds none.
const ChunkSize = 32 << 10

var chunkPool = sync.Pool{New: func() any { b := make([]byte, ChunkSize); return &b }}

// Errors of an offset the peer reports.
var (
	// ErrBehind: the peer says it has fewer bytes than it confirmed
	// already; those bytes are gone from the buffer.
	ErrBehind = errors.New("peer offset behind the resume buffer")
	// ErrAhead: the peer says it has bytes that were never sent.
	ErrAhead = errors.New("peer offset ahead of the bytes sent")
)

// Budget bounds the bytes all Buffers of a daemon hold. A Buffer that would
// grow past it waits (its tunnel stops reading the application) until
// another's bytes are confirmed. Safe for concurrent use.
type Budget struct {
	max  int64
	used atomic.Int64

	mu    sync.Mutex
	freed chan struct{} // closed (and replaced) when bytes are given back
}

// NewBudget returns a Budget of max bytes (<= 0: no bound).
func NewBudget(max int64) *Budget { return &Budget{max: max, freed: make(chan struct{})} }

// Max is the bound (<= 0: none).
func (b *Budget) Max() int64 { return b.max }

// Used is the bytes taken.
func (b *Budget) Used() int64 { return b.used.Load() }

// take takes n bytes if they fit, or returns a channel closed when some are
// given back.
func (b *Budget) take(n int64) (bool, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.max > 0 && b.used.Load()+n > b.max {
		return false, b.freed
	}
	b.used.Add(n)
	return true, nil
}

func (b *Budget) give(n int64) {
	b.mu.Lock()
	b.used.Add(-n)
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// Buffer is one direction of a resumable tunnel on the side that sends it:
// the bytes read from the application that the peer has not confirmed, in
// chunks of ChunkSize taken as needed (at most cap bytes, within the
// Budget). Offsets count the direction's bytes from 0.
//
//	base <= sent <= end
//	base: the peer confirmed everything before it (Ack)
//	sent: the writer wrote everything before it on the current stream
//	end:  the application's bytes read so far
//
// One goroutine fills it (Append, Finish), one writes from it
// (Peek, Advance); Ack and Rewind come from anywhere.
type Buffer struct {
	mu     sync.Mutex
	chunks []*[]byte
	start  uint64 // offset of chunks[0][0]
	base   uint64
	sent   uint64
	end    uint64
	eof    bool
	closed bool
	cap    int
	budget *Budget
	// sentUnknown: restored from an export (restore), whose writes on the
	// previous process's stream are not recorded: bytes past base may be
	// in flight until the peer tells its offset (Rewind).
	sentUnknown bool

	grew  chan struct{} // closed when bytes were committed or eof set
	freed chan struct{} // closed when chunks were given back
	// writerWaits: Peek handed out grew (a channel is made anew only
	// then, not for every read of the application).
	writerWaits bool
}

// NewBuffer returns an empty Buffer holding at most capBytes (rounded up to
// a chunk) within budget (nil: none).
func NewBuffer(capBytes int, budget *Budget) *Buffer {
	if budget == nil {
		budget = NewBudget(0)
	}
	if capBytes < ChunkSize {
		capBytes = ChunkSize
	}
	return &Buffer{cap: capBytes, budget: budget, grew: make(chan struct{}), freed: make(chan struct{})}
}

// ErrClosed is returned by Append once the Buffer is closed.
var ErrClosed = errors.New("resume buffer closed")

// Append copies as much of p as fits, taking chunks as needed; when not
// all of it fits (the tunnel's cap or the Budget is reached) it returns a
// channel closed when that may change. The application is read into a
// buffer of the reader's own, not into a chunk: a chunk is given back the
// moment its bytes are confirmed, even while the reader waits for more.
func (b *Buffer) Append(p []byte) (int, <-chan struct{}, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, nil, ErrClosed
	}
	n := 0
	for n < len(p) {
		pos := b.end - b.start
		idx, off := int(pos/ChunkSize), int(pos%ChunkSize)
		if idx == len(b.chunks) {
			if (len(b.chunks)+1)*ChunkSize > b.cap {
				b.commitLocked(n)
				return n, b.freed, nil
			}
			ok, wait := b.budget.take(ChunkSize)
			if !ok {
				b.commitLocked(n)
				return n, wait, nil
			}
			b.chunks = append(b.chunks, chunkPool.Get().(*[]byte))
		}
		k := copy((*b.chunks[idx])[off:], p[n:])
		n += k
		b.end += uint64(k)
	}
	b.commitLocked(n)
	return n, nil, nil
}

// preload appends p whatever the caps (bytes already written on the first
// stream, at most a proxy request's read) and records them as sent.
func (b *Buffer) preload(p []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.appendLocked(p)
	b.sent = b.end
}

// appendAll appends p whatever the caps: the rest of one read of the
// application when the tunnel is exported (those bytes were taken from the
// socket, they must go with it).
func (b *Buffer) appendAll(p []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.appendLocked(p)
	}
}

func (b *Buffer) appendLocked(p []byte) {
	for len(p) > 0 {
		pos := b.end - b.start
		idx, off := int(pos/ChunkSize), int(pos%ChunkSize)
		if idx == len(b.chunks) {
			b.budget.used.Add(ChunkSize)
			b.chunks = append(b.chunks, chunkPool.Get().(*[]byte))
		}
		k := copy((*b.chunks[idx])[off:], p)
		p = p[k:]
		b.end += uint64(k)
	}
}

func (b *Buffer) commitLocked(n int) {
	if n > 0 {
		b.wakeWriterLocked()
	}
}

// Finish records the application's EOF: the writer sends FIN after the
// last byte.
func (b *Buffer) Finish() {
	b.mu.Lock()
	b.eof = true
	b.wakeWriterLocked()
	b.mu.Unlock()
}

func (b *Buffer) wakeWriterLocked() {
	if b.writerWaits {
		b.writerWaits = false
		close(b.grew)
		b.grew = make(chan struct{})
	}
}

// Peek returns the bytes from sent on (at most to the end of a chunk), and
// whether the application's EOF follows them; with nothing to send and no
// EOF, a channel closed when that changes.
func (b *Buffer) Peek() (p []byte, eof bool, wait <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sent == b.end {
		if b.eof {
			return nil, true, nil
		}
		b.writerWaits = true
		return nil, false, b.grew
	}
	pos := b.sent - b.start
	idx, off := int(pos/ChunkSize), int(pos%ChunkSize)
	n := min(uint64(ChunkSize-off), b.end-b.sent)
	return (*b.chunks[idx])[off : off+int(n)], false, nil
}

// Advance records n bytes written to the stream.
func (b *Buffer) Advance(n int) {
	b.mu.Lock()
	b.sent += uint64(n)
	b.mu.Unlock()
}

// Ack records the peer's confirmation of every byte before off. An offset
// at or behind base changes nothing; one past sent (never written, or
// written by a Write that has not returned) is not trusted yet and returns
// ErrAhead: chunks are given back only behind sent, so the writer never
// reads a chunk another Buffer reuses.
func (b *Buffer) Ack(off uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if off > b.sent {
		return fmt.Errorf("%w: %d > %d", ErrAhead, off, b.sent)
	}
	b.ackLocked(off)
	return nil
}

func (b *Buffer) ackLocked(off uint64) {
	if off <= b.base {
		return
	}
	b.base = off
	freed := 0
	for len(b.chunks) > 0 && b.base-b.start >= ChunkSize {
		chunkPool.Put(b.chunks[0])
		b.chunks[0] = nil
		b.chunks = b.chunks[1:]
		b.start += ChunkSize
		freed++
	}
	if b.base == b.end && len(b.chunks) == 1 {
		// All confirmed: an idle tunnel holds no chunk.
		chunkPool.Put(b.chunks[0])
		b.chunks = nil
		b.start = b.end
		freed++
	}
	if freed > 0 {
		b.budget.give(int64(freed) * ChunkSize)
		close(b.freed)
		b.freed = make(chan struct{})
	}
}

// Rewind starts a new stream: off is what the peer received; the bytes
// before it are confirmed and the writer resends from it. Only while no
// writer runs. ErrBehind and ErrAhead: the tunnel cannot resume.
func (b *Buffer) Rewind(off uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case off < b.base:
		return fmt.Errorf("%w: %d < %d", ErrBehind, off, b.base)
	case off > b.end:
		return fmt.Errorf("%w: %d > %d", ErrAhead, off, b.end)
	}
	b.sent = b.end // every byte up to end may have been written
	b.ackLocked(off)
	b.sent = off
	b.sentUnknown = false
	return nil
}

// Confirmed returns base and whether the peer confirmed every byte sent
// (base == sent, known): then the peer holds exactly base of them.
func (b *Buffer) Confirmed() (base uint64, all bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.base, b.base == b.sent && !b.sentUnknown
}

// Offsets returns base, sent and end.
func (b *Buffer) Offsets() (base, sent, end uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.base, b.sent, b.end
}

// confirmed returns the offsets and a channel closed when a chunk is given
// back (the last byte's confirmation gives back the last chunk).
func (b *Buffer) confirmed() (base, sent, end uint64, freed <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.base, b.sent, b.end, b.freed
}

// Held is the bytes of the chunks held.
func (b *Buffer) Held() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.chunks) * ChunkSize
}

// Close gives back every chunk; Append fails from then on. Only once no
// writer runs.
func (b *Buffer) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	for _, c := range b.chunks {
		chunkPool.Put(c)
	}
	if n := len(b.chunks); n > 0 {
		b.budget.give(int64(n) * ChunkSize)
	}
	b.chunks = nil
	close(b.freed)
	b.freed = make(chan struct{})
}
