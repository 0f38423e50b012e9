package client

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/backoff"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/tcpmux"
	"github.com/quictun/quictun/pkg/udpflow"
)

// Transports a client may carry tunnels on (Config.Transport, --transport).
const (
	// TransportAuto uses QUIC, and TCP while QUIC cannot carry tunnels
	// (UDP blocked): new tunnels go back to QUIC as soon as it works.
	TransportAuto = "auto"
	// TransportQUIC uses QUIC only.
	TransportQUIC = "quic"
	// TransportTCP uses TCP only (pkg/tcpmux: TLS 1.3, HTTP/2 framing).
	TransportTCP = "tcp"
)

// DefaultFallbackDelay is how long QUIC may fail to connect (or stay
// silent) before new tunnels go over TCP (Config.FallbackDelay). A healthy
// QUIC handshake takes one round trip, so no TCP connection is made while
// UDP works.
const DefaultFallbackDelay = time.Second

// fallbackProbeMax bounds the wait between QUIC attempts while tunnels go
// over TCP, so that new tunnels are back on QUIC within about this plus one
// handshake timeout once UDP works again.
const fallbackProbeMax = 5 * time.Second

// answeringGrace is how much longer than the fallback delay a QUIC
// handshake that the server answers (packets come back over UDP) may take
// before new tunnels go over TCP anyway: UDP gets through, the server is
// slow (a crowd of clients reconnecting after its restart), and a TCP and
// TLS handshake of every client would only add to its load. It is the
// client's handshake timeout, after which the dial is tried afresh.
const answeringGrace = 3 * time.Second

// answeringPoll is how often the fallback looks again at a handshake the
// server answers, within answeringGrace.
const answeringPoll = 250 * time.Millisecond

// fallback keeps a TCP connection to the server while QUIC cannot carry
// new tunnels, and none while it can: the client's supervisor tells it how
// QUIC is doing (quicDialing, quicUsable, quicSuspect), ingress asks it
// which session a new tunnel goes on (choose). Tunnels stay on the
// connection they started on; a TCP connection no longer wanted is closed
// once its last tunnel has ended. Its goroutine (run) owns the TCP
// connection.
type fallback struct {
	c     *Client
	mode  string
	addr  string
	delay time.Duration
	wake  chan struct{} // capacity 1: the state changed
	// heartbeat is the client's heartbeat interval (quicGrace); answering
	// wakes the new tunnels waiting for QUIC (c.sessionsChanged; nil: none).
	heartbeat time.Duration
	answering func()

	mu sync.Mutex
	// slots are the TCP connections' places, one per tcpLink: one (the
	// servers in turn) in auto mode and with one server, one per server
	// with --transport tcp and several (as QUIC's links: failover or
	// spread).
	slots []*tcpSlot
	// downSince is when QUIC stopped being usable (zero: usable, or no
	// attempt yet). up and suspect are per QUIC connection (a member of the
	// client's, one per server and --connections): up, its handshake done;
	// suspect, its path went silent. QUIC is usable while one connection is
	// up and not suspect.
	downSince time.Time
	up        map[any]bool
	suspect   map[any]bool
	// refused is each connection whose server refused our credentials
	// over QUIC (its last attempt): UDP gets through, and TCP would be
	// refused too.
	refused map[any]bool
	// pending is each connection still in its handshake (a resumed one,
	// which the client holds before the handshake completes).
	pending map[any]rxCounter
	// using is the transport new tunnels went on last ("" before any);
	// carrier the one the links' health says carries them (carryLocked).
	using, carrier string
	// quicGraceUntil: a QUIC connection that was up went silent and the TCP
	// connection came up meanwhile; until then new tunnels wait for QUIC
	// rather than go over TCP (see choose).
	quicGraceUntil time.Time
}

// tcpSlot is one TCP link's current session (sess, tcp: nil when none,
// guarded by fallback.mu) and its server's answer to our hello.
type tcpSlot struct {
	sess *session
	tcp  *tcpmux.Conn
	// confirmed: the server accepted our hello on the current session;
	// authRefused: it refused our credentials there (Client.Ready).
	confirmed   atomic.Bool
	authRefused atomic.Bool
}

