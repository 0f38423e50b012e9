package egress

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/splice"
	"github.com/quictun/quictun/pkg/tunnel"
)

// Serve serves one tunnel stream from header to close: it authenticates the
// header, checks freshness and replay, the destination against the rules,
// dials it within the dial limits and splices until both directions end.
// It calls st.MACVerified once the header's MAC is verified, and
// st.Verified once the header has also passed the freshness and replay
// checks. Each step is a method of stream; the first that fails returns a
// *failure, and fail ends the stream with its code.
func (e *Handler) Serve(ctx context.Context, st Stream) {
	s := &stream{e: e, st: st, str: st.Stream, start: time.Now(), base: klog.FromContext(ctx), streamID: int64(st.Stream.StreamID())}
	if f := s.serve(ctx); f != nil {
		s.fail(ctx, f)
	}
}

// serve runs the steps of a stream in order.
func (s *stream) serve(ctx context.Context) *failure {
	if f := s.readHeader(); f != nil {
		return f
	}
	if f := s.authenticate(ctx); f != nil {
		return f
	}
	if f := s.settleEarly(ctx); f != nil {
		return f
	}
	if s.e.cfg.Reverse && s.h.Kind != proto.KindTCP && s.h.Kind != proto.KindUDP {
		return failed(proto.CodeUnsupported, "Refused stream: a reverse forward's stream is tcp or udp", "kind", s.h.Kind.String())
	}
	if s.h.Kind == proto.KindHello {
		s.e.hello(s.st, s.h, s.keyName, s.log())
		return nil
	}
	s.identify()
	if f := s.fresh(); f != nil {
		return f
	}
	if s.h.Kind == proto.KindCheck {
		s.e.check(ctx, s.st, s.h, s.pol, s.key, s.identities, s.log())
		return nil
	}
	if s.h.Kind == proto.KindResume {
		return s.resume(ctx)
	}
	if s.h.Kind == proto.KindReverse && s.e.cfg.Binder != nil {
		return s.bind(ctx)
	}
	if f := s.destination(); f != nil {
		return f
	}
	if f := s.authorize(ctx); f != nil {
		return f
	}
	if f := s.admit(); f != nil {
		return f
	}
	if f := s.suspended(); f != nil {
		return f
	}
	if s.h.Kind == proto.KindUDP {
		return s.e.serveUDP(ctx, s)
	}
	nc, f := s.dial(ctx)
	if f != nil {
		return f
	}
	return s.splice(nc)
}

// stream is one tunnel stream being served, and what its steps have
// learned so far: the header, the policy it is checked against (one
// configuration for the whole stream: keys and rules of one reload), who
// the client is, where it goes.
type stream struct {
	e     *Handler
	st    Stream
	str   TunnelStream
	start time.Time
	// base is the connection's logger. The stream's adds streamID, then
	// key and clientSubject once known (logKey, logSubject); log makes it
	// at its first use, as at the default level most streams log nothing.
	base               klog.Logger
	logger             klog.Logger // made by log when logMade
	logMade            bool
	streamID           int64
	logKey, logSubject bool

	h   *proto.Header
	pol *policy
	// key is the shared secret the header was made with, keyName its label
	// ("" without shared-secret authentication), for logs and identity rules.
	key     proto.Key
	keyName string
	peer    peer
	// identities are who the client proved to be (peer.identities).
	identities []string
	// audited: the tunnel's audit line is due (AuditLog, header verified).
	audited bool
	// dest is the destination the token names, target the address the rules
	// resolved it to, rule the rule that allowed it.
	dest, target endpoint.Endpoint
	rule         string
	// keyLife ends when a reload removes the key (cutOnRemoval).
	keyLife context.Context
	// acct is the identity's account (account; nil before, or without
	// Config.Accounts).
	acct Account
}

// log returns the stream's logger, made at its first use. Only the
// stream's goroutine calls it, or others once it is made (a resumable
// tunnel's, spliceResumable); others use newLogger.
func (s *stream) log() klog.Logger {
	if !s.logMade {
		s.logger, s.logMade = s.newLogger(), true
	}
	return s.logger
}

