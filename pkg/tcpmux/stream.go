package tcpmux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/net/http2"
)

// errStreamEnded is the cause of a stream's context once both directions
// have ended.
var errStreamEnded = errors.New("tcpmux: stream ended")

// Stream is one bidirectional stream. Read, and Write with Close, may run on
// two goroutines; Write and Close must not be called concurrently with each
// other (as with quic-go). CancelRead, CancelWrite and the deadlines may be
// called from any goroutine.
type Stream struct {
	c     *Conn
	id    uint32
	local bool

	ctx    context.Context
	cancel context.CancelCauseFunc
	// wmu serialises Write and Close.
	wmu sync.Mutex

	// Guarded by c.mu.
	buf          [][]byte
	buffered     int64
	recvAvail    int64 // stream credit the peer still has
	recvUnacked  int64 // bytes read and not yet given back
	recvFin      bool  // END_STREAM received
	recvReset    bool  // RESET_WRITE or RST_STREAM received
	readErr      error // what Read returns instead of data: a reset either way
	sendWindow   int64
	sendDone     bool // FIN or reset queued, or the peer stopped us
	writeErr     error
	readDeadline time.Time
	writeDeadln  time.Time
	readNotify   chan struct{}
	writeNotify  chan struct{}
	// For a stream the peer opened: accepted by AcceptStream; read from at
	// least once; ended both ways (forgotten, but still counted against the
	// peer's limit until accepted).
	accepted, readOnce, ended bool
}

// StreamID is the stream's HTTP/2 stream ID: odd when the client opened
// it, even when the server did.
func (s *Stream) StreamID() quic.StreamID { return quic.StreamID(s.id) }

// Context is cancelled once the stream's write direction has ended (Close,
// CancelWrite, the peer's STOP_SENDING or reset) or the connection closes.
func (s *Stream) Context() context.Context { return s.ctx }

// Read reads data the peer sent. It returns io.EOF after the peer's FIN,
// a *quic.StreamError after a reset (the peer's: Remote true, or
// CancelRead's), the connection's error once it closed, or
// os.ErrDeadlineExceeded.
func (s *Stream) Read(p []byte) (int, error) {
	c := s.c
	for {
		c.mu.Lock()
		if s.readErr != nil {
			err := s.readErr
			c.mu.Unlock()
			return 0, err
		}
		if s.buffered > 0 {
			n := s.readLocked(p)
			c.mu.Unlock()
			return n, nil
		}
		if s.recvFin {
			c.mu.Unlock()
			return 0, io.EOF
		}
		if c.closeErr != nil {
			err := c.closeErr
			c.mu.Unlock()
			return 0, err
		}
		if len(p) == 0 {
			c.mu.Unlock()
			return 0, nil
		}
		dl := s.readDeadline
		c.mu.Unlock()
		if err := c.wait(dl, s.readNotify, nil); err != nil {
			return 0, err
		}
	}
}

// readLocked copies buffered data into p and gives the credit back.
func (s *Stream) readLocked(p []byte) int {
	c := s.c
	n := 0
	for n < len(p) && len(s.buf) > 0 {
		m := copy(p[n:], s.buf[0])
		n += m
		if m == len(s.buf[0]) {
			s.buf[0] = nil
			s.buf = s.buf[1:]
		} else {
			s.buf[0] = s.buf[0][m:]
		}
	}
	s.buffered -= int64(n)
	s.readOnce = true
	c.consumedLocked(int64(n))
	if !s.recvFin && !s.recvReset {
		s.recvUnacked += int64(n)
		if s.recvUnacked >= int64(c.streamWindow)/4 {
			c.queueLocked(ctrlFrame{typ: http2.FrameWindowUpdate, streamID: s.id, value: uint32(s.recvUnacked)})
			s.recvAvail += s.recvUnacked
			s.recvUnacked = 0
		}
	}
	return n
}

// Write sends p, waiting for flow-control credit. It fails with the
// *quic.StreamError of a reset (CancelWrite's, or the peer's STOP_SENDING:
// Remote true), the connection's error, or os.ErrDeadlineExceeded.
func (s *Stream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	c := s.c
	written := 0
	for len(p) > 0 {
		c.mu.Lock()
		if err := s.writeErrLocked(); err != nil {
			c.mu.Unlock()
			return written, err
		}
		dl := s.writeDeadln
		if !dl.IsZero() && !time.Now().Before(dl) {
			c.mu.Unlock()
			return written, os.ErrDeadlineExceeded
		}
		n := min(int64(len(p)), s.sendWindow, c.sendWindow, int64(c.peerMaxFrame))
		if n <= 0 {
			credit := c.credit
			c.mu.Unlock()
			if err := c.wait(dl, s.writeNotify, credit); err != nil {
				return written, err
			}
			continue
		}
		s.sendWindow -= n
		c.sendWindow -= n
		c.mu.Unlock()
		if err := s.writeData(p[:n]); err != nil {
			c.mu.Lock()
			s.sendWindow += n
			c.sendWindow += n
			broadcast(&c.credit)
			c.mu.Unlock()
			return written, err
		}
		written += int(n)
		p = p[n:]
	}
	return written, nil
}

