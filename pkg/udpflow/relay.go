package udpflow

import (
	"errors"
	"io"
	"sync"
	"time"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/splice"
)

// Stream is the part of *quic.Stream a Relay uses (the same as a splice's).
type Stream = splice.Stream

// Relay carries one flow's packets both ways between the local side (the
// application's socket on the client, the destination's on the server) and
// the peer, until the flow ends: the peer closes the stream, the flow is idle
// for IdleTimeout, the local side fails, or Abort. Set the fields, then call
// Run once; Deliver datagrams with FromDatagram (Table.Add).
type Relay struct {
	Stream Stream
	// Sender sends to the peer; it counts into Up.
	Sender *Sender
	// Queue holds the local side's packets until the Sender takes them; nil:
	// a Queue of DefaultQueueBytes. Whoever reads the local side fills it:
	// the Relay itself when Recv is set, else the caller (the client's
	// socket reader, which serves many flows). Closing it ends the flow, as
	// a clean end when closed with io.EOF.
	Queue *Queue
	// Recv, if set, returns the next packet from the local side (it may use
	// buf, at least MaxPacket bytes); the Relay reads it on a goroutine of
	// its own into Queue, dropping (DropQueueFull) what does not fit, so a
	// peer that stops taking packets never stops the local socket from being
	// read: its kernel buffer would fill and hold the host's UDP memory. An
	// error ends the flow.
	Recv func(buf []byte) ([]byte, error)
	// Deliver hands a packet from the peer to the local side. It must not
	// block for long (it runs on the connection's datagram goroutine); an
	// error drops the packet (Drop is called with DropWriteError).
	Deliver func(p []byte) error
	// CloseLocal makes a blocked Recv return; called once as the flow ends.
	CloseLocal func()
	// AwaitReply: the stream starts with the server's one-byte reply (the
	// client's end). Until it arrives the Sender stays on the stream; a
	// refusal ends the flow with the server's code.
	AwaitReply bool
	// Replied, if set, is called with the reply's outcome (AwaitReply).
	Replied     func(err error)
	IdleTimeout time.Duration
	Idle        *Idle
	// Up and Down count packets to and from the peer (Up is the Sender's).
	Up, Down *Counters
	// Drop counts a dropped packet by reason; may be nil.
	Drop func(reason string)

	abortOnce sync.Once
	aborted   chan struct{}
	abortErr  *splice.AbortedError
	initOnce  sync.Once
}

func (r *Relay) init() {
	r.initOnce.Do(func() {
		r.aborted = make(chan struct{})
		if r.Drop == nil {
			r.Drop = func(string) {}
		}
		if r.Idle == nil {
			r.Idle = NewIdle(nil)
		}
		if r.Queue == nil {
			r.Queue = NewQueue(0, nil)
		}
	})
}

// Abort ends the flow with code, which the peer sees as the stream's error
// code. Safe for concurrent use; the first call counts.
func (r *Relay) Abort(code proto.Code) { r.abort(code, splice.ErrAborted) }

func (r *Relay) abort(code proto.Code, cause error) {
	r.init()
	r.abortOnce.Do(func() {
		r.abortErr = &splice.AbortedError{Code: code, Cause: cause}
		r.Stream.CancelRead(code.StreamErrorCode())
		r.Stream.CancelWrite(code.StreamErrorCode())
		close(r.aborted)
	})
}

// FromDatagram delivers a packet that came as a datagram. It may be called
// (from Table.Handle) before Run.
func (r *Relay) FromDatagram(p []byte) {
	r.init()
	r.deliver(PathDatagram, p)
}

func (r *Relay) deliver(path string, p []byte) {
	r.Idle.Touch()
	if err := r.Deliver(p); err != nil {
		r.Drop(DropWriteError)
		return
	}
	r.Down.count(path, len(p))
}

var framePool = sync.Pool{New: func() any { b := make([]byte, MaxPacket); return &b }}

// fromStream delivers the packets framed on the stream until it ends.
func (r *Relay) fromStream() error {
	if r.AwaitReply {
		err := proto.ReadReply(r.Stream)
		if r.Replied != nil {
			r.Replied(err)
		}
		if err != nil {
			return err
		}
		r.Sender.Establish()
	}
	bp := framePool.Get().(*[]byte)
	defer framePool.Put(bp)
	for {
		p, err := ReadFrame(r.Stream, *bp)
		if err != nil {
			return err
		}
		r.deliver(PathStream, p)
	}
}

// readLocal queues the local side's packets until Recv fails, then closes
// the Queue with Recv's error.
func (r *Relay) readLocal() {
	buf := make([]byte, MaxPacket)
	for {
		p, err := r.Recv(buf)
		if err != nil {
			r.Queue.Close(err)
			return
		}
		r.Idle.Touch()
		if !r.Queue.Push(p) {
			r.Drop(DropQueueFull)
		}
	}
}

// toPeer sends the local side's packets until the Queue is closed or the
// stream fails.
func (r *Relay) toPeer() error {
	for {
		p, err := r.Queue.Pop()
		if err != nil {
			return localError{err}
		}
		r.Idle.Touch()
		if err := r.Sender.Send(p); err != nil {
			return err
		}
	}
}

// localError marks an error of the local side (Recv, or the Queue's
// closing); io.EOF is a clean end.
type localError struct{ error }

func (e localError) Unwrap() error { return e.error }

// Run relays until the flow ends and returns nil for a clean end (the peer
// closed the flow, or it was idle), else an *splice.AbortedError with the
// code sent to or received from the peer. It waits for every goroutine it
// started.
func (r *Relay) Run() error {
	r.init()
	fromPeer := make(chan error, 1)
	toPeer := make(chan error, 1)
	done := make(chan struct{})
	idle := make(chan bool, 1)
	var wg sync.WaitGroup
	wg.Go(func() { fromPeer <- r.fromStream() })
	wg.Go(func() { toPeer <- r.toPeer() })
	if r.Recv != nil {
		wg.Go(r.readLocal)
	}
	wg.Go(func() { idle <- r.Idle.Wait(done, r.IdleTimeout) })

	var err error
	aborted := false
	select {
	case err = <-fromPeer:
	case err = <-toPeer:
	case <-idle:
	case <-r.aborted:
		aborted = true
	}
	close(done)
	switch {
	case aborted:
	case err == nil || errors.Is(err, io.EOF):
		// A clean end (the peer or the local side ended the flow, or it
		// was idle): FIN our side and stop reading.
		_ = r.Stream.Close()
		r.Stream.CancelRead(proto.CodeOK.StreamErrorCode())
	default:
		code, ok := proto.FromError(err)
		switch {
		case ok: // the peer's code
		case errors.As(err, new(localError)):
			code = proto.CodeInternal // the local socket failed
		default:
			code = proto.CodeConnReset // the stream or connection failed here
		}
		r.abort(code, err)
	}
	r.CloseLocal()
	r.Queue.Close(io.EOF)
	wg.Wait()
	select {
	case <-r.aborted:
		return r.abortErr
	default:
		return nil
	}
}