// newLogger makes the stream's logger from what the stream knows now.
func (s *stream) newLogger() klog.Logger {
	kv := make([]any, 0, 6)
	kv = append(kv, "streamID", s.streamID)
	if s.logKey {
		kv = append(kv, "key", s.keyName)
	}
	if s.logSubject {
		kv = append(kv, "clientSubject", s.peer.subject)
	}
	return klog.LoggerWithValues(s.base, kv...)
}

// logV is log().V(lvl) without making the logger while lvl is off for its
// caller's file (-v, --vmodule: checked one frame up, where the line is
// logged from).
func (s *stream) logV(lvl int) klog.Logger {
	if v := s.base.WithCallDepth(1).V(lvl); !v.Enabled() {
		return v
	}
	return s.log().V(lvl)
}

// failure is why a step ended a stream: the code it is reset with, and the
// line logged at level lvl (-1: by the code, see fail).
type failure struct {
	code proto.Code
	lvl  int
	msg  string
	kv   []any
	// closeConn: the connection is closed with the code too (a failed
	// authentication).
	closeConn bool
}

// failed returns the failure of code, logged with msg at the level of its
// code (see fail).
func failed(code proto.Code, msg string, kv ...any) *failure {
	return &failure{code: code, lvl: -1, msg: msg, kv: kv}
}

// fail resets the stream with f's code, counts it, writes the audit line
// if due, logs f (at -v 2 for refused, auth_failed and replay, which an
// operator wants to see, else -v 4, unless f says) and closes the
// connection if f says.
func (s *stream) fail(ctx context.Context, f *failure) {
	s.e.cfg.Events.StreamFailed(f.code.String())
	Reset(s.str, f.code)
	if s.audited {
		s.audit(f.code.String(), 0, 0)
	}
	lvl := f.lvl
	if lvl < 0 {
		lvl = 4
		if f.code == proto.CodeRefused || f.code == proto.CodeAuthFailed || f.code == proto.CodeReplay {
			lvl = 2
		}
	}
	s.logV(lvl).Info(f.msg, append(f.kv, "code", f.code.String())...)
	if f.closeConn {
		CloseConn(ctx, s.st.Conn, f.code, "authentication failed")
	}
}

// audit writes the tunnel's audit line.
func (s *stream) audit(result string, up, down int64) {
	if s.h.Kind == proto.KindReverse {
		s.auditBind(result)
		return
	}
	dest := s.h.Token
	if s.e.cfg.Reverse && s.dest.Network != "" {
		dest = s.dest.String() // the declared destination its binding names
	}
	s.log().Info("Closed tunnel", "direction", s.e.direction(), "identity", strings.Join(s.identities, ","), "destination", dest, "result", result,
		"bytesUpstream", up, "bytesDownstream", down, "duration", time.Since(s.start).Round(time.Millisecond))
}

// auditBind writes the audit line of a reverse forward request refused
// before its binding (a bound one is no tunnel, its connections are): the
// direction and the address the client asked the server to listen on, not
// the wire token ("bind/1/ID/LISTEN").
func (s *stream) auditBind(result string) {
	listen := "(bad bind token)"
	if b, err := proto.ParseBind(s.h.Token); err == nil {
		listen = b.Listen
	}
	s.log().Info("Closed tunnel", "direction", tunnel.Reverse, "identity", strings.Join(s.identities, ","), "listen", listen,
		"result", result, "duration", time.Since(s.start).Round(time.Millisecond))
}

// readHeader reads the stream header within HeaderTimeout.
func (s *stream) readHeader() *failure {
	_ = s.str.SetReadDeadline(s.start.Add(s.e.cfg.HeaderTimeout))
	h, err := proto.Decode(s.str)
	if err != nil {
		code := proto.CodeBadHeader
		if errors.Is(err, os.ErrDeadlineExceeded) {
			code = proto.CodeTimeout
		} else if _, ok := proto.FromError(err); ok {
			code = proto.CodeConnReset
		}
		return failed(code, "Rejected stream header", "err", err)
	}
	_ = s.str.SetReadDeadline(time.Time{})
	s.h = h
	return nil
}

