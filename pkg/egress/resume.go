package egress

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/splice"
	"github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/pkg/udpflow"
)

// Resume are the settings of resumable tunnels (--resume-window;
// pkg/resume) on the server.
type Resume struct {
	resume.Settings
	// Max bounds the resumable tunnels held, running and parked (0:
	// DefaultMaxResumable); past it new tunnels are plain ones.
	Max int
}

// DefaultMaxResumable is the default Resume.Max: parked tunnels no longer
// count against their connection's stream limit, this bounds them (and the
// sockets they hold) for the whole server.
const DefaultMaxResumable = 65536

// window is the resume window of a tunnel opened now, 0 without Resume.
func (e *Handler) window() time.Duration {
	if r := e.cfg.Resume; r != nil {
		return r.WindowNow()
	}
	return 0
}

// resumable reports whether the stream's tunnel is kept resumable: its
// header asks for it, the window is on, and the connection carries the
// ack datagrams (a tunnel without them would stall at its cap).
func (s *stream) resumable() bool {
	if !s.h.HasResumeID || s.h.Kind != proto.KindTCP || s.e.window() <= 0 || ackSender(s.st.Conn) == nil {
		return false
	}
	r := s.e.cfg.Resume
	if r.Table.Len() >= cmp.Or(r.Max, DefaultMaxResumable) {
		s.logV(2).Info("Opened a plain tunnel instead of a resumable one: the server holds its maximum of resumable tunnels",
			"max", cmp.Or(r.Max, DefaultMaxResumable))
		return false
	}
	return true
}

// ackSender returns the connection's datagram sender, nil without
// datagrams.
func ackSender(c Conn) func([]byte) error {
	dc, ok := c.(udpflow.DatagramConn)
	if !ok || !c.ConnectionState().SupportsDatagrams.Remote {
		return nil
	}
	return dc.SendDatagram
}

// attachment is the resume.Attachment of the stream's connection.
func (s *stream) attachment(peerOffset uint64, reply bool) *resume.Attachment {
	a := &resume.Attachment{Stream: s.throttle(s.str), Done: s.st.Conn.Context().Done(), PeerOffset: peerOffset,
		Reply: reply, Conn: s.st.Conn, SendAck: ackSender(s.st.Conn)}
	if p := s.st.Prober; p != nil {
		a.AfterWrite, a.AfterRead = p.Kick, p.Heard
	}
	return a
}

// spliceResumable is splice for a resumable tunnel: the reply, then the
// tunnel's first stream. When its connection is lost the tunnel parks
// and this stream's goroutine returns; a resume request's stream
// (resume) continues it, and whichever ends it does the accounting
// (resumableEnded).
func (s *stream) spliceResumable(sc splice.Conn) *failure {
	e, r := s.e, s.e.cfg.Resume
	_ = s.log() // made here: the pipe's OnEnd logs from another goroutine
	id := resume.ID(s.h.ResumeID)
	t := s.tunnelInfo()
	t.Resumable = true
	end := make(chan func(error), 1)
	p := resume.NewPipe(sc, resume.Config{ID: id, Window: e.window(), Cap: r.Cap, Budget: r.Budget, Events: r.Events,
		OnEnd: func(err error) { (<-end)(err) }, Meta: t})
	t.Upstream, t.Downstream = &p.FromStream, &p.ToStream
	remove, err := r.Table.Add(id, strings.Join(s.identities, ","), p)
	if err != nil {
		end <- func(error) {}
		p.Abort(proto.CodeResumeRefused)
		return failed(proto.CodeResumeRefused, "Refused tunnel: its resume ID is in use", "err", err)
	}
	if err := proto.WriteReply(s.str, proto.CodeOK); err != nil {
		end <- func(error) { remove() }
		p.Abort(proto.CodeConnReset)
		return failed(proto.CodeConnReset, "Could not write reply", "err", err)
	}
	unregister := e.cfg.Registry.Add(t, p)
	e.cfg.Events.TunnelOpened()
	stopCut := cutOnRemoval(s.keyLife, p, s.newLogger, "tunnel")
	stopTrack := s.track(&p.FromStream, &p.ToStream)
	end <- func(err error) {
		remove()
		unregister()
		stopCut()
		stopTrack()
		s.resumableEnded(t, err)
	}
	s.logV(4).Info("Opened stream", "destination", s.target.String(), "rule", s.rule, "resumable", true)
	switch err := p.Serve(s.attachment(0, false)); {
	case errors.Is(err, resume.ErrParked) && !handshakeDone(s.st.Conn):
		// Opened as 0-RTT data on a connection lost before its handshake
		// completed: the client re-sends such a tunnel as a new, plain
		// one on its next connection (pkg/ingress earlyPhase), so this
		// one would wait for nobody, holding its destination.
		p.End(proto.CodeConnReset, resume.GaveUpHandshake)
		s.logV(2).Info("Ended tunnel opened as 0-RTT data: its connection was lost before the handshake completed")
	case errors.Is(err, resume.ErrParked):
		s.logV(2).Info("Parked tunnel: its connection was lost; the client may resume it", "window", e.window())
	case errors.Is(err, resume.ErrEnded):
		Reset(s.str, proto.CodeConnReset) // aborted before it ran (drain, DELETE /tunnels, a removed key)
	}
	return nil
}

