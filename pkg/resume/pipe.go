package resume

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/splice"
)

// Results of Serve besides the tunnel's end.
var (
	// ErrParked: the connection under the stream was lost; the tunnel
	// waits for its window for another Serve (the client re-attaches).
	ErrParked = errors.New("tunnel parked: its connection was lost")
	// ErrTakenOver: another Serve (a re-attachment that arrived before this
	// stream's connection was known to be dead) continues the tunnel.
	ErrTakenOver = errors.New("tunnel continued on another stream")
	// ErrEnded: the tunnel ended before this Serve (its window passed, or
	// it was aborted); nothing was held for the stream.
	ErrEnded = errors.New("tunnel ended")
	// ErrNoReply comes with ErrParked when the stream was lost before the
	// reply to a request sent without waiting for it (AwaitReply): the
	// caller retries as after a request that failed, not at once.
	ErrNoReply = errors.New("no reply to the resume request")
)

// errParkedNoReply is Serve's ErrParked of an attachment lost before its
// reply (ErrNoReply).
var errParkedNoReply = fmt.Errorf("%w (%w)", ErrParked, ErrNoReply)

// Reasons a parked tunnel gave up (GaveUpError, the label of
// quictun_*_tunnels_resume_gaveup_total).
const (
	// GaveUpWindow: no re-attachment within the window.
	GaveUpWindow = "window"
	// GaveUpRefused: the server refused the re-attachment (it did not hold
	// the tunnel: unknown, expired, or another identity's).
	GaveUpRefused = "refused"
	// GaveUpOffset: an end reported an offset the other cannot resend from.
	GaveUpOffset = "offset"
	// GaveUpShutdown: the daemon stopped while the tunnel was parked.
	GaveUpShutdown = "shutdown"
	// GaveUpKicked: the operator kicked the tunnel's identity (the
	// server's DELETE /identities): its tunnels end, parked ones too, so
	// that none resumes after the suspension.
	GaveUpKicked = "kicked"
	// GaveUpHandshake: the server's tunnel was opened as 0-RTT data on a
	// connection lost before its handshake completed; the client opens
	// such a tunnel anew on its next connection, so none re-attaches.
	GaveUpHandshake = "handshake"
)

// GaveUpReasons lists the reasons, for pre-created metric series.
func GaveUpReasons() []string {
	return []string{GaveUpWindow, GaveUpRefused, GaveUpOffset, GaveUpShutdown, GaveUpKicked, GaveUpHandshake}
}

// GaveUpError ends a tunnel that could not be resumed; it unwraps to the
// *splice.AbortedError its sockets were reset with.
type GaveUpError struct {
	Reason string
	Abort  *splice.AbortedError
}

func (e *GaveUpError) Error() string { return "gave up resuming the tunnel (" + e.Reason + ")" }

func (e *GaveUpError) Unwrap() error { return e.Abort }

// Events are told what happens to resumable tunnels (the daemon's metrics).
type Events interface {
	// TunnelParked reports a tunnel whose connection was lost.
	TunnelParked()
	// TunnelResumed reports a tunnel continued on a new stream, and the
	// bytes it resent there; early: its resume request went as 0-RTT data
	// (Attachment.Early); noWait: the client sent on without waiting for
	// the reply (Attachment.AwaitReply).
	TunnelResumed(resent int64, early, noWait bool)
	// TunnelGaveUp reports a parked tunnel that ended (GaveUpReasons).
	TunnelGaveUp(reason string)
	// ResumeRefused reports a refused resume request (RefusedReasons; the
	// server).
	ResumeRefused(reason string)
}

// NopEvents counts nothing.
type NopEvents struct{}

// TunnelParked implements Events.
func (NopEvents) TunnelParked() {}

// TunnelResumed implements Events.
func (NopEvents) TunnelResumed(int64, bool, bool) {}

// TunnelGaveUp implements Events.
func (NopEvents) TunnelGaveUp(string) {}

// ResumeRefused implements Events.
func (NopEvents) ResumeRefused(string) {}

