package ingress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/splice"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/tunnel"
)

// serve is Serve; with proxy set, the destination comes from the
// application's request and the application is answered with the server's
// reply before any byte flows: once the request is read, serve calls
// release (its handshake slot) and takes one of MaxConnections. Each step
// is a method of local; the first that fails returns a *localFailure, and
// fail ends the local connection.
func (h *Handler) serve(ctx context.Context, listenAddr string, nc net.Conn, tokens TokenSource, proxy Proxy, release func()) {
	l := &local{h: h, listenAddr: listenAddr, nc: nc, proxy: proxy, start: time.Now(), logger: klog.FromContext(ctx)}
	defer l.releaseSlot()
	defer func() {
		if l.release != nil {
			l.release() // the stream's count on its session
		}
	}()
	if f := l.serve(ctx, tokens, release); f != nil {
		l.fail(f)
	}
}

// serve runs the steps of a local connection in order.
func (l *local) serve(ctx context.Context, tokens TokenSource, release func()) *localFailure {
	sc, ok := l.nc.(splice.Conn)
	if !ok {
		return &localFailure{result: proto.CodeInternal.String(), msg: "Local connection does not support half-close"}
	}
	l.sc = sc
	if l.proxy != nil {
		associate, f := l.proxyRequest(release)
		if f != nil {
			return f
		}
		if associate != nil {
			l.h.serveAssociate(ctx, l.nc, associate.Client)
			return nil
		}
	} else if f := l.destination(ctx, tokens); f != nil {
		return f
	}
	if f := l.open(ctx); f != nil {
		return f
	}
	if f := l.sendHeader(ctx); f != nil {
		return f
	}
	toServer, f := l.awaitReply()
	if f != nil {
		return f
	}
	if f := l.answerProxy(); f != nil {
		return f
	}
	if l.rid != nil {
		l.spliceResumable(ctx, toServer)
		return nil
	}
	l.splice(toServer)
	return nil
}

// local is one local connection being carried, and what its steps have
// learned so far.
type local struct {
	h          *Handler
	listenAddr string
	nc         net.Conn
	sc         splice.Conn
	proxy      Proxy
	start      time.Time
	logger     klog.Logger
	// replied: (proxy) the application has its answer.
	replied bool
	// slot: (proxy) one of MaxConnections is held, given back by
	// releaseSlot.
	slot bool

	token string
	early []byte // bytes the application sent after its proxy request
	sess  *Session
	// release ends the stream's count on sess (Sessions.Wait).
	release func()
	// optimistic: a proxied connection to a destination the server
	// accepted on this connection recently is answered at once
	// (verdicts.go).
	optimistic bool
	str        Stream
	tunnelID   string
	// remote is the application's address (remoteAddr), formatted once.
	remote string
	slog   klog.Logger // logger with the stream's ID
	// rid: the tunnel is resumable, with this ID (resume.go).
	rid *resume.ID
	// server is the server a resumable tunnel was opened on, where it
	// re-attaches (Session.Server; "": any).
	server string
}

// remoteAddr is the application's address as a string, formatted once
// for the logs, /tunnels and the audit line.
func (l *local) remoteAddr() string {
	if l.remote == "" {
		l.remote = l.nc.RemoteAddr().String()
	}
	return l.remote
}

// localFailure is why a step ended a local connection: the result it is
// counted under, the line logged at -v 2 and its error.
type localFailure struct {
	result, msg string
	err         error
}

// fail counts f and ends the local connection: a reset, or for a proxied
// connection its proxy's refusal (then a FIN, as a reset could discard the
// answer) unless it was answered already.
func (l *local) fail(f *localFailure) {
	l.h.cfg.Events.StreamFailed(f.result)
	switch {
	case l.proxy == nil:
		resetConn(l.nc)
	case !l.replied:
		l.replied = true
		_ = l.nc.SetWriteDeadline(time.Now().Add(time.Second))
		if l.proxy.Reply(l.nc, f.err) == nil {
			_ = l.nc.Close() // FIN after the answer (a reset could discard it)
		} else {
			resetConn(l.nc)
		}
	default:
		_ = l.nc.Close() // answered already (a bad request)
	}
	l.logger.V(2).Info(f.msg, "remoteAddress", l.remoteAddr(), "err", f.err)
}

// releaseSlot gives back the MaxConnections slot proxyRequest took.
func (l *local) releaseSlot() {
	if l.slot {
		<-l.h.slots
	}
}