// handshakeDone reports whether c's handshake has completed.
func handshakeDone(c Conn) bool {
	select {
	case <-c.HandshakeComplete():
		return true
	default:
		return false
	}
}

// resumableEnded accounts for a resumable tunnel's end (err: as OnEnd).
// A tunnel handed over to the new process (an upgrade) did not end: the
// new process accounts for it.
func (s *stream) resumableEnded(t *tunnel.Tunnel, err error) {
	if errors.Is(err, resume.ErrHandedOver) {
		s.logV(4).Info("Handed tunnel over to the new process")
		return
	}
	result := proto.CodeOK.String()
	var ab *splice.AbortedError
	if errors.As(err, &ab) {
		result = ab.Code.String()
	}
	up, down := t.Upstream.Load(), t.Downstream.Load()
	s.e.cfg.Events.TunnelClosed(result, up, down)
	s.logV(4).Info("Closed stream", "destination", s.target.String(), "bytesUpstream", up, "bytesDownstream", down,
		"duration", time.Since(s.start), "result", result, "err", err)
	if s.audited {
		s.audit(result, up, down)
	}
}

// resume serves a resume request (proto.KindResume): once the header has
// proven the secret and passed the replay check (a replayed request is
// refused as such), the tunnel it names continues on this stream if the
// same identity opened it. Every refusal is CodeResumeRefused and holds
// nothing. While an upgrade's new process imports its predecessor's
// tunnels (resume.Table.BeginImport) a request for a tunnel not held yet
// waits for the import (bounded by the handover's timeout, or until its
// connection or ctx ends): it was authenticated above, so what it holds
// is its own stream and goroutine, within its connection's stream limit.
func (s *stream) resume(ctx context.Context) *failure {
	r := s.e.cfg.Resume
	if r == nil || s.e.window() <= 0 {
		return s.resumeRefused(resume.RefusedDisabled, nil)
	}
	req, err := resume.ParseRequest(s.h.Token)
	if err != nil {
		return s.resumeRefused(resume.RefusedBadRequest, err)
	}
	if f := s.admit(); f != nil {
		return f
	}
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.st.Conn.Context(), cancel)
	p, waited, err := r.Table.LookupWait(wctx, req.ID, strings.Join(s.identities, ","))
	stop()
	cancel()
	if waited {
		s.logV(2).Info("Resume request waited for the tunnels an upgrade hands over", "found", err == nil)
	}
	switch {
	case errors.Is(err, resume.ErrIdentity):
		return s.resumeRefused(resume.RefusedIdentity, err)
	case err != nil:
		return s.resumeRefused(resume.RefusedUnknown, err)
	}
	// A kick ends its identity's tunnels (Table.EndIdentity); one that
	// got into the table beside the kick (its header checked before the
	// suspension) ends here instead of resuming.
	if until := s.suspendedUntil(); !until.IsZero() {
		p.End(proto.CodeSuspended, resume.GaveUpKicked)
		return s.resumeRefused(resume.RefusedSuspended, fmt.Errorf("identity suspended until %s", until.UTC().Format(time.RFC3339)))
	}
	s.logV(2).Info("Resuming tunnel", "bytesReceivedByClient", req.Offset)
	a := s.attachment(req.Offset, true)
	a.Early = s.st.Early // as 0-RTT data (settleEarly cleared it if it waited for the handshake)
	switch err := p.Serve(a); {
	case errors.Is(err, resume.ErrEnded):
		return s.resumeRefused(resume.RefusedUnknown, err)
	case errors.Is(err, resume.ErrParked):
		s.logV(2).Info("Parked tunnel: its connection was lost again; the client may resume it")
	}
	return nil
}

