package ingress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/splice"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/tunnel"
)

// Resume are the settings of resumable tunnels (--resume-window;
// pkg/resume).
type Resume = resume.Settings

// window is the resume window of a tunnel opened now, 0 without Resume.
func (h *Handler) window() time.Duration { return h.cfg.Resume.WindowNow() }

// ackSender returns c's datagram sender, nil without datagrams.
func ackSender(c Conn) func([]byte) error {
	q := c.QUIC()
	if q == nil || !q.ConnectionState().SupportsDatagrams.Remote {
		return nil
	}
	return q.SendDatagram
}

// resumeID picks the ID of a resumable tunnel, or nil: the window is on
// and the session is a QUIC connection with datagrams (the acks; before
// the handshake completes, as the resumed TLS session remembers the
// server's). A tunnel opened as 0-RTT data stays resumable if the server
// accepts it there; one that earlyPhase re-sends on another stream (0-RTT
// rejected, the connection lost before its handshake) goes as a plain
// tunnel (sendHeader), and the server does not park a tunnel whose
// connection never completed its handshake (pkg/egress).
func (l *local) resumeID() *resume.ID {
	if l.h.window() <= 0 || ackSender(l.sess.Conn) == nil {
		return nil
	}
	id, err := resume.NewID()
	if err != nil {
		return nil
	}
	return &id
}

// spliceResumable is splice for a resumable tunnel: when the connection
// under it is lost, the tunnel parks and re-attaches on the next one
// (reattach) until its window passes.
func (l *local) spliceResumable(ctx context.Context, toServer splice.Stream) {
	h, r, id := l.h, l.h.cfg.Resume, *l.rid
	l.server = l.sess.Server
	t := &tunnel.Tunnel{UUID: l.tunnelID, StreamID: int64(l.str.StreamID()), Endpoint: l.listenAddr, Source: l.remoteAddr(),
		Destination: l.token, Server: l.server, Transport: l.sess.Transport(), Direction: h.direction(), CreatedAt: l.start, Resumable: true}
	var endErr error
	p := resume.NewPipe(l.sc, resume.Config{ID: id, Window: h.window(), Cap: r.Cap, Budget: r.Budget, Events: r.Events,
		Written: l.early, OnEnd: func(err error) { endErr = err }, Meta: t})
	t.Upstream, t.Downstream = &p.ToStream, &p.FromStream
	remove, err := r.Table.Add(id, "", p)
	if err != nil {
		p.Abort(proto.CodeInternal)
		<-p.Ended()
		return
	}
	defer remove()
	unregister := h.cfg.Registry.Add(t, p)
	h.cfg.Events.TunnelOpened()
	l.slog.V(4).Info("Opened stream", "resumable", true)
	err = p.Serve(l.attachment(toServer, 0))
	if errors.Is(err, resume.ErrEnded) { // aborted before it ran (drain, DELETE /tunnels)
		toServer.CancelRead(proto.CodeConnReset.StreamErrorCode())
		toServer.CancelWrite(proto.CodeConnReset.StreamErrorCode())
	}
	l.carryParked(ctx, p, err)
	<-p.Ended()
	unregister()
	l.resumableEnded(t, endErr)
}

// carryParked re-attaches p, parked (err: Serve's ErrParked), on the next
// sessions until it ends: the server refused it, its window passed, or
// ctx ended. A tunnel handed over to the new process (an upgrade) ends
// while it waits here.
func (l *local) carryParked(ctx context.Context, p *resume.Pipe, err error) {
	noReply := 0
	for errors.Is(err, resume.ErrParked) {
		var first time.Duration
		if errors.Is(err, resume.ErrNoReply) {
			// A request sent without waiting (AwaitReply) got no reply: the
			// 0-RTT data it went in was rejected, the connection was lost
			// again or the server did not answer in time. It is tried again
			// as a failed request is, not at once.
			noReply++
			first = min(sessionGoneRetry<<min(noReply-1, 9), 2*time.Second)
		} else {
			noReply = 0
			l.slog.V(2).Info("Parked tunnel: its connection was lost; re-attaching on the next one", "window", l.h.window())
		}
		att, rerr := l.reattach(ctx, p, *l.rid, first)
		if rerr != nil {
			reason := resume.GaveUpShutdown
			if errors.Is(rerr, errResumeRefused) {
				reason = resume.GaveUpRefused
			}
			p.GiveUp(reason) // no effect once the window ended it, or it was handed over
			return
		}
		err = p.Serve(att)
		if errors.Is(err, resume.ErrEnded) {
			// It ended (its window, a kick) or was handed over while it
			// re-attached: the server's end, on this stream, is told it is
			// detached (it parks, as on a lost connection) rather than reset,
			// since a new process may re-attach it.
			att.Stream.CancelRead(proto.CodeResumeRefused.StreamErrorCode())
			att.Stream.CancelWrite(proto.CodeResumeRefused.StreamErrorCode())
		}
	}
}

