package resume

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/quictun/quictun/pkg/proto"
)

// Serve runs the tunnel on att until the tunnel ends (nil, or the
// *splice.AbortedError or *GaveUpError OnEnd was given, after OnEnd), its
// connection is lost (ErrParked: it waits for the next Serve within the
// window), another Serve takes over (ErrTakenOver), or it had ended
// before (ErrEnded: att's stream is left to the caller, which refuses it).
// A Serve while another runs stops that one first (its
// stream is cancelled) and waits for it: the offsets reported are final.
func (p *Pipe) Serve(att *Attachment) error {
	a, err := p.claim(att)
	if err != nil {
		return err
	}
	lost := p.run(a)
	p.mu.Lock()
	p.cur = nil
	switch {
	case a.preempted && p.abortErr == nil:
		p.state = stateIdle // the claimant waiting for a.done takes it
		p.mu.Unlock()
		close(a.done)
		return ErrTakenOver
	case p.abortErr == nil && lost:
		// An attachment that never took (lost before its reply) leaves the
		// tunnel waiting within the window it was parked for, and it is not
		// counted parked again.
		p.parkLocked(!a.noReply)
		p.mu.Unlock()
		close(a.done)
		if a.noReply {
			return errParkedNoReply
		}
		p.cfg.Events.TunnelParked()
		return ErrParked
	}
	p.state = stateEnded
	p.mu.Unlock()
	close(a.done)
	p.end()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.abortErr != nil {
		if p.gaveUp != "" {
			return &GaveUpError{Reason: p.gaveUp, Abort: p.abortErr}
		}
		return p.abortErr
	}
	return nil
}

// parkLocked parks the tunnel until its window ends (p.mu held): a new
// window (fresh), or what is left of the one it was parked for.
func (p *Pipe) parkLocked(fresh bool) {
	p.state = stateParked
	if fresh {
		p.parkedUntil = time.Now().Add(p.cfg.Window)
	}
	p.timer = time.AfterFunc(max(time.Until(p.parkedUntil), 0), p.expire)
}

// claim makes att the current attachment, stopping the running one.
func (p *Pipe) claim(att *Attachment) (*attachment, error) {
	a := &attachment{Attachment: att, stop: make(chan struct{}), done: make(chan struct{})}
	p.mu.Lock()
	for p.state == stateRunning {
		old := p.cur
		old.preempted = true
		p.mu.Unlock()
		old.cancel(codeDetached)
		<-old.done
		p.mu.Lock()
	}
	if p.state == stateEnded || p.abortErr != nil {
		p.mu.Unlock()
		return nil, ErrEnded
	}
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	a.resumed = p.state == stateParked || att.Reply || att.PeerOffset > 0
	a.first = !p.attached
	p.attached = true
	p.state, p.cur = stateRunning, a
	p.mu.Unlock()
	return a, nil
}

// rewind makes the writer go on from the offset a's peer has. The first
// attachment of a new tunnel (not an imported one) carries Config.Written
// already (preload): the writer goes on after it, nothing confirmed yet.
func (p *Pipe) rewind(a *attachment) error {
	if a.first && a.PeerOffset == 0 {
		return nil
	}
	return p.out.Rewind(a.PeerOffset)
}

// run carries the tunnel on a's stream until both directions ended (false)
// or the stream is lost (true). An abort is recorded in p.abortErr.
func (p *Pipe) run(a *attachment) (lost bool) {
	var prefix []byte
	if a.Reply {
		prefix = AppendReply(nil, p.recv.Load())
	}
	if err := p.rewind(a); err != nil {
		p.abort(proto.CodeResumeRefused, err, GaveUpOffset)
		a.cancel(proto.CodeResumeRefused)
		return false
	}
	if a.resumed {
		_, _, end := p.out.Offsets()
		a.resent = int64(end - a.PeerOffset)
		if !a.AwaitReply {
			p.cfg.Events.TunnelResumed(a.resent, a.Early, false)
		}
	}
	// One goroutine writes the stream, then watches it for
	// interruptAppWrites: a re-attachment of 1,000 tunnels starts 1,000 of
	// them, not 2,000 (their creation and stacks were a fifth of the
	// CPU of a server serving a client's upgrade, perf).
	_ = p.conn.SetWriteDeadline(time.Time{}) // an earlier attachment's interruption
	wlost := make(chan bool, 1)
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		wlost <- p.write(a, prefix)
		p.interruptAppWrites(a, quit)
	}()
	rl := p.readStream(a)
	close(quit)
	if rl {
		a.cancel(codeDetached)
	}
	wl := <-wlost
	<-exited
	if rl || wl {
		return true
	}
	p.finalAck(a)
	return p.linger(a)
}