// proxyRequest reads the application's request (within
// proxyHandshakeTimeout), gives back its handshake slot and takes one of
// MaxConnections. A UDP ASSOCIATE request is returned for
// serveAssociate.
func (l *local) proxyRequest(release func()) (*UDPAssociateError, *localFailure) {
	_ = l.nc.SetDeadline(time.Now().Add(proxyHandshakeTimeout))
	token, early, err := l.proxy.Request(l.nc)
	_ = l.nc.SetDeadline(time.Time{})
	release()
	ua := (*UDPAssociateError)(nil)
	if err == nil || errors.As(err, &ua) {
		select {
		case l.h.slots <- struct{}{}:
			l.slot = true
		default:
			return nil, &localFailure{proto.CodeOverloaded.String(), "Too many local connections; refusing a proxied connection", errTooManyConnections}
		}
	}
	if ua != nil {
		return ua, nil
	}
	if err != nil {
		l.replied = true // Request answered what it could not serve
		if ae := (*ProxyAuthError)(nil); errors.As(err, &ae) {
			l.h.cfg.Events.ProxyAuthFailed(ae.Proxy, ae.Reason)
		}
		return nil, &localFailure{proto.CodeBadToken.String(), "Bad proxy request", err}
	}
	l.token, l.early = token, early
	return nil, nil
}

// destination asks tokens (nil: Links.Tokens) for the connection's token.
func (l *local) destination(ctx context.Context, tokens TokenSource) *localFailure {
	if tokens == nil {
		tokens = l.h.links.Tokens()
	}
	token, err := tokens.Token(ctx, l.nc.RemoteAddr())
	if err != nil {
		return &localFailure{proto.CodeBadToken.String(), "Could not get a destination token", err}
	}
	l.token = token
	return nil
}

// open opens a stream on the current session (waiting, bounded, for one).
func (l *local) open(ctx context.Context) *localFailure {
	sess, release, err := l.h.links.Sessions.Wait(ctx)
	l.release = release
	if err != nil {
		return &localFailure{ResultNoSession, "No connection to the server for a local connection", fmt.Errorf("%w: %w", errNoSession, err)}
	}
	l.sess = sess
	l.optimistic = l.proxy != nil && sess.verdicts.accepted(l.token, time.Now())
	str, err := l.h.openStream(ctx, sess)
	if err != nil {
		code := proto.CodeConnReset
		if errors.Is(err, errStreamCredit) {
			code = proto.CodeOverloaded
		}
		return &localFailure{code.String(), "Could not open stream", err}
	}
	l.str = str
	return nil
}

// sendHeader writes the header and the application's first bytes at once,
// without waiting for the reply; the header is made now, not at accept: its
// timestamp must be fresh. Before the handshake completes (0-RTT) it
// forwards what the application sends meanwhile and re-sends all of it if
// the server rejects 0-RTT (earlyPhase).
func (l *local) sendHeader(ctx context.Context) *localFailure {
	l.rid = l.resumeID()
	hb, tunnelID, err := l.h.headerFor(l.token, l.rid)
	if err != nil {
		l.str.CancelRead(proto.CodeInternal.StreamErrorCode())
		l.str.CancelWrite(proto.CodeInternal.StreamErrorCode())
		return &localFailure{proto.CodeBadToken.String(), "Could not encode stream header", err}
	}
	if _, err := l.str.Write(append(hb, l.early...)); err != nil {
		l.str.CancelRead(proto.CodeInternal.StreamErrorCode())
		l.str.CancelWrite(proto.CodeInternal.StreamErrorCode())
		return &localFailure{proto.CodeConnReset.String(), "Could not write stream header", err}
	}
	conn := l.sess.Conn.QUIC() // nil on a TCP session: no 0-RTT
	if conn != nil && !transport.HandshakeComplete(conn) {
		o, err := l.h.earlyPhase(ctx, conn, l.sc, l.str, l.token, l.early, tunnelID)
		if err != nil {
			return &localFailure{proto.CodeConnReset.String(), "Could not re-send after 0-RTT rejection", err}
		}
		l.str, tunnelID = o.str, o.id
		if o.resent {
			l.rid = nil // the re-sent header is a plain tunnel's
		}
		if l.rid != nil {
			l.early = o.sent // the resume buffer keeps what went on the stream (resume.Config.Written)
		}
	}
	l.tunnelID = tunnelID
	l.slog = klog.LoggerWithValues(l.logger, "streamID", int64(l.str.StreamID()), "remoteAddress", l.remoteAddr())
	return nil
}

// accepted records the server's reply (nil: CodeOK).
func (l *local) accepted(err error) {
	if err == nil {
		l.h.cfg.Events.StreamOpened(time.Since(l.start))
		if l.h.links.Accepted != nil {
			l.h.links.Accepted(l.sess) // the server accepted our header
		}
	}
	if l.proxy != nil {
		l.sess.verdicts.record(l.token, err == nil, time.Now())
	}
}