// liveLocked reports whether the slot has a session whose connection has
// not ended.
func (s *tcpSlot) liveLocked() bool { return s.sess != nil && s.sess.Conn.Context().Err() == nil }

func newFallback(c *Client, mode, addr string, delay time.Duration) *fallback {
	if mode == "" {
		mode = TransportAuto
	}
	if delay <= 0 {
		delay = DefaultFallbackDelay
	}
	n := 1
	if c != nil && mode == TransportTCP {
		n = len(c.servers)
	}
	f := &fallback{c: c, mode: mode, addr: addr, delay: delay, wake: make(chan struct{}, 1), slots: make([]*tcpSlot, n),
		up: map[any]bool{}, suspect: map[any]bool{}, refused: map[any]bool{}, pending: map[any]rxCounter{}}
	for i := range f.slots {
		f.slots[i] = &tcpSlot{}
	}
	if c != nil {
		f.heartbeat, f.answering = c.cfg.HeartbeatInterval, c.sessionsChanged
	}
	return f
}

// rxCounter counts the packets a connection received (a *quic.Conn's
// ConnectionStats().PacketsReceived).
type rxCounter interface{ PacketsReceived() uint64 }

func (f *fallback) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// quicDialing: a supervisor starts a QUIC dial.
func (f *fallback) quicDialing() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.anyUpLocked() && f.downSince.IsZero() {
		f.downSince = time.Now()
		f.signalLocked()
	}
}

// quicAway: a QUIC connection's server said it shuts down and asked the
// client to wait until until before it reconnects: no TCP meanwhile (the
// server restarts, UDP is not blocked), and the fallback delay counts from
// then.
func (f *fallback) quicAway(until time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.downSince.Before(until) {
		f.downSince = until
	}
	f.signalLocked()
}

// quicPending: QUIC connection k is in its handshake, and rx counts what
// it received (quicUsable ends that).
func (f *fallback) quicPending(k any, rx rxCounter) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending[k] = rx
}

// quicUsable: QUIC connection k completed its handshake (up), or ended.
func (f *fallback) quicUsable(k any, up bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pending, k)
	if up {
		f.up[k] = true
	} else {
		delete(f.up, k)
	}
	delete(f.suspect, k)
	if f.usableLocked() {
		f.downSince = time.Time{}
		if !f.anyTCPLocked() {
			f.carryLocked(TransportQUIC)
		}
	} else if f.downSince.IsZero() {
		f.downSince = time.Now()
	}
	f.signalLocked()
}

// quicSuspect: nothing came back on QUIC connection k's path for the
// rescue delay, not even a packet, or no heartbeat echo for
// suspectLateEchoes (true); or it answers again (false), which wakes the
// new tunnels waiting for it (choose).
func (f *fallback) quicSuspect(k any, s bool) {
	f.mu.Lock()
	changed := f.suspect[k] != s
	if changed {
		if s {
			f.suspect[k] = true
		} else {
			delete(f.suspect, k)
		}
		f.signalLocked()
	}
	f.mu.Unlock()
	if changed && !s && f.answering != nil {
		f.answering()
	}
}

// quicRefused: QUIC connection k's server refused our credentials (true),
// or its last attempt ended otherwise (false).
func (f *fallback) quicRefused(k any, r bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refused[k] == r {
		return
	}
	if r {
		f.refused[k] = true
	} else {
		delete(f.refused, k)
	}
	f.signalLocked()
}

// anyUpLocked: a QUIC connection has completed its handshake and not ended.
func (f *fallback) anyUpLocked() bool { return len(f.up) > 0 }

// usableLocked: a QUIC connection is up and its path answers.
func (f *fallback) usableLocked() bool {
	for k := range f.up {
		if !f.suspect[k] {
			return true
		}
	}
	return false
}

func (f *fallback) signalLocked() { f.signal() }