// interruptAppWrites makes a write to the application return once a's
// stream is stopped or its connection ends (a write deadline in the past):
// an application that is not reading (its socket buffers full, as an echo
// waiting to write its answer) must not keep the tunnel from parking.
// readStream counts what the application took, and the peer resends the
// rest. It runs once write returned (write itself returns when a is stopped
// or its connection ends), until quit is closed (readStream returned);
// the next attachment clears the deadline.
func (p *Pipe) interruptAppWrites(a *attachment, quit <-chan struct{}) {
	select {
	case <-quit:
		return
	default:
	}
	select {
	case <-a.stop:
	case <-a.Done:
	case <-quit:
		return
	}
	_ = p.conn.SetWriteDeadline(time.Unix(1, 0))
}

// interrupted reports whether err, of a write to the application, is
// interruptAppWrites' doing: a's stream stopped or its connection ended.
func interrupted(a *attachment, err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	select {
	case <-a.stop:
		return true
	case <-a.Done:
		return true
	default:
		return false
	}
}

// finalAck confirms, at once, everything received once both directions
// ended: the peer may be lingering for it, and this end may be gone
// before Table.Run's next round. Sent twice (a datagram may be lost).
func (p *Pipe) finalAck(a *attachment) {
	if a.SendAck == nil || p.cfg.ID == (ID{}) {
		return
	}
	b, _ := AppendAcks(nil, []Ack{{ID: p.cfg.ID, Offset: p.recv.Load()}})
	for range 2 {
		if a.SendAck(b) != nil {
			return
		}
	}
}

// linger keeps a tunnel whose both directions ended until the peer
// confirmed every byte sent (true: the connection was lost first, the
// tunnel parks): otherwise an end that forgot the tunnel at once would
// refuse the re-attachment of a peer that had not read its last bytes
// when the connection died (a response written just before a blackout).
// Without acks on the connection (SendAck nil) it does not wait.
func (p *Pipe) linger(a *attachment) (lost bool) {
	if a.SendAck == nil {
		return false
	}
	for {
		p.mu.Lock()
		aborted := p.abortErr != nil
		p.mu.Unlock()
		if aborted {
			return false
		}
		base, _, end, freed := p.out.confirmed()
		if base == end {
			return false
		}
		select {
		case <-freed: // confirming the last byte gives back the last chunk
		case <-a.stop:
			return true
		case <-a.Done:
			return true
		}
	}
}

// write sends prefix, then the Buffer from the peer's offset on, then FIN
// once the application ended. It returns true when the stream was lost.
func (p *Pipe) write(a *attachment, prefix []byte) (lost bool) {
	str := a.Stream
	if len(prefix) > 0 {
		if _, err := str.Write(prefix); err != nil {
			return p.streamFailed(a, err)
		}
	}
	for {
		b, eof, wait := p.out.Peek()
		switch {
		case len(b) > 0:
			n, err := str.Write(b)
			p.out.Advance(n)
			if err != nil {
				return p.streamFailed(a, err)
			}
			if a.AfterWrite != nil {
				a.AfterWrite()
			}
			continue
		case eof:
			_ = str.Close()
			return false
		}
		select {
		case <-wait:
		case <-a.stop:
			return true
		case <-a.Done:
			a.cancel(codeDetached)
			return true
		}
	}
}