// resumableEnded accounts for a resumable tunnel's end (err: as OnEnd).
// A tunnel handed over to the new process (an upgrade) did not end: the
// new process accounts for it.
func (l *local) resumableEnded(t *tunnel.Tunnel, err error) {
	if errors.Is(err, resume.ErrHandedOver) {
		l.slog.V(4).Info("Handed tunnel over to the new process")
		return
	}
	h := l.h
	result := proto.CodeOK.String()
	var ab *splice.AbortedError
	if errors.As(err, &ab) {
		result = ab.Code.String()
	}
	up, down := t.Upstream.Load(), t.Downstream.Load()
	h.cfg.Events.TunnelClosed(result, up, down)
	l.logRefusal(err)
	l.slog.V(4).Info("Closed stream", "bytesUpstream", up, "bytesDownstream", down, "duration", time.Since(l.start), "result", result, "err", err)
	h.audit(l.logger, t.Source, l.token, "tcp:"+l.listenAddr, result, up, down, l.start)
}

// ImportResumable continues a resumable tunnel the previous process handed
// over (an upgrade; resume.Import): parked, it re-attaches to the server on
// the next session, in a goroutine counted in handlers that ends with it;
// it is in the registry (t: how /tunnels shows it, from the handover) and
// counted as open, and its end is accounted as any resumable tunnel's. On
// error nothing is held and the application's connection is reset.
func (h *Handler) ImportResumable(ctx context.Context, st *resume.State, t *tunnel.Tunnel, handlers *sync.WaitGroup) error {
	r := h.cfg.Resume
	if r == nil {
		resetFile(st)
		return errors.New("resumable tunnels are off (no --resume-window)")
	}
	id := st.ID
	var endErr error
	p, err := resume.Import(st, resume.Config{Cap: r.Cap, Budget: r.Budget, Events: r.Events, Meta: t, OnEnd: func(err error) { endErr = err }})
	if err != nil {
		return err
	}
	t.Resumable, t.Direction, t.Transport = true, h.direction(), "quic"
	t.Upstream, t.Downstream = &p.ToStream, &p.FromStream
	remove, err := r.Table.Add(id, "", p)
	if err != nil {
		p.Abort(proto.CodeInternal)
		<-p.Ended()
		return err
	}
	logger := klog.FromContext(ctx)
	l := &local{h: h, listenAddr: t.Endpoint, token: t.Destination, start: t.CreatedAt, logger: logger, rid: &id, release: func() {}, server: t.Server,
		tunnelID: t.UUID, slog: klog.LoggerWithValues(logger, "tunnelID", t.UUID, "remoteAddress", t.Source)}
	unregister := h.cfg.Registry.Add(t, p)
	h.cfg.Events.TunnelOpened()
	handlers.Go(func() {
		defer func() { l.release() }() // the session the tunnel re-attached on
		defer remove()
		l.carryParked(ctx, p, resume.ErrParked)
		<-p.Ended()
		unregister()
		l.resumableEnded(t, endErr)
	})
	return nil
}

// resetFile resets the application socket of a tunnel that cannot be
// imported (st.Conn, closed here).
func resetFile(st *resume.State) {
	if nc, err := net.FileConn(st.Conn); err == nil {
		resetConn(nc)
	}
	_ = st.Conn.Close()
}

