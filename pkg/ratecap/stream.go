package ratecap

import (
	"context"
	"time"

	"github.com/quictun/quictun/pkg/splice"
)

// maxRead bounds one read or write of a capped stream at low rates, so
// that it never books much more than a burst at a time; at high rates a
// burst's worth (Bucket.chunk) is the bound.
const maxRead = 16 << 10

// Stream is a tunnel stream whose reads (the client's upload) go no faster
// than up allows, and, when down is set, whose writes (toward the client)
// no faster than down (for connections whose sender has no Controller: the
// TCP fallback). After each read or write it waits for the budget the
// bytes took; QUIC's (or tcpmux's) flow control holds the client back
// meanwhile. A wait ends early when ctx does (the connection's end).
type Stream struct {
	splice.Stream
	ctx      context.Context
	up, down *Bucket
}

// NewStream caps str by up (reads) and down (writes; nil: not capped here).
func NewStream(ctx context.Context, str splice.Stream, up, down *Bucket) *Stream {
	return &Stream{Stream: str, ctx: ctx, up: up, down: down}
}

// Read implements io.Reader. The clock is read once, after a read that
// moved bytes, and not at all without a budget (an uncapped identity on
// a server without --link-rate): every read of a capped server's tunnels
// comes through here.
func (s *Stream) Read(p []byte) (int, error) {
	up := s.up.paced()
	if up == nil {
		return s.Stream.Read(p)
	}
	n, err := s.Stream.Read(p[:min(len(p), up.chunk())])
	if n > 0 {
		now := monoNow()
		if up != s.up {
			s.up.rest.refresh(now) // the link's rest paces it (Bucket.pacer)
		}
		s.wait(up.delay(now, n))
	}
	return n, err
}

// Write implements io.Writer. Without a download budget here (a QUIC
// connection, paced in its sender) it only passes the bytes on, without
// reading the clock.
func (s *Stream) Write(p []byte) (int, error) {
	down := s.down.paced()
	if down == nil {
		return s.Stream.Write(p)
	}
	if down != s.down {
		s.down.rest.refresh(monoNow()) // the link's rest paces it (Bucket.pacer)
	}
	written := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), down.chunk())]
		n, err := s.Stream.Write(chunk)
		written += n
		if err != nil {
			return written, err
		}
		p = p[n:]
		s.wait(down.delay(monoNow(), n))
	}
	return written, nil
}

func (s *Stream) wait(d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.ctx.Done():
	}
}

// epoch anchors monoNow.
var epoch = time.Now()

// monoNow is a monotonic clock in nanoseconds for the stream budgets.
func monoNow() int64 { return int64(time.Since(epoch)) }