// awaitReply returns the stream the splice reads the server from. A
// proxied connection not answered at once waits for the server's reply
// first (the application waits for its answer); otherwise the reply comes
// with the first downstream read (replyStream), and a refusal then resets
// the application's connection.
func (l *local) awaitReply() (splice.Stream, *localFailure) {
	if l.proxy == nil || l.optimistic {
		return &replyStream{Stream: l.str, onReply: l.accepted}, nil
	}
	err := proto.ReadReply(l.str)
	l.accepted(err)
	if err != nil {
		l.str.CancelRead(proto.CodeOK.StreamErrorCode())
		l.str.CancelWrite(proto.CodeOK.StreamErrorCode())
		code := codeOf(err)
		if _, ok := proto.FromError(err); !ok {
			code = proto.CodeConnReset
		}
		if code == proto.CodeRefused {
			l.h.logRefused(klog.LoggerWithValues(l.slog, "listenAddress", l.listenAddr), l.token)
		}
		return nil, &localFailure{code.String(), "Server refused a proxied connection", err}
	}
	return l.str, nil
}

// answerProxy tells a proxied application it is connected.
func (l *local) answerProxy() *localFailure {
	if l.proxy == nil {
		return nil
	}
	l.replied = true
	if err := l.proxy.Reply(l.nc, nil); err != nil {
		l.str.CancelRead(proto.CodeConnReset.StreamErrorCode())
		l.str.CancelWrite(proto.CodeConnReset.StreamErrorCode())
		return &localFailure{proto.CodeConnReset.String(), "Could not answer a proxied connection", err}
	}
	return nil
}

// splice carries the tunnel until both directions end, registered for
// /tunnels and the drain, and logs how the server ended it.
func (l *local) splice(toServer splice.Stream) {
	h, sess, slog := l.h, l.sess, l.slog
	pipe := splice.New(l.sc, toServer)
	if sess.Prober != nil || sess.Waker != nil {
		// Bytes either way wake the liveness checks of an idle connection.
		pipe.AfterWrite = func() { sess.Prober.Kick(); sess.Waker.Wake() }
		pipe.AfterRead = func() { sess.Prober.Heard(); sess.Waker.Wake() }
	}
	t := &tunnel.Tunnel{
		UUID:        l.tunnelID,
		StreamID:    int64(l.str.StreamID()),
		Endpoint:    l.listenAddr,
		Source:      l.remoteAddr(),
		Destination: l.token, // what the server is asked to reach (/tunnels)
		Server:      l.sess.Server,
		Transport:   l.sess.Transport(),
		Direction:   h.direction(),
		CreatedAt:   l.start,
		Upstream:    &pipe.ToStream,
		Downstream:  &pipe.FromStream,
	}
	slog.V(4).Info("Opened stream", "answeredAtOnce", l.optimistic)
	result, err := h.cfg.Registry.Run(t, pipe, h.cfg.Events)
	up, down := t.Upstream.Load(), t.Downstream.Load()
	l.logRefusal(err)
	slog.V(4).Info("Closed stream", "bytesUpstream", up, "bytesDownstream", down, "duration", time.Since(l.start), "result", result, "err", err)
	h.audit(l.logger, l.remoteAddr(), l.token, "tcp:"+l.listenAddr, result, up, down, l.start)
}

// logRefusal logs a tunnel the server ended with a code of its own (not a
// reset or a shutdown): a refused destination at -v 0 (logRefused), a
// header it could not read once at -v 0 (an older server).
func (l *local) logRefusal(err error) {
	var ab *splice.AbortedError
	if !errors.As(err, &ab) {
		return
	}
	code, ok := proto.FromError(ab.Cause)
	if !ok || code == proto.CodeConnReset || code == proto.CodeShutdown {
		return
	}
	h, slog := l.h, l.slog
	if code == proto.CodeRefused {
		h.logRefused(klog.LoggerWithValues(slog, "listenAddress", l.listenAddr), l.token)
	}
	if l.optimistic {
		slog.V(2).Info("Server refused a destination it had accepted on this connection; reset the proxied connection, the next one waits for the server's answer",
			"code", code.String(), "destination", l.token)
	} else {
		slog.V(2).Info("Server refused tunnel", "code", code.String())
	}
	if code == proto.CodeBadHeader && h.badHeaderLogged.CompareAndSwap(false, true) {
		slog.Info("The server could not read our stream header; if it runs an older quictun (before key IDs), upgrade it: servers before clients",
			"code", code.String())
	}
}