// writeData writes one DATA frame of p, holding the right to write.
func (s *Stream) writeData(p []byte) error {
	c := s.c
	for {
		c.mu.Lock()
		err := s.writeErrLocked()
		dl := s.writeDeadln
		c.mu.Unlock()
		if err != nil {
			return err
		}
		woken, err := c.acquireWriter(dl, s.writeNotify)
		if err != nil {
			return err
		}
		if !woken {
			break
		}
	}
	// Queued control frames first: the HEADERS that opens this stream.
	if err := c.writeControlLocked(); err != nil {
		<-c.wsem
		c.fail(fmt.Errorf("tcpmux: write: %w", err))
		return c.err()
	}
	c.mu.Lock()
	err := s.writeErrLocked()
	c.mu.Unlock()
	if err != nil {
		_ = c.releaseWriter()
		return err
	}
	if err := c.fw.WriteData(s.id, false, p); err != nil {
		<-c.wsem
		c.fail(fmt.Errorf("tcpmux: write: %w", err))
		return c.err()
	}
	return c.releaseWriter()
}

func (s *Stream) writeErrLocked() error {
	if s.writeErr != nil {
		return s.writeErr
	}
	return s.c.closeErr
}

// Close ends the write direction with a FIN after the data written; the
// stream stays readable. It does not block.
func (s *Stream) Close() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.sendDone {
		return nil
	}
	if c.closeErr != nil {
		return c.closeErr
	}
	s.sendDone = true
	s.writeErr = fmt.Errorf("tcpmux: write on closed stream %d", s.id)
	c.queueLocked(ctrlFrame{typ: http2.FrameData, streamID: s.id})
	s.cancel(context.Canceled)
	signal(s.writeNotify)
	s.maybeEndLocked()
	return nil
}

// CancelWrite abandons the write direction: data not yet sent is dropped,
// the peer's Read fails with a *quic.StreamError carrying code (codes above
// 2^32-1 are sent as 2^32-1). Nothing happens after Close or a reset.
func (s *Stream) CancelWrite(code quic.StreamErrorCode) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.sendDone {
		return
	}
	s.sendDone = true
	s.writeErr = &quic.StreamError{StreamID: s.StreamID(), ErrorCode: code}
	c.queueLocked(ctrlFrame{typ: frameResetWrite, streamID: s.id, value: clampCode(code)})
	s.cancel(s.writeErr)
	signal(s.writeNotify)
	s.maybeEndLocked()
}

// CancelRead abandons the read direction: buffered and later data is
// dropped, and the peer's Write fails with a *quic.StreamError carrying
// code.
func (s *Stream) CancelRead(code quic.StreamErrorCode) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.readErr != nil {
		return
	}
	s.readErr = &quic.StreamError{StreamID: s.StreamID(), ErrorCode: code}
	c.consumedLocked(s.buffered)
	s.buf, s.buffered = nil, 0
	if !s.recvFin && !s.recvReset {
		c.queueLocked(ctrlFrame{typ: frameStopSending, streamID: s.id, value: clampCode(code)})
	}
	signal(s.readNotify)
}

// remoteResetLocked handles the peer abandoning its write direction.
func (s *Stream) remoteResetLocked(code quic.StreamErrorCode) {
	if s.recvFin || s.recvReset {
		return
	}
	s.recvReset = true
	if s.readErr == nil {
		s.readErr = &quic.StreamError{StreamID: s.StreamID(), ErrorCode: code, Remote: true}
	}
	s.c.consumedLocked(s.buffered)
	s.buf, s.buffered = nil, 0
	signal(s.readNotify)
	s.maybeEndLocked()
}

// remoteStopLocked handles the peer abandoning its read direction; answer:
// tell it our direction ended (STOP_SENDING; a RST_STREAM needs none).
func (s *Stream) remoteStopLocked(code quic.StreamErrorCode, answer bool) {
	if s.sendDone {
		return
	}
	s.sendDone = true
	s.writeErr = &quic.StreamError{StreamID: s.StreamID(), ErrorCode: code, Remote: true}
	if answer {
		s.c.queueLocked(ctrlFrame{typ: frameResetWrite, streamID: s.id, value: uint32(code)})
	}
	s.cancel(s.writeErr)
	signal(s.writeNotify)
	s.maybeEndLocked()
}

// maybeEndLocked forgets the stream once both directions have ended.
func (s *Stream) maybeEndLocked() {
	if s.sendDone && (s.recvFin || s.recvReset) {
		s.c.removeLocked(s)
		s.cancel(errStreamEnded)
	}
}

// SetReadDeadline sets the deadline of Read (zero: none).
func (s *Stream) SetReadDeadline(t time.Time) error {
	s.c.mu.Lock()
	s.readDeadline = t
	s.c.mu.Unlock()
	signal(s.readNotify)
	return nil
}

// SetWriteDeadline sets the deadline of Write (zero: none). A frame being
// written when it passes is still written (bounded by Config.IdleTimeout).
func (s *Stream) SetWriteDeadline(t time.Time) error {
	s.c.mu.Lock()
	s.writeDeadln = t
	s.c.mu.Unlock()
	signal(s.writeNotify)
	return nil
}

// SetDeadline sets both deadlines.
func (s *Stream) SetDeadline(t time.Time) error {
	_ = s.SetReadDeadline(t)
	return s.SetWriteDeadline(t)
}

// wait blocks until a or b fires, the deadline passes (zero: none) or the
// connection closes.
func (c *Conn) wait(deadline time.Time, a, b <-chan struct{}) error {
	var timer <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return os.ErrDeadlineExceeded
		}
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-a:
	case <-b:
	case <-timer:
		return os.ErrDeadlineExceeded
	case <-c.ctx.Done():
	}
	return nil
}

func clampCode(code quic.StreamErrorCode) uint32 {
	return uint32(min(uint64(code), 1<<32-1))
}