// authenticate verifies the header's MAC with the keys of the policy in
// force (none: the TLS layer authenticated the peer), asks the auth hook
// about the client certificate if there is one (hookCert), then calls
// st.MACVerified. A failure closes the connection (not the hook's
// overloaded).
func (s *stream) authenticate(ctx context.Context) *failure {
	s.pol = s.e.policy.Load()
	if kr := s.pol.keys; kr.Len() > 0 {
		key, err := kr.Verify(s.h)
		if errors.Is(err, proto.ErrUnknownKey) && s.e.cfg.KeyHook != nil {
			var f *failure
			var rules *endpoint.AllowList
			if key, rules, f, err = s.hookKey(ctx); f != nil {
				return f
			}
			if err == nil && rules != nil {
				s.pol = s.pol.withHooked("key="+key.Name, rules)
			}
		}
		s.key, s.keyName = key, key.Label()
		if err != nil {
			reason := AuthBadMAC
			switch {
			case errors.Is(err, proto.ErrNoMAC):
				reason = AuthNoMAC
			case errors.Is(err, proto.ErrUnknownKey):
				reason = AuthUnknownKey
			}
			s.e.cfg.Events.AuthFailed(reason)
			// The operator must see a client that cannot authenticate
			// (most often a wrong secret), once a minute per address.
			lvl, kv := 2, []any{"reason", reason, "keyID", keyIDOf(s.h)}
			if ok, n := s.e.authFailures.Allow(sourceOf(s.st.Conn)); ok {
				lvl, kv = 0, append(kv, "suppressed", n)
			}
			return &failure{code: proto.CodeAuthFailed, lvl: lvl, msg: "Refused client: authentication failed; " + authFailureFix(reason), kv: kv, closeConn: true}
		}
	}
	if f := s.hookCert(ctx); f != nil {
		return f
	}
	if s.keyName != "" {
		s.logKey, s.logMade = true, false // made again with it at its next use
	}
	if s.st.MACVerified != nil {
		s.st.MACVerified()
	}
	return nil
}

// hookKey asks Config.KeyHook for the key of the header's ID (and the
// destination rules of its identity, from a KeyRulesHook), within
// HeaderTimeout, and checks the header's MAC with it. A hook that does not
// answer in time, is busy, or answers what the server refuses (a bad
// secret, name, cap, quota or rule: the lookup fails closed) refuses the
// stream with overloaded (f, hookFailed).
func (s *stream) hookKey(ctx context.Context) (proto.Key, *endpoint.AllowList, *failure, error) {
	hctx, cancel := context.WithTimeout(ctx, s.e.cfg.HeaderTimeout)
	defer cancel()
	var key proto.Key
	var rules *endpoint.AllowList
	var err error
	if rh, ok := s.e.cfg.KeyHook.(KeyRulesHook); ok {
		key, rules, err = rh.LookupRules(hctx, s.h.KeyID)
	} else {
		key, err = s.e.cfg.KeyHook.Lookup(hctx, s.h.KeyID)
	}
	switch {
	case errors.Is(err, proto.ErrUnknownKey):
		return proto.Key{}, nil, nil, proto.ErrUnknownKey
	case err != nil:
		return proto.Key{}, nil, s.hookFailed(err, "its key ID", "keyID", keyIDOf(s.h)), nil
	}
	if err := s.h.Verify(key.Secret); err != nil {
		return proto.Key{}, nil, nil, err
	}
	return key, rules, nil, nil
}

// hookFailed is the failure of a stream the auth hook gave no usable
// answer for (about what: "its key ID", "its client certificate"), with
// err: overloaded, logged at -v 0 once a LogInterval per error (the
// operator must fix the hook), else at -v 2.
func (s *stream) hookFailed(err error, what string, kv ...any) *failure {
	s.e.cfg.Events.AuthFailed(AuthHookUnavailable)
	lvl := 2
	kv = append(kv, "err", err)
	if ok, n := s.e.hookFailures.Allow(err.Error()); ok {
		lvl, kv = 0, append(kv, "suppressed", n)
	}
	return &failure{code: proto.CodeOverloaded, lvl: lvl, msg: "Refused stream: the auth hook gave no usable answer for " + what +
		" (down, slow, busy, or an answer the server refuses: see err); the client tries again", kv: kv}
}

