package splice

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"

	"github.com/quictun/quictun/pkg/proto"
)

// BufferSize is the size of each pooled copy buffer, used while data flows
// in bulk; SmallBufferSize is what an idle or interactive direction holds.
const (
	BufferSize      = 32 << 10
	SmallBufferSize = 2 << 10
)

// The buffers of both sizes are pooled: a tunnel takes its small buffers
// when it starts and gives them back when it ends, so that short-lived
// tunnels (one per connection of a client that does not reuse them) do not
// allocate 4 KiB each on both ends.
var (
	bufPool   = sync.Pool{New: func() any { b := make([]byte, BufferSize); return &b }}
	smallPool = sync.Pool{New: func() any { b := make([]byte, SmallBufferSize); return &b }}
)

// copyBuf holds a small buffer while reads are small, and a pooled large one
// while they fill the buffer: an idle tunnel then costs 2 KiB per direction
// instead of 32 KiB, which matters with tens of thousands of tunnels.
type copyBuf struct {
	small *[]byte
	large *[]byte
}

// take gets the small buffer; release gives back what b holds.
func (b *copyBuf) take() { b.small = smallPool.Get().(*[]byte) }

// buf is the buffer for the next read.
func (b *copyBuf) buf() []byte {
	if b.large != nil {
		return *b.large
	}
	return *b.small
}

// adapt picks the buffer size after a read of n bytes.
func (b *copyBuf) adapt(n int) {
	switch {
	case b.large == nil && n == SmallBufferSize:
		b.large = bufPool.Get().(*[]byte)
	case b.large != nil && n < SmallBufferSize:
		bufPool.Put(b.large)
		b.large = nil
	}
}

func (b *copyBuf) release() {
	if b.large != nil {
		bufPool.Put(b.large)
		b.large = nil
	}
	if b.small != nil {
		smallPool.Put(b.small)
		b.small = nil
	}
}

// Stream is the part of *quic.Stream a Pipe uses.
type Stream interface {
	io.Reader
	io.Writer
	// Close sends FIN. It is only called by the goroutine that writes.
	Close() error
	CancelRead(quic.StreamErrorCode)
	CancelWrite(quic.StreamErrorCode)
}

// Conn is a connection that supports half-close: *net.TCPConn and *net.UnixConn.
type Conn interface {
	net.Conn
	CloseWrite() error
}

// Pipe joins one connection and one stream. Create it with New, then call Run once.
type Pipe struct {
	conn Conn
	str  Stream

	// ToStream counts bytes copied from the connection into the stream.
	ToStream atomic.Int64
	// FromStream counts bytes copied from the stream into the connection.
	FromStream atomic.Int64

	// AfterWrite, if set before Run, is called after every write to the stream
	// (quictun uses it to send a tail-loss probe after a burst). It must not block.
	AfterWrite func()
	// AfterRead, if set before Run, is called after every read from the
	// stream that returned data. It must not block.
	AfterRead func()

	abortOnce sync.Once
	abortErr  error
}

// New returns a Pipe for conn and str. The Pipe owns both from Run on.
func New(conn Conn, str Stream) *Pipe { return &Pipe{conn: conn, str: str} }

// AbortedError is the result of a Pipe that was aborted.
type AbortedError struct {
	// Code is sent to the peer as the stream error code.
	Code proto.Code
	// Cause is what triggered the abort.
	Cause error
}

func (e *AbortedError) Error() string {
	return fmt.Sprintf("tunnel aborted (%s): %v", e.Code, e.Cause)
}

func (e *AbortedError) Unwrap() error { return e.Cause }

// ErrAborted is the cause of an abort requested through Abort.
var ErrAborted = errors.New("aborted locally")

// Abort resets both sides with code and makes Run return. Safe for concurrent
// use; only the first call has an effect.
func (p *Pipe) Abort(code proto.Code) { p.abort(code, ErrAborted) }

func (p *Pipe) abort(code proto.Code, cause error) {
	p.abortOnce.Do(func() {
		p.abortErr = &AbortedError{Code: code, Cause: cause}
		p.str.CancelRead(code.StreamErrorCode())
		p.str.CancelWrite(code.StreamErrorCode())
		if tc, ok := p.conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // Close sends RST
		}
		_ = p.conn.Close()
	})
}

// Run copies both ways until both directions have ended or the pipe is aborted,
// then closes the connection. It returns nil when both directions ended with a
// clean EOF, otherwise an *AbortedError.
func (p *Pipe) Run() error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.toStream()
	}()
	p.fromStream()
	<-done
	p.abortOnce.Do(func() { _ = p.conn.Close() })
	return p.abortErr
}

// toStream copies connection -> stream. It is the only caller of Write and Close on the stream.
func (p *Pipe) toStream() {
	var cb copyBuf
	cb.take()
	defer cb.release()
	read := p.conn.Read
	if r := newRawIO(p.conn); r != nil {
		read = r.read
	}
	for {
		buf := cb.buf()
		n, rerr := read(buf)
		if n > 0 {
			if _, werr := p.str.Write(buf[:n]); werr != nil {
				p.abort(codeFor(werr), werr)
				return
			}
			p.ToStream.Add(int64(n))
			if p.AfterWrite != nil {
				p.AfterWrite()
			}
			cb.adapt(n)
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				// Close fails only when the stream was already cancelled: the
				// peer sent STOP_SENDING (it resets its side too, which
				// fromStream reports with the peer's code) or we aborted.
				_ = p.str.Close()
				return
			}
			p.abort(proto.CodeConnReset, rerr)
			return
		}
	}
}

// fromStream copies stream -> connection.
func (p *Pipe) fromStream() {
	var cb copyBuf
	cb.take()
	defer cb.release()
	write := p.conn.Write
	if r := newRawIO(p.conn); r != nil {
		write = r.write
	}
	for {
		buf := cb.buf()
		n, rerr := p.str.Read(buf)
		if n > 0 && p.AfterRead != nil {
			p.AfterRead()
		}
		if n > 0 {
			if _, werr := write(buf[:n]); werr != nil {
				p.abort(proto.CodeConnReset, werr)
				return
			}
			p.FromStream.Add(int64(n))
			cb.adapt(n)
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				if err := p.conn.CloseWrite(); err != nil {
					p.abort(proto.CodeConnReset, err)
				}
				return
			}
			p.abort(codeFor(rerr), rerr)
			return
		}
	}
}

// codeFor picks the code to send when a stream operation failed: the peer's own
// code is passed on, anything else counts as a reset.
func codeFor(err error) proto.Code {
	if c, ok := proto.FromError(err); ok {
		return c
	}
	return proto.CodeConnReset
}