// Attachment is a stream a tunnel runs on.
type Attachment struct {
	Stream splice.Stream
	// Done is closed when the connection under Stream ends (nil: never).
	Done <-chan struct{}
	// PeerOffset is how many of our bytes the peer received.
	PeerOffset uint64
	// Reply: write the reply of an accepted resume request (AppendReply
	// with the bytes received) before anything else (the server).
	Reply bool
	// Conn names the connection, so that acks count only from it.
	Conn any
	// SendAck sends an ack datagram on the connection (nil: it carries
	// none, and the peer's buffer is bounded by its cap alone).
	SendAck func([]byte) error
	// AfterWrite and AfterRead, if set, are called after each write to
	// the stream and each read from it that returned data (the
	// connection's tail-loss prober and liveness, as splice.Pipe's). They
	// must not block.
	AfterWrite, AfterRead func()
	// Early: the resume request that made this attachment went as 0-RTT
	// data, before the new connection's handshake completed (counted by
	// Events.TunnelResumed).
	Early bool
	// AwaitReply (the client): Stream starts with the peer's reply to our
	// resume request, which was sent without waiting for it because the
	// peer had confirmed every byte sent (Pipe.Confirmed; PeerOffset is
	// that offset). The writer goes on from PeerOffset at once, a round
	// trip sooner; the reader reads the reply first. A refusal ends the
	// tunnel (GaveUpRefused), another offset than PeerOffset too
	// (GaveUpOffset: the bytes sent went after the wrong one); a stream
	// lost before the reply parks it again (Serve: ErrParked, ErrNoReply).
	AwaitReply bool
	// ReplyTimeout bounds the wait for that reply (0: none); past it the
	// stream counts as lost.
	ReplyTimeout time.Duration
}

// DefaultCap is the default bound of the bytes one direction of a tunnel
// holds for resending: about the bandwidth-delay product of 100 Mbit/s
// over 300 ms. A tunnel that reaches it stops reading its application
// until the peer confirms bytes (backpressure, never a drop).
const DefaultCap = 4 << 20

// Config are a Pipe's settings.
type Config struct {
	// ID is the tunnel's resume ID, for its final ack (the zero ID: none
	// is sent).
	ID ID
	// Window is how long a tunnel stays parked.
	Window time.Duration
	// Cap bounds the bytes of one direction held for resending; Budget the
	// total of the daemon (nil: none).
	Cap    int
	Budget *Budget
	Events Events
	// OnEnd is called once, when the tunnel ended for good: nil (both
	// directions ended), a *splice.AbortedError or a *GaveUpError.
	OnEnd func(err error)
	// Written are application bytes already written on the first stream
	// (with the header): they are kept for resending like the rest, and
	// the first attachment goes on after them.
	Written []byte
	// Meta is the owner's description of the tunnel, handed over with it
	// (State.Meta); the Pipe does not use it.
	Meta any
}

// Pipe is a resumable tunnel: an application connection and the stream it
// runs on, replaceable. Create it with NewPipe, then call Serve with each
// stream. Besides Serve's goroutines it runs one that reads the
// application into the Buffer, also while parked (until the cap: then the
// application is no longer read, nothing is dropped).
type Pipe struct {
	conn splice.Conn
	cfg  Config
	out  *Buffer
	recv atomic.Uint64
	// table is the Table the Pipe was added to (nil: none), whose Run it
	// pokes when it receives bytes.
	table atomic.Pointer[Table]

	// ToStream counts bytes read from the application; FromStream bytes
	// written to it.
	ToStream, FromStream atomic.Int64

	readerDone chan struct{}
	ended      chan struct{} // stops the reader
	finished   chan struct{} // closed after OnEnd
	// frozen stops the reader for an Export: it keeps what it read.
	frozen     chan struct{}
	freezeOnce sync.Once

	mu    sync.Mutex
	state int
	cur   *attachment
	timer *time.Timer
	// parkedUntil is when the current wait's window ends: an attachment
	// lost before its reply (AwaitReply) parks the tunnel again until
	// then, not for a new window.
	parkedUntil time.Time
	downDone    bool // the peer's FIN reached the application
	abortErr    *splice.AbortedError
	gaveUp      string
	endCalled   bool
	// handedOver: Export gave the tunnel to another process; OnEnd gets
	// ErrHandedOver.
	handedOver bool
	// attached: a Serve has claimed the tunnel (the first attachment's
	// stream carries Config.Written already).
	attached bool
}