// hookCert asks Config.CertHook about the client certificate of the
// stream's connection, if it presented one, within HeaderTimeout (the
// key's hook, if asked, came first: a client with both is asked about
// both, and both must say yes). A refusal fails the authentication as a
// wrong key does: auth_failed, counted as hook_refused, logged at -v 0
// once a LogInterval per address, the connection closed. A hook that
// does not answer in time, is busy, or answers what the server refuses
// refuses the stream with overloaded (hookFailed). The answer's rules
// apply to the stream for the certificate's identity, CN=NAME.
func (s *stream) hookCert(ctx context.Context) *failure {
	if s.e.cfg.CertHook == nil {
		return nil
	}
	p := s.st.Conn0.peerOf(s.st.Conn)
	if p.cert == nil {
		return nil
	}
	identity := strings.Join(p.identities(""), ",") // "CN=NAME", or "" without a common name
	hctx, cancel := context.WithTimeout(ctx, s.e.cfg.HeaderTimeout)
	defer cancel()
	rules, err := s.e.cfg.CertHook.LookupCert(hctx, identity, p.cert)
	switch {
	case errors.Is(err, ErrCertRefused):
		s.e.cfg.Events.AuthFailed(AuthHookRefused)
		lvl, kv := 2, []any{"reason", AuthHookRefused, "clientSubject", p.subject, "err", err}
		if ok, n := s.e.authFailures.Allow(sourceOf(s.st.Conn)); ok {
			lvl, kv = 0, append(kv, "suppressed", n)
		}
		return &failure{code: proto.CodeAuthFailed, lvl: lvl, kv: kv, closeConn: true,
			msg: "Refused client: the auth hook refused its certificate (403 or 404); if it should connect, have the hook answer 200 for it"}
	case err != nil:
		return s.hookFailed(err, "its client certificate", "clientSubject", p.subject)
	}
	if rules != nil && identity != "" {
		s.pol = s.pol.withHooked(identity, rules)
	}
	return nil
}

// identify learns who the client is: its certificate (known once the
// handshake is: a stream of a new connection arrives after it; a 0-RTT
// stream's session ticket carries the certificate it was issued to) and the
// key of its header. From here on a failure is audited.
func (s *stream) identify() {
	s.peer = s.st.Conn0.peerOf(s.st.Conn)
	if s.peer.subject != "" {
		s.logSubject, s.logMade = true, false
	}
	s.identities = s.peer.identities(s.keyName)
	s.audited = s.e.cfg.AuditLog
}

// fresh checks the header's time: every header must be fresh, not only
// 0-RTT ones, so that a header with a valid MAC found later (in a log, a
// core dump) cannot open tunnels forever.
func (s *stream) fresh() *failure {
	if now := time.Now(); !s.e.replay.fresh(s.h.Time, now) {
		return failed(proto.CodeReplay, "Rejected stream: header timestamp outside the replay window; check the client's clock (NTP)",
			"headerTime", s.h.Time, "skew", now.Sub(s.h.Time).Round(time.Second), "window", s.e.cfg.ReplayWindow)
	}
	return nil
}