// resumeRefused is the failure of a refused resume request, counted by
// reason.
func (s *stream) resumeRefused(reason string, err error) *failure {
	if r := s.e.cfg.Resume; r != nil && r.Events != nil {
		r.Events.ResumeRefused(reason)
	}
	return &failure{code: proto.CodeResumeRefused, lvl: 2, msg: "Refused resume request", kv: []any{"reason", reason, "err", err}}
}

// ImportResumable continues a resumable tunnel the previous process handed
// over (an upgrade; resume.Import): parked in the Table for its client's
// re-attachment, in the registry (t: how /tunnels shows it), counted as
// open and in its identity's usage; its end is accounted as any resumable
// tunnel's (its audit line names the identity and destination). On error
// nothing is held and the application's connection is reset.
func (e *Handler) ImportResumable(st *resume.State, t *tunnel.Tunnel, logger klog.Logger) error {
	r := e.cfg.Resume
	if r == nil {
		_ = st.Conn.Close()
		return errors.New("resumable tunnels are off (no --resume-window)")
	}
	end := make(chan func(error), 1)
	p, err := resume.Import(st, resume.Config{Cap: r.Cap, Budget: r.Budget, Events: r.Events, Meta: t,
		OnEnd: func(err error) { (<-end)(err) }})
	if err != nil {
		return err
	}
	t.Resumable, t.Endpoint, t.Direction, t.Identity = true, e.cfg.Endpoint, e.direction(), st.Identity
	t.Upstream, t.Downstream = &p.FromStream, &p.ToStream
	remove, err := r.Table.Add(st.ID, st.Identity, p)
	if err != nil {
		end <- func(error) {}
		p.Abort(proto.CodeResumeRefused)
		<-p.Ended()
		return err
	}
	unregister := e.cfg.Registry.Add(t, p)
	e.cfg.Events.TunnelOpened()
	stopTrack := func() {}
	if e.cfg.Accounts != nil {
		stopTrack = e.cfg.Accounts.Account(st.Identity).TrackFrom(&p.FromStream, &p.ToStream, st.FromStream, st.ToStream)
	}
	logger = klog.LoggerWithValues(logger, "tunnelID", t.UUID)
	end <- func(err error) {
		remove()
		unregister()
		stopTrack()
		result := proto.CodeOK.String()
		var ab *splice.AbortedError
		if errors.As(err, &ab) {
			result = ab.Code.String()
		}
		up, down := t.Upstream.Load(), t.Downstream.Load()
		e.cfg.Events.TunnelClosed(result, up, down)
		logger.V(4).Info("Closed stream", "destination", t.Destination, "bytesUpstream", up, "bytesDownstream", down,
			"duration", time.Since(t.CreatedAt), "result", result, "err", err)
		if e.cfg.AuditLog {
			logger.Info("Closed tunnel", "direction", e.direction(), "identity", st.Identity, "destination", t.Destination, "result", result,
				"bytesUpstream", up, "bytesDownstream", down, "duration", time.Since(t.CreatedAt).Round(time.Millisecond))
		}
	}
	return nil
}