// wantedLocked reports whether a TCP connection should be kept, and if not
// yet, when to look again (zero: at the next change).
func (f *fallback) wantedLocked(now time.Time) (bool, time.Time) {
	switch f.mode {
	case TransportTCP:
		return true, time.Time{}
	case TransportQUIC:
		return false, time.Time{}
	}
	if f.usableLocked() || len(f.refused) > 0 {
		return false, time.Time{} // QUIC works, or reaches a server that refuses our credentials
	}
	if f.anyUpLocked() { // up, but every path has gone silent
		return true, time.Time{}
	}
	if f.downSince.IsZero() {
		return false, time.Time{}
	}
	if at := f.downSince.Add(f.delay); now.Before(at) {
		return false, at
	}
	if now.Before(f.downSince.Add(f.delay + answeringGrace)) {
		for _, rx := range f.pending {
			if rx.PacketsReceived() > 0 {
				return false, now.Add(answeringPoll) // UDP gets through: the server is slow
			}
		}
	}
	return true, time.Time{}
}

// active reports whether new tunnels go over TCP now.
func (f *fallback) active() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.anyTCPLocked() && f.mode == TransportAuto
}

// anyTCPLocked reports whether a TCP session is there.
func (f *fallback) anyTCPLocked() bool {
	for _, s := range f.slots {
		if s.sess != nil {
			return true
		}
	}
	return false
}

// ready reports whether a TCP session is up whose server did not refuse
// our credentials and, with a secret (confirmedNeeded), accepted our hello.
func (f *fallback) ready(confirmedNeeded bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.slots {
		if s.sess != nil && !s.authRefused.Load() && (!confirmedNeeded || s.confirmed.Load()) {
			return true
		}
	}
	return false
}

// tcpLocked is the TCP session a new tunnel goes on (nil: none live): with
// one slot its session; with one per server (--transport tcp), as QUIC's
// links are placed: failover, the first server's in order; spread, the
// one with the fewest streams.
func (f *fallback) tcpLocked() *session {
	var best *tcpSlot
	for _, s := range f.slots {
		if !s.liveLocked() {
			continue
		}
		if best == nil || (f.c != nil && f.c.cfg.Mode == ModeSpread && s.tcp != nil && best.tcp != nil &&
			s.tcp.NumStreams() < best.tcp.NumStreams()) {
			best = s
		}
		if f.c == nil || f.c.cfg.Mode != ModeSpread {
			break
		}
	}
	if best == nil {
		return nil
	}
	return best.sess
}

// carrying is the transport the links' health says carries new tunnels
// ("" before any link came up; see carryLocked).
func (f *fallback) carrying() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.carrier
}

// conns are the TCP sessions' connections.
func (f *fallback) conns() []*tcpmux.Conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*tcpmux.Conn
	for _, s := range f.slots {
		if s.tcp != nil {
			out = append(out, s.tcp)
		}
	}
	return out
}

// anyTCP reports whether a TCP session is there.
func (f *fallback) anyTCP() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.anyTCPLocked()
}

// choose returns the session a new tunnel goes on: QUIC's (cur) while it
// works, else the TCP one, else QUIC's (a handshake in progress); nil if
// there is none, or if the tunnel should wait for QUIC until retry (nonzero):
// when the TCP connection came up while a QUIC connection that was up had
// merely gone silent, the link is back (TCP got through) and QUIC answers
// within a heartbeat or a rescue probe unless UDP is blocked, so for
// quicGrace new tunnels wait for QUIC rather than start on TCP, where
// they would stay, at TCP's mercy in the next blackout. It logs each change
// of transport at -v 0.
func (f *fallback) choose(cur *session, now time.Time) (s *session, retry time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tcp := f.tcpLocked()
	quicOK := cur != nil && cur.Conn.Context().Err() == nil
	switch f.pickLocked(quicOK, tcp != nil, now) {
	case TransportQUIC:
		s = cur
	case TransportTCP:
		s = tcp
	case "":
		if quicOK && tcp != nil {
			return nil, f.quicGraceUntil
		}
		return nil, time.Time{}
	}
	f.useLocked(s.Transport())
	return s, time.Time{}
}

// pickLocked is choose's decision, given whether the QUIC and TCP
// sessions are there: the transport, or "" for none yet.
func (f *fallback) pickLocked(quicOK, tcpOK bool, now time.Time) string {
	switch {
	case quicOK && (!tcpOK || f.usableLocked()):
		return TransportQUIC
	case tcpOK && quicOK && f.anyUpLocked() && now.Before(f.quicGraceUntil):
		return "" // wait for QUIC
	case tcpOK:
		return TransportTCP
	case quicOK:
		return TransportQUIC
	}
	return ""
}