const (
	stateIdle = iota
	stateRunning
	stateParked
	stateEnded
)

type attachment struct {
	*Attachment
	stop      chan struct{}
	stopOnce  sync.Once
	done      chan struct{}
	preempted bool
	resumed   bool
	// first: the tunnel's first attachment (claim).
	first bool
	// resent: the bytes to resend when the attachment began (counted
	// once the reply came, with AwaitReply); noReply: the stream was lost
	// before it.
	resent  int64
	noReply bool
}

func (a *attachment) cancel(code proto.Code) {
	a.stopOnce.Do(func() {
		close(a.stop)
		a.Stream.CancelRead(code.StreamErrorCode())
		a.Stream.CancelWrite(code.StreamErrorCode())
	})
}

// NewPipe returns a Pipe for conn and starts reading it. The Pipe owns
// conn.
func NewPipe(conn splice.Conn, cfg Config) *Pipe {
	p := newPipe(conn, cfg)
	p.out.preload(cfg.Written)
	go p.read()
	return p
}

func newPipe(conn splice.Conn, cfg Config) *Pipe {
	if cfg.Events == nil {
		cfg.Events = NopEvents{}
	}
	if cfg.Cap <= 0 {
		cfg.Cap = DefaultCap
	}
	return &Pipe{conn: conn, cfg: cfg, out: NewBuffer(cfg.Cap, cfg.Budget),
		readerDone: make(chan struct{}), ended: make(chan struct{}), finished: make(chan struct{}), frozen: make(chan struct{})}
}

// Ended is closed once the tunnel ended for good, after OnEnd returned.
func (p *Pipe) Ended() <-chan struct{} { return p.finished }

// poke wakes the ack sender of p's Table if it sleeps.
func (p *Pipe) poke() {
	if t := p.table.Load(); t != nil {
		t.poke()
	}
}

// Confirmed returns, for a parked tunnel, how many of our bytes the peer
// confirmed, and whether that is every byte sent before the connection
// was lost: then the peer holds exactly that many, and the client may
// re-attach without waiting for the reply (Attachment.AwaitReply). all is
// false when bytes may have been in flight (the reply tells), for a
// tunnel imported from a process that did not know (State.Confirmed), and
// for a tunnel that is not parked.
func (p *Pipe) Confirmed() (off uint64, all bool) {
	p.mu.Lock()
	parked := p.state == stateParked && p.abortErr == nil
	p.mu.Unlock()
	if !parked {
		return 0, false
	}
	return p.out.Confirmed()
}

// Received is how many bytes of the peer's reached the application.
func (p *Pipe) Received() uint64 { return p.recv.Load() }

// Held is the bytes the Pipe's Buffer holds.
func (p *Pipe) Held() int { return p.out.Held() }

// Ack records the peer's confirmation of our bytes before off, sent on the
// connection named conn: an ack from another connection than the current
// stream's is ignored.
func (p *Pipe) Ack(off uint64, conn any) error {
	p.mu.Lock()
	cur := p.cur
	p.mu.Unlock()
	if cur == nil || cur.Conn != conn {
		return nil
	}
	return p.out.Ack(off)
}

// ackState is what Table.Run acks: the bytes received and the current
// stream's connection (send nil: none, or parked).
func (p *Pipe) ackState() (recv uint64, conn any, send func([]byte) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return 0, nil, nil
	}
	return p.recv.Load(), p.cur.Conn, p.cur.SendAck
}

// read copies the application into the Buffer until EOF or an error,
// waiting while the Buffer is full (the application is not read then).
func (p *Pipe) read() {
	defer close(p.readerDone)
	var cb copyBuf
	defer cb.release()
	for {
		n, rerr := p.conn.Read(cb.buf())
		if n > 0 {
			ok := p.append(cb.buf()[:n])
			if ok || p.isFrozen() {
				p.ToStream.Add(int64(n))
			}
			if !ok {
				return
			}
			cb.adapt(n)
		}
		if rerr != nil {
			if p.isFrozen() {
				return // Export: the read was interrupted, the socket is handed over
			}
			if errors.Is(rerr, io.EOF) {
				p.out.Finish()
			} else {
				p.Abort(proto.CodeConnReset)
			}
			return
		}
	}
}