// settleEarly decides what a 0-RTT header made before this process started
// is: the replay cache is in memory, so it cannot tell whether the process
// before saw that header. Such a stream is served as a 1-RTT one once its
// connection's handshake completes, which a replayed 0-RTT flight cannot
// do (the replayer lacks the client's keys): it was the client's own,
// written while the server restarted (a redial racing the restart), and
// waits a round trip more. A nonce seen already, or a connection that dies
// before its handshake, refuses it as a replay. Only a fresh header waits:
// one outside the replay window is not held, and the freshness check every
// stream passes next refuses it at once (a replayed flight of any age must
// not hold a stream until its handshake times out).
func (s *stream) settleEarly(ctx context.Context) *failure {
	if !s.st.Early || !s.h.Time.Before(s.e.started.Truncate(time.Second)) {
		return nil
	}
	now := time.Now()
	if !s.e.replay.fresh(s.h.Time, now) {
		return nil // stale: refused by fresh (hello: by admit), not held
	}
	if s.e.replay.seenNonce(s.h.Nonce, now) {
		return failed(proto.CodeReplay, "Rejected 0-RTT stream: header seen before", "headerTime", s.h.Time)
	}
	select {
	case <-s.st.Conn.HandshakeComplete():
		s.st.Early = false // no longer replayable data
		s.logV(4).Info("0-RTT stream made before the server started: served after the handshake", "headerTime", s.h.Time)
		return nil
	case <-s.st.Conn.Context().Done():
	case <-ctx.Done():
	}
	return failed(proto.CodeReplay, "Rejected 0-RTT stream: header made before the server started, and its connection ended before the handshake completed",
		"headerTime", s.h.Time)
}

// destination reads the endpoint the token names, for a kind this Handler
// serves.
func (s *stream) destination() *failure {
	if s.h.Kind != proto.KindTCP && (s.h.Kind != proto.KindUDP || s.st.Flows == nil) {
		// Reverse binds are carried by later versions; refuse clearly
		// rather than treat the stream as TCP.
		return failed(proto.CodeUnsupported, "Refused stream: this server does not serve its kind", "kind", s.h.Kind.String())
	}
	dest, err := s.e.cfg.Parser.Parse(s.h.Token)
	if err != nil {
		return failed(proto.CodeBadToken, "Rejected stream: bad destination token", "err", err)
	}
	if (s.h.Kind == proto.KindUDP) != (dest.Network == endpoint.NetworkUDP) {
		return failed(proto.CodeBadToken, "Rejected stream: the destination's network does not match the stream's kind",
			"kind", s.h.Kind.String(), "destination", dest.String())
	}
	s.dest = dest
	return nil
}

// authorize checks the destination against the policy's rules for the
// client's identities. Every refusal refuses, a name that does not resolve
// too: the client learns nothing about which internal names exist.
func (s *stream) authorize(ctx context.Context) *failure {
	dial, rule, err := s.pol.authorize(ctx, s.e.cfg.Resolver, s.dest, s.identities)
	if err != nil {
		return s.refused(err)
	}
	s.target, s.rule = dial, rule
	return nil
}

// refused is the failure of a destination the rules (or the checked
// dialer) refused with err, counted by reason.
func (s *stream) refused(err error) *failure {
	s.e.cfg.Events.DestinationRefused(s.dest.Network, endpoint.RefusalReason(err))
	if a := s.account(); a != nil {
		a.Refused()
	}
	lvl, msg, kv := s.e.refusal(s.dest, s.identities, err)
	return &failure{code: proto.CodeRefused, lvl: lvl, msg: msg, kv: kv}
}

// admit records the header in the replay cache (only headers that passed
// the MAC and the rules take a place there, within the connection's quota);
// only then does it prove the secret (a valid MAC on a stale or replayed
// header is what anyone holding a leaked header has): the connection is
// verified and st.Verified called. Then the key's lifetime: a reload that
// removed it since the header was checked (Policy.CutRemovedKeys) refuses
// the stream.
func (s *stream) admit() *failure {
	code, unrecorded := s.e.replay.admit(s.h, time.Now(), s.st.Early, s.st.Conn0.quota)
	if unrecorded != "" {
		s.e.cfg.Events.ReplayUnrecorded(unrecorded)
	}
	if code != proto.CodeOK {
		return failed(code, "Rejected stream: header seen before, or no room to record a 0-RTT header", "early", s.st.Early, "unrecorded", unrecorded)
	}
	s.st.Conn0.verified(s.identities)
	if s.st.Verified != nil {
		s.st.Verified()
	}
	s.keyLife = context.Background()
	if l, ok := s.pol.life(s.key); ok && s.pol.keys.Len() > 0 {
		s.keyLife = l.ctx
	}
	if cause := context.Cause(s.keyLife); cause != nil {
		return failed(proto.CodeAuthFailed, "Refused stream: a reload removed its key; the client needs a key the server holds", "cause", cause)
	}
	return nil
}