// readStream copies the stream to the application until EOF (false) or
// the stream is lost (true), after the reply if a awaits it.
func (p *Pipe) readStream(a *attachment) (lost bool) {
	if a.AwaitReply {
		if ok, lost := p.awaitReply(a); !ok {
			return lost
		}
	}
	var cb copyBuf
	defer cb.release()
	for {
		n, rerr := a.Stream.Read(cb.buf())
		if n > 0 && a.AfterRead != nil {
			a.AfterRead()
		}
		if n > 0 {
			buf := cb.buf()
			w, werr := p.conn.Write(buf[:n])
			p.recv.Add(uint64(w))
			p.FromStream.Add(int64(w))
			p.poke()
			if werr != nil {
				if interrupted(a, werr) {
					// Lost while the application was not reading: what it
					// did not take is resent from recv on re-attaching.
					a.cancel(codeDetached)
					return true
				}
				p.abort(proto.CodeConnReset, werr, "")
				a.cancel(proto.CodeConnReset)
				return false
			}
			cb.adapt(n)
		}
		if rerr == nil {
			continue
		}
		if errors.Is(rerr, io.EOF) {
			p.mu.Lock()
			done := p.downDone
			p.downDone = true
			p.mu.Unlock()
			if !done {
				if err := p.conn.CloseWrite(); err != nil {
					p.abort(proto.CodeConnReset, err, "")
					a.cancel(proto.CodeConnReset)
				}
			}
			return false
		}
		return p.streamFailed(a, rerr)
	}
}

// awaitReply reads the peer's reply at the start of a's stream
// (Attachment.AwaitReply): ok, the tunnel goes on; otherwise it ended
// (refused, or another offset: the peer's stream is reset too) or, lost,
// the stream was lost first.
func (p *Pipe) awaitReply(a *attachment) (ok, lost bool) {
	if d, can := a.Stream.(interface{ SetReadDeadline(time.Time) error }); can && a.ReplyTimeout > 0 {
		_ = d.SetReadDeadline(time.Now().Add(a.ReplyTimeout))
		defer func() { _ = d.SetReadDeadline(time.Time{}) }()
	}
	off, err := ReadReply(a.Stream)
	var se *quic.StreamError
	switch {
	case err == nil && off == a.PeerOffset:
		if a.AfterRead != nil {
			a.AfterRead()
		}
		p.cfg.Events.TunnelResumed(a.resent, a.Early, true)
		return true, false
	case err == nil:
		err = fmt.Errorf("the peer holds %d of our bytes but had confirmed %d: what was sent since went after the wrong offset", off, a.PeerOffset)
		p.abort(proto.CodeConnReset, fmt.Errorf("%w (%s): %w", errGaveUp, GaveUpOffset, err), GaveUpOffset)
		a.cancel(proto.CodeConnReset)
		return false, false
	case errors.Is(err, ErrBadRequest), errors.As(err, &se) && se.Remote && se.ErrorCode == proto.CodeResumeRefused.StreamErrorCode():
		p.abort(proto.CodeConnReset, fmt.Errorf("%w (%s): %w", errGaveUp, GaveUpRefused, err), GaveUpRefused)
		a.cancel(proto.CodeConnReset)
		return false, false
	}
	a.noReply = true
	a.cancel(codeDetached)
	return false, true
}

// streamFailed handles a failed stream operation: a lost stream (true), or
// the peer's reset, which ends the tunnel with the peer's code.
func (p *Pipe) streamFailed(a *attachment, err error) bool {
	if isLost(err) {
		a.cancel(codeDetached)
		return true
	}
	code := proto.CodeConnReset
	if c, ok := proto.FromError(err); ok {
		code = c
	}
	p.abort(code, err, "")
	a.cancel(code)
	return false
}

// copyBuf is the stream reader's buffer: 2 KiB while reads are small, a
// pooled 32 KiB one while they fill it (as pkg/splice), so that an idle
// tunnel holds little. Both come from pools: the buffer escapes to the
// heap anyway (through the Read interface), so each new reader (1,000 in
// a re-attachment burst) allocated a 2 KiB one.
type copyBuf struct {
	small, large *[]byte
}

var (
	smallPool = sync.Pool{New: func() any { b := make([]byte, 2<<10); return &b }}
	largePool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
)

func (b *copyBuf) buf() []byte {
	if b.large != nil {
		return *b.large
	}
	if b.small == nil {
		b.small = smallPool.Get().(*[]byte)
	}
	return *b.small
}

func (b *copyBuf) adapt(n int) {
	switch {
	case b.large == nil && b.small != nil && n == len(*b.small):
		b.large = largePool.Get().(*[]byte)
	case b.large != nil && n < 2<<10:
		largePool.Put(b.large)
		b.large = nil
	}
}

func (b *copyBuf) release() {
	if b.large != nil {
		largePool.Put(b.large)
		b.large = nil
	}
	if b.small != nil {
		smallPool.Put(b.small)
		b.small = nil
	}
}