// append puts b into the Buffer, waiting for room; false once the tunnel
// ended or froze (Export: the bytes that did not fit are kept past the
// cap, at most one read's, since they were taken from the socket).
func (p *Pipe) append(b []byte) bool {
	for len(b) > 0 {
		n, wait, err := p.out.Append(b)
		if err != nil {
			return false
		}
		b = b[n:]
		if wait == nil {
			continue
		}
		select {
		case <-wait:
		case <-p.frozen:
			p.out.appendAll(b)
			return false
		case <-p.ended:
			return false
		}
	}
	return !p.isFrozen()
}

func (p *Pipe) isFrozen() bool {
	select {
	case <-p.frozen:
		return true
	default:
		return false
	}
}

// Abort resets the stream and the application with code and ends the
// tunnel (a parked one at once).
func (p *Pipe) Abort(code proto.Code) { p.abort(code, splice.ErrAborted, "") }

// GiveUp ends a parked tunnel for reason (GaveUpReasons): the client,
// when the server refused its re-attachment. No effect otherwise.
func (p *Pipe) GiveUp(reason string) {
	p.mu.Lock()
	parked := p.state == stateParked
	p.mu.Unlock()
	if parked {
		p.abort(proto.CodeConnReset, fmt.Errorf("%w (%s)", errGaveUp, reason), reason)
	}
}

var errGaveUp = errors.New("gave up resuming the tunnel")

// End ends the tunnel, running or parked, for reason (GaveUpReasons):
// the stream and the application are reset with code. No effect on a
// tunnel that ended.
func (p *Pipe) End(code proto.Code, reason string) {
	p.abort(code, fmt.Errorf("%w (%s)", errGaveUp, reason), reason)
}

func (p *Pipe) abort(code proto.Code, cause error, gaveUp string) {
	p.mu.Lock()
	if p.abortErr != nil || p.state == stateEnded {
		p.mu.Unlock()
		return
	}
	p.abortErr = &splice.AbortedError{Code: code, Cause: cause}
	p.gaveUp = gaveUp
	cur, idle := p.cur, p.state != stateRunning
	if idle {
		p.state = stateEnded
		if p.timer != nil {
			p.timer.Stop()
		}
	}
	p.mu.Unlock()
	resetConn(p.conn)
	if cur != nil && !idle {
		cur.cancel(code)
	}
	if idle {
		p.end()
	}
}

// end finishes the tunnel once: the application closed, the reader
// stopped, the Buffer given back, OnEnd called. The state is stateEnded.
func (p *Pipe) end() {
	p.mu.Lock()
	if p.endCalled {
		p.mu.Unlock()
		return
	}
	p.endCalled = true
	var err error
	switch {
	case p.handedOver:
		err = ErrHandedOver
	case p.abortErr != nil:
		err = p.abortErr
		if p.gaveUp != "" {
			err = &GaveUpError{Reason: p.gaveUp, Abort: p.abortErr}
		}
	}
	p.mu.Unlock()
	close(p.ended)
	_ = p.conn.Close()
	<-p.readerDone
	p.out.Close()
	if g := (*GaveUpError)(nil); errors.As(err, &g) {
		p.cfg.Events.TunnelGaveUp(g.Reason)
	}
	if p.cfg.OnEnd != nil {
		p.cfg.OnEnd(err)
	}
	close(p.finished)
}

// expire ends a tunnel parked for its whole window.
func (p *Pipe) expire() {
	p.abort(proto.CodeTimeout, fmt.Errorf("%w: not re-attached within %s", errGaveUp, p.cfg.Window), GaveUpWindow)
}

// codeDetached resets a stream that no longer carries its tunnel: its
// connection was lost, or the tunnel continues on another stream. The
// peer, if the stream still reaches it, parks the tunnel (isLost) instead
// of ending it.
const codeDetached = proto.CodeResumeRefused

// isLost tells a lost connection (a stream we cancelled, or the peer
// detached) from the peer's reset of the stream, which ends the tunnel.
func isLost(err error) bool {
	var se *quic.StreamError
	if errors.As(err, &se) {
		return !se.Remote || se.ErrorCode == codeDetached.StreamErrorCode()
	}
	return true
}