// quicGrace is how long new tunnels wait for a silent QUIC connection
// once the TCP connection is up (took: its TCP and TLS handshake, about
// two round trips): two heartbeat intervals (a heartbeat and a rescue
// probe go out each) and that handshake's time for the echo, at least
// minQUICGrace.
func (f *fallback) quicGrace(took time.Duration) time.Duration {
	return max(2*f.heartbeat+took, minQUICGrace)
}

// minQUICGrace is quicGrace's floor.
const minQUICGrace = 300 * time.Millisecond

// useLocked records the transport a new tunnel went on (-v 2).
func (f *fallback) useLocked(transport string) {
	if f.using == transport {
		return
	}
	f.using = transport
	if f.c != nil {
		f.c.logger.V(2).Info("A new tunnel goes over "+transport, "address", f.addr)
	}
}

// carryLocked records which transport carries new tunnels by the health
// of the links, not by where the last tunnel went: TCP as soon as its
// connection is up, QUIC as soon as a QUIC connection is usable with no
// TCP one (or the TCP one is no longer wanted). It sets the transport
// gauge and says each change at -v 0.
func (f *fallback) carryLocked(transport string) {
	if f.carrier == transport || f.c == nil {
		return
	}
	prev := f.carrier
	f.carrier = transport
	m := f.c.cfg.Metrics
	m.Transport.WithLabelValues(TransportQUIC).Set(boolGauge(transport == TransportQUIC))
	m.Transport.WithLabelValues(TransportTCP).Set(boolGauge(transport == TransportTCP))
	switch {
	case transport == TransportTCP && f.mode == TransportTCP:
		f.c.logger.Info("Tunnels go over TCP (--transport tcp)", "address", f.addr)
	case transport == TransportTCP:
		f.c.logger.Info("New tunnels go over TCP: QUIC does not get through (UDP blocked?); UDP is tried again in the background",
			"address", f.addr)
	case prev == TransportTCP:
		f.c.logger.Info("New tunnels go over QUIC again; those opened over TCP finish there")
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// setSession replaces the TCP session and wakes ingress's waiters; a new
// one that took took to connect holds new tunnels back for a silent QUIC
// connection for quicGrace(took) (choose).
func (f *fallback) setSession(slot *tcpSlot, s *session, tcp *tcpmux.Conn, took time.Duration, addr ...string) {
	f.mu.Lock()
	slot.sess, slot.tcp = s, tcp
	if len(addr) > 0 {
		f.addr = addr[0]
	}
	if s != nil {
		f.carryLocked(TransportTCP)
	} else if f.usableLocked() && !f.anyTCPLocked() {
		f.carryLocked(TransportQUIC)
	}
	slot.confirmed.Store(false)
	f.quicGraceUntil = time.Time{}
	if s != nil && f.mode == TransportAuto {
		f.quicGraceUntil = time.Now().Add(f.quicGrace(took))
	}
	f.mu.Unlock()
	f.c.sessionsChanged()
}

// run keeps the TCP connection while it is wanted, until ctx ends.
func (f *fallback) run(ctx context.Context) {
	if f.mode == TransportQUIC {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, slot := range f.slots {
		t := &tcpLink{f: f, slot: slot, logger: klog.FromContext(ctx), stopReverse: func() {},
			bo:     &backoff.Backoff{Initial: 100 * time.Millisecond, Max: 10 * time.Second, Multiplier: 2, Clock: backoff.RealClock()},
			authBo: authBackoff(f.c.cfg.Backoff), target: i, fixed: len(f.slots) > 1}
		wg.Go(func() { t.run(ctx) })
	}
}

// run keeps t's TCP connection while it is wanted, until ctx ends.
func (t *tcpLink) run(ctx context.Context) {
	f := t.f
	defer t.hellos.Wait()
	defer t.close()
	for ctx.Err() == nil {
		f.mu.Lock()
		wanted, at := f.wantedLocked(time.Now())
		f.mu.Unlock()
		switch {
		case t.conn != nil && t.conn.Context().Err() != nil:
			t.lost(ctx)
		case wanted && t.conn == nil:
			t.connect(ctx)
		default:
			t.idle(ctx, wanted, at)
		}
	}
}

// tcpLink is the fallback's TCP connection, one step per event: connect
// (dial, hello, reverse forwards), lost (log, backoff), idle (wait for a
// change; close the connection once no longer wanted and unused). It
// dials the servers in turn: a failed dial moves to the next one, so with
// several servers a dead one is passed over (TCP for every server).
type tcpLink struct {
	f      *fallback
	logger klog.Logger
	// bo paces dials that fail and connections that end at once; authBo
	// those the server refused our credentials on.
	bo, authBo *backoff.Backoff
	// slot is where its session is published (fallback.slots).
	slot *tcpSlot
	// target is the index of the server dialed next (Client.servers);
	// fixed: always that one (a link per server, --transport tcp).
	target int
	fixed  bool
	conn   *tcpmux.Conn
	// srv is conn's server, upSince when it came up.
	srv     *server
	upSince time.Time
	// unwanted is when the connection stopped being wanted (zero:
	// wanted): it is closed once no tunnel uses it, a second later at the
	// earliest, so a tunnel that chose it just before is not cut.
	unwanted time.Time
	// lastRejected is the refused certificate last logged at -v 0 (it
	// does not go away by itself); lostLoggedAt when a loss last was.
	lastRejected string
	lostLoggedAt time.Time
	// stopReverse ends the reverse forwards bound over TCP (their bind
	// streams would keep an unwanted connection open).
	stopReverse context.CancelFunc
	hellos      sync.WaitGroup
}

// close ends the connection on shutdown.
func (t *tcpLink) close() {
	t.stopReverse()
	if t.conn != nil {
		_ = t.conn.CloseWithError(proto.CodeShutdown.ApplicationErrorCode(), "client shutting down")
		t.f.setSession(t.slot, nil, nil, 0)
	}
}

// connect dials the target server; on success the connection carries new
// tunnels at once (its hello and reverse forwards run beside it).
func (t *tcpLink) connect(ctx context.Context) {
	f, c := t.f, t.f.c
	srv := c.servers[t.target%len(c.servers)]
	addr := f.addrOf(srv)
	dialed := time.Now()
	conn, err := f.dial(ctx, srv, addr)
	if err != nil {
		if ctx.Err() == nil {
			t.dialFailed(ctx, srv, addr, err)
		}
		return
	}
	c.cfg.Metrics.TCPDialsTotal.WithLabelValues("ok").Inc()
	t.bo.Success(time.Now())
	t.conn, t.srv, t.upSince, t.unwanted = conn, srv, time.Now(), time.Time{}
	s := &session{Conn: ingress.OverTCP(conn), Flows: udpflow.NewTable(c.cfg.Metrics.UDP.Drop)}
	t.logger.V(2).Info("Connected to server over TCP", "address", addr, "localAddress", conn.LocalAddr().String(),
		"resumed", conn.TLS().DidResume, "handshakeDuration", time.Since(dialed))
	t.slot.authRefused.Store(false)
	f.setSession(t.slot, s, conn, time.Since(dialed), addr) // before the hello: it clears what the hello confirms
	t.hellos.Go(func() { c.helloTCP(ctx, s, t.slot) })
	rctx, stop := context.WithCancel(ctx)
	t.stopReverse = stop
	t.hellos.Go(func() { c.reverseOn(rctx, s, conn, srv) })
}

// dialFailed counts and logs a failed dial, moves to the next server and
// waits for the next attempt.
func (t *tcpLink) dialFailed(ctx context.Context, srv *server, addr string, err error) {
	m := t.f.c.cfg.Metrics
	if certRejected(err) {
		m.TCPDialsTotal.WithLabelValues("cert_rejected").Inc()
		if msg := err.Error(); msg != t.lastRejected {
			t.lastRejected = msg
			t.logger.Error(err, "Could not connect to server over TCP; retrying", "address", addr,
				"presentedFingerprint", presentedFingerprint(err), "fix", DialErrorFix(srv.addr, err))
		}
	} else {
		m.TCPDialsTotal.WithLabelValues("error").Inc()
	}
	t.logger.V(2).Info("Could not connect to server over TCP", "address", addr, "err", err)
	if !t.fixed {
		t.target++
	}
	_ = t.bo.Wait(ctx)
}

// lost handles the end of the connection: a refusal of our credentials
// is said once (as over QUIC) and waits authBackoff; a connection that
// ended at once waits the backoff; another is redialed at once (after the
// spread a server shutting down asked for).
func (t *tcpLink) lost(ctx context.Context) {
	f, c := t.f, t.f.c
	cause := context.Cause(t.conn.Context())
	_ = t.conn.CloseWithError(0, "")
	t.conn = nil
	t.stopReverse()
	f.setSession(t.slot, nil, nil, 0)
	addr := f.addrOf(t.srv)
	code, remote := proto.FromError(cause)
	if (remote && code == proto.CodeAuthFailed) || t.slot.authRefused.Load() {
		t.srv.authRefused.Store(true)
		if c.refusedBefore(cause.Error()) {
			t.logger.V(2).Info("Server rejected our credentials again over TCP", "address", addr, "err", cause)
		} else {
			t.logger.Error(cause, "Server rejected our credentials; check --secret-file or the client certificate", "address", addr,
				"fix", authFix)
		}
		t.authBo.Failure(time.Now())
		_ = t.authBo.Wait(ctx)
		return
	}
	t.authBo.Reset()
	wait := reconnectWait(cause) // as over QUIC
	if now := time.Now(); t.lostLoggedAt.IsZero() || now.Sub(t.lostLoggedAt) >= lostLogInterval {
		t.lostLoggedAt = now
		t.logger.Info("Lost TCP connection to server", "address", addr, "err", cause, "reconnectIn", wait.Round(time.Millisecond))
	} else {
		t.logger.V(2).Info("Lost TCP connection to server", "address", addr, "err", cause, "reconnectIn", wait.Round(time.Millisecond))
	}
	switch {
	case wait > 0:
		sleep(ctx, wait)
	case time.Since(t.upSince) < shortConnection:
		t.bo.Failure(time.Now())
		_ = t.bo.Wait(ctx)
	}
}

// idle waits for a change of what is wanted (or the time at), and closes a
// connection no longer wanted once no tunnel uses it.
func (t *tcpLink) idle(ctx context.Context, wanted bool, at time.Time) {
	f := t.f
	if wanted || t.conn == nil {
		t.unwanted = time.Time{}
	} else if t.unwanted.IsZero() {
		t.unwanted = time.Now()
		t.stopReverse()
		f.mu.Lock()
		f.carryLocked(TransportQUIC) // QUIC works again
		f.mu.Unlock()
	}
	var timer *time.Timer
	switch {
	case !wanted && t.conn != nil:
		if t.conn.NumStreams() == 0 && time.Since(t.unwanted) >= time.Second {
			t.logger.V(2).Info("Closed TCP connection to server: QUIC carries new tunnels", "address", f.addrOf(t.srv))
			_ = t.conn.CloseWithError(proto.CodeOK.ApplicationErrorCode(), "back on QUIC")
			t.conn = nil
			if !t.fixed {
				t.target = 0 // the next fallback starts with the first server again
			}
			f.setSession(t.slot, nil, nil, 0)
			return
		}
		timer = time.NewTimer(time.Second) // its tunnels finish there
	case !at.IsZero():
		timer = time.NewTimer(time.Until(at))
	}
	var poll <-chan time.Time
	if timer != nil {
		defer timer.Stop()
		poll = timer.C
	}
	var closed <-chan struct{}
	if t.conn != nil {
		closed = t.conn.Context().Done()
	}
	select {
	case <-ctx.Done():
	case <-f.wake:
	case <-poll:
	case <-closed:
	}
}

// authFix is what to do when the server refuses our credentials.
const authFix = "give --secret-file the same secret as the server's --secret-file (or a certificate its --client-ca-file accepts)"

// addrOf is the TCP address of server s: its Config.TCPServers entry,
// Config.TCPServerAddr for the first server, else its QUIC host:port.
func (f *fallback) addrOf(s *server) string {
	cfg := f.c.cfg
	if a := cfg.TCPServers[s.addr]; a != "" {
		return a
	}
	if s.idx == 0 && cfg.TCPServerAddr != "" {
		return cfg.TCPServerAddr
	}
	return s.addr
}

// dial connects to s at addr over TCP with s's TLS configuration (the
// same pins or CAs as its QUIC dials, tcpTLS).
func (f *fallback) dial(ctx context.Context, s *server, addr string) (*tcpmux.Conn, error) {
	c := f.c
	timeout := 10 * time.Second
	var cfg tcpmux.Config
	if q := c.cfg.QUIC; q != nil {
		cfg.IdleTimeout = q.MaxIdleTimeout
		if q.KeepAlivePeriod > 0 {
			cfg.KeepAlivePeriod = q.KeepAlivePeriod
		}
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return tcpmux.Dial(dctx, addr, c.tcpTLS(s), &cfg)
}

// tcpTLS is the TLS configuration of a TCP dial to s: s's, and, with
// several servers and no name in it, s's host as the name verified (a CA,
// --ca-file), as its QUIC dials have it (tlsFor). Without it crypto/tls
// refuses to verify a chain (no ServerName) and the fallback never
// connects.
//
// Its session tickets are kept apart from the QUIC connections' (one
// in-memory cache for TCP, keyed per server), so a TCP reconnect resumes:
// one round trip less, and no certificate chain to send and verify.
func (c *Client) tcpTLS(s *server) *tls.Config {
	conf := c.serverTLS(s)
	tc := withServerName(conf, s, len(c.servers) > 1)
	if tc == conf {
		tc = conf.Clone()
	}
	tc.ClientSessionCache = prefixedCache{c.tcpTickets, "tcp|" + s.label + "|"}
	return tc
}

// withServerName is conf, or, when several servers share it and it names
// none, a copy naming s's host.
func withServerName(conf *tls.Config, s *server, several bool) *tls.Config {
	if !several || conf.ServerName != "" {
		return conf
	}
	conf = conf.Clone()
	conf.ServerName = s.host
	return conf
}

// helloTCP is hello for a TCP session (see hello.go); slot records the
// answer.
func (c *Client) helloTCP(ctx context.Context, sess *session, slot *tcpSlot) {
	secret := *c.secret.Load()
	if len(secret) == 0 {
		return
	}
	h, err := proto.NewHello(time.Now())
	if err != nil {
		return
	}
	hctx, cancel := context.WithTimeout(sess.Conn.Context(), helloTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	str, err := sess.Conn.OpenStreamSync(hctx)
	if err == nil {
		err = askOn(hctx, str, h, secret)
	}
	code, remote := proto.FromError(err)
	switch {
	case err == nil, remote && code != proto.CodeAuthFailed && code != proto.CodeOverloaded:
		slot.authRefused.Store(false)
		slot.confirmed.Store(true)
	case remote && code == proto.CodeAuthFailed:
		slot.authRefused.Store(true)
	default:
		klog.FromContext(ctx).V(2).Info("Server did not answer our hello over TCP", "err", err)
	}
}

// askOn sends h on str, a new stream, and returns the server's answer: nil
// for CodeOK, a *proto.RemoteError or the transport's error otherwise.
func askOn(ctx context.Context, str ingress.Stream, h *proto.Header, secret []byte) error {
	b, err := h.Append(nil, secret)
	if err != nil {
		str.CancelWrite(proto.CodeOK.StreamErrorCode())
		str.CancelRead(proto.CodeOK.StreamErrorCode())
		return err
	}
	// Ends its stream either way, so its credit returns to the server.
	defer str.CancelRead(proto.CodeOK.StreamErrorCode())
	if _, err := str.Write(b); err != nil {
		str.CancelWrite(proto.CodeOK.StreamErrorCode())
		return err
	}
	_ = str.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = str.SetReadDeadline(deadline)
	}
	if err := proto.ReadReply(str); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(str, 1)) // the server's FIN
	return nil
}

// errNoTransport is returned when --transport names none of the three.
var errNoTransport = errors.New("client: transport must be auto, quic or tcp")