// attachment is the resume.Attachment of str on the current session.
func (l *local) attachment(str splice.Stream, peerOffset uint64) *resume.Attachment {
	sess := l.sess
	a := &resume.Attachment{Stream: str, Done: sess.Conn.Context().Done(), PeerOffset: peerOffset, Conn: sess.Conn, SendAck: ackSender(sess.Conn)}
	if sess.Prober != nil || sess.Waker != nil {
		// Bytes either way wake the liveness checks of an idle connection
		// (as splice does for a plain tunnel).
		a.AfterWrite = func() { sess.Prober.Kick(); sess.Waker.Wake() }
		a.AfterRead = func() { sess.Prober.Heard(); sess.Waker.Wake() }
	}
	return a
}

// maxAheadPerSession bounds the re-attachments on one connection that go
// on without waiting for the server's reply (tryResume); the rest wait for
// it. Each starts its attachment at once, during the new connection's
// handshake: with 1,000 of them (an upgrade of 1,000 tunnels, bench
// resume) the handshake took 66-134 ms against 71-88 and the longest
// stall was higher in 5 of 6 server upgrades, though that build was
// always measured first and one build differs from itself by as much
// (KNOWN_LIMITS §8). The bound keeps that burst small; an interactive
// session's few tunnels all go ahead.
const maxAheadPerSession = 64

// errResumeRefused: the server holds no such tunnel for us.
var errResumeRefused = errors.New("server refused to resume the tunnel")

// errNotResumable: the session cannot carry a resumed tunnel (TCP, no
// datagrams, or its handshake in progress); the next one is tried.
var errNotResumable = errors.New("session cannot carry a resumable tunnel")

// reattach asks the server, on the next session, to continue tunnel id,
// after first, until it does, refuses (errResumeRefused), the tunnel ends
// (its window passed) or ctx ends; it retries after 50 ms, doubling to
// 2 s, or after sessionGoneRetry when the session picked had just ended.
func (l *local) reattach(ctx context.Context, p *resume.Pipe, id resume.ID, first time.Duration) (*resume.Attachment, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watchDone := make(chan struct{})
	defer func() { <-watchDone }()
	defer cancel()
	go func() {
		defer close(watchDone)
		select {
		case <-p.Ended():
			cancel()
		case <-ctx.Done():
		}
	}()
	delay, quick, wait := 50*time.Millisecond, 0, first
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
			}
		}
		att, err := l.tryResume(ctx, p, id)
		if err == nil || errors.Is(err, errResumeRefused) {
			return att, err
		}
		wait = delay
		if (errors.Is(err, errSessionGone) || errors.Is(err, quic.Err0RTTRejected)) && quick < maxQuickRetries {
			quick++
			// The connection picked had just ended (the client has not
			// replaced it yet), or the server rejected the 0-RTT data our
			// request went in (the connection goes on without it): the
			// next one comes at once, so no backoff.
			wait = sessionGoneRetry
		} else {
			delay = min(2*delay, 2*time.Second)
		}
		l.slog.V(4).Info("Could not re-attach tunnel; trying again", "err", err, "after", wait)
	}
}

// sessionGoneRetry is how soon a re-attachment is tried again after the
// session picked turned out closed, at most maxQuickRetries times (then
// the backoff).
const (
	sessionGoneRetry = 5 * time.Millisecond
	maxQuickRetries  = 20
)

// errSessionGone: the session picked had ended already.
var errSessionGone = errors.New("session ended")

// sessionGone is err, marked errSessionGone when sess's connection has
// ended: a request sent early on a connection whose handshake then failed
// (the link still dark) is tried again at once on the next one, as when
// the wait for that handshake saw it end, not after the backoff.
func sessionGone(sess *Session, err error) error {
	if q := sess.Conn.QUIC(); q != nil && q.Context().Err() != nil && !errors.Is(err, errSessionGone) {
		return fmt.Errorf("%w: %w", errSessionGone, err)
	}
	return err
}