// dial connects to the destination within the dial limits: a slot of its
// destination (MaxDialsPerDestination) and one of the Handler's
// (MaxConcurrentDials), both within DialTimeout.
func (s *stream) dial(ctx context.Context) (splice.Conn, *failure) {
	e, dest := s.e, s.target.String()
	dctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	defer cancel()
	slots := e.destination(dest)
	select {
	case slots.slots <- struct{}{}:
	case <-dctx.Done():
		e.releaseDestination(dest, false)
		return nil, failed(proto.CodeOverloaded, "Too many concurrent dials to one destination", "destination", s.dest.String(),
			"limit", e.cfg.MaxDialsPerDestination)
	}
	select {
	case e.dials <- struct{}{}:
	case <-dctx.Done():
		e.releaseDestination(dest, true)
		return nil, failed(proto.CodeOverloaded, "Too many concurrent dials", "destination", s.dest.String())
	}
	dialStart := time.Now()
	nc, err := e.cfg.Dialer.DialContext(dctx, s.target.Network, s.target.Address)
	<-e.dials
	e.releaseDestination(dest, true)
	e.cfg.Events.Dialed(time.Since(dialStart))
	if errors.Is(err, endpoint.ErrForbidden) { // CheckDial refused the address the dialer chose
		return nil, s.refused(err)
	}
	if err != nil {
		code := proto.CodeDialFailed
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
			code = proto.CodeTimeout
		}
		return nil, failed(code, "Dial failed", "destination", s.dest.String(), "err", err)
	}
	sc, ok := nc.(splice.Conn)
	if !ok {
		_ = nc.Close()
		return nil, failed(proto.CodeInternal, "Dialed connection does not support half-close", "destination", s.dest.String())
	}
	return sc, nil
}

// splice answers the client with CodeOK and carries the tunnel until both
// directions end (or its key is cut), registered for /tunnels and the
// drain; then the audit line.
func (s *stream) splice(sc splice.Conn) *failure {
	if s.resumable() {
		return s.spliceResumable(sc)
	}
	e, str := s.e, s.str
	if err := proto.WriteReply(str, proto.CodeOK); err != nil {
		_ = sc.Close()
		return failed(proto.CodeConnReset, "Could not write reply", "err", err)
	}
	pipe := splice.New(sc, s.throttle(str))
	if p := s.st.Prober; p != nil {
		pipe.AfterWrite, pipe.AfterRead = p.Kick, p.Heard
	}
	t := s.tunnelInfo()
	t.Upstream, t.Downstream = &pipe.FromStream, &pipe.ToStream
	s.logV(4).Info("Opened stream", "destination", s.target.String(), "rule", s.rule)
	defer cutOnRemoval(s.keyLife, pipe, s.newLogger, "tunnel")()
	defer s.track(&pipe.FromStream, &pipe.ToStream)()
	result, err := e.cfg.Registry.Run(t, pipe, e.cfg.Events)
	up, down := t.Upstream.Load(), t.Downstream.Load()
	s.logV(4).Info("Closed stream", "destination", s.target.String(), "bytesUpstream", up, "bytesDownstream", down,
		"duration", time.Since(s.start), "result", result, "err", err)
	if s.audited {
		s.audit(result, up, down)
	}
	return nil
}

// tunnelInfo is the registry's record of the stream's tunnel, without its
// byte counters.
func (s *stream) tunnelInfo() *tunnel.Tunnel {
	return &tunnel.Tunnel{
		UUID:        s.h.TunnelID(),
		StreamID:    int64(s.str.StreamID()),
		ConnID:      s.st.ConnID,
		Identity:    strings.Join(s.identities, ","),
		Endpoint:    s.e.cfg.Endpoint,
		Source:      s.st.Conn.RemoteAddr().String(),
		Destination: s.target.String(),
		Transport:   transportOf(s.st.Conn),
		Direction:   s.e.direction(),
		CreatedAt:   s.start,
	}
}