// resumableSession checks that sess can carry a resumed tunnel: a QUIC
// connection with datagrams (the acks). A session already closed is
// errSessionGone (the client has not replaced it yet). A new connection
// whose handshake is in progress carries the request at once (early) when
// it resumed a TLS session that remembers the server's datagram support
// (0-RTT, as right after a server's upgrade or a blackout: the tunnel
// re-attaches one round trip sooner; a rejection of 0-RTT fails the
// request, tried again on the connection without it); one without (a full
// handshake) is waited for, up to StreamOpenTimeout, rather than skipped
// for the backoff's 50 ms: the server's datagram support is known with the
// handshake.
func (l *local) resumableSession(ctx context.Context, sess *Session) (early bool, err error) {
	q := sess.Conn.QUIC()
	if q == nil {
		return false, errNotResumable
	}
	if q.Context().Err() != nil {
		return false, errSessionGone
	}
	if !transport.HandshakeComplete(q) && ackSender(sess.Conn) != nil {
		return true, nil
	}
	if !transport.HandshakeComplete(q) {
		t := time.NewTimer(l.h.cfg.StreamOpenTimeout)
		defer t.Stop()
		select {
		case <-q.HandshakeComplete():
		case <-q.Context().Done():
			return false, errSessionGone
		case <-ctx.Done():
			return false, ctx.Err()
		case <-t.C:
			return false, errNotResumable
		}
	}
	if ackSender(sess.Conn) == nil {
		return false, errNotResumable
	}
	return false, nil
}

// tryResume sends one resume request on the next session and reads the
// server's answer: the bytes it received of ours. When the server had
// confirmed every byte sent before the loss (Pipe.Confirmed), the client
// knows the answer: the tunnel goes on at once and its Pipe reads the
// reply (Attachment.AwaitReply), so that what the application writes
// before the reply comes is not held back a round trip. At most
// maxAheadPerSession re-attachments on a connection do so.
func (l *local) tryResume(ctx context.Context, p *resume.Pipe, id resume.ID) (*resume.Attachment, error) {
	sess, release, err := l.session(ctx)
	if err != nil {
		release()
		return nil, err
	}
	early, err := l.resumableSession(ctx, sess)
	if err != nil {
		release()
		return nil, err
	}
	str, err := l.h.openStream(ctx, sess)
	if err != nil {
		release()
		return nil, sessionGone(sess, err)
	}
	req := resume.Request{ID: id, Offset: p.Received()}
	off, ahead := p.Confirmed()
	ahead = ahead && sess.aheads.Add(1) <= maxAheadPerSession
	if ahead {
		err = l.h.sendResume(str, req) // off is the reply's, read by the Pipe
	} else {
		off, err = l.h.requestResume(str, req)
	}
	if err != nil {
		str.CancelRead(proto.CodeResumeRefused.StreamErrorCode())
		str.CancelWrite(proto.CodeResumeRefused.StreamErrorCode())
		release()
		if c, ok := proto.FromError(err); ok && c == proto.CodeResumeRefused {
			return nil, fmt.Errorf("%w: %w", errResumeRefused, err)
		}
		return nil, sessionGone(sess, err)
	}
	l.release()
	l.release, l.sess = release, sess
	l.slog.V(2).Info("Resumed tunnel", "bytesReceivedByServer", off, "early", early, "withoutWaitingForReply", ahead)
	a := l.attachment(str, off)
	a.Early = early
	if ahead {
		a.AwaitReply, a.ReplyTimeout = true, l.h.cfg.StreamOpenTimeout
	}
	return a, nil
}

// session waits for a session to re-attach on: one to the server the
// tunnel was opened on when the client knows its servers apart
// (ServerSessions), else the next one.
func (l *local) session(ctx context.Context) (*Session, func(), error) {
	if ss, ok := l.h.links.Sessions.(ServerSessions); ok && l.server != "" {
		return ss.WaitServer(ctx, l.server)
	}
	return l.h.links.Sessions.Wait(ctx)
}

// sendResume writes the resume request's header on str.
func (h *Handler) sendResume(str Stream, req resume.Request) error {
	hdr, err := proto.NewHeader(req.Token(), time.Now())
	if err != nil {
		return err
	}
	hdr.Kind = proto.KindResume
	b, err := hdr.AppendSigned(nil, h.links.Signer())
	if err != nil {
		return err
	}
	_, err = str.Write(b)
	return err
}

// requestResume writes the resume request's header on str and reads the
// reply, within StreamOpenTimeout.
func (h *Handler) requestResume(str Stream, req resume.Request) (uint64, error) {
	if err := h.sendResume(str, req); err != nil {
		return 0, err
	}
	_ = str.SetReadDeadline(time.Now().Add(h.cfg.StreamOpenTimeout))
	off, err := resume.ReadReply(str)
	_ = str.SetReadDeadline(time.Time{})
	return off, err
}
