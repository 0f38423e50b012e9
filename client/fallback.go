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

// answeringPoll is how often a TCP row looks again at a handshake the
// server answers, within answeringGrace.
const answeringPoll = 250 * time.Millisecond

// tcpRow is a server's TCP link in the client's link table (server.tcp),
// beside its QUIC links (server.members): its current session (sess, tcp:
// nil when none) and the server's answer to our hello. Its loop (tcpLink)
// writes it; placement (pick) and the carrier read it. sess, tcp,
// graceUntil and unwanted are guarded by Client.mu.
type tcpRow struct {
	sess *session
	tcp  *tcpmux.Conn
	// graceUntil: the connection came up while a QUIC link that was up had
	// gone silent; until then new tunnels wait for QUIC rather than go
	// over TCP (pick).
	graceUntil time.Time
	// unwanted: its server's QUIC answers again; the connection carries no
	// new tunnel and is closed once its last one ends.
	unwanted bool
	// dialing: a dial is in progress; tried: a dial has ended, either way
	// (pickTCPLocked).
	dialing, tried bool
	// placed: Client.placements when a tunnel last went on it (spread:
	// of rows with as many streams, the one placed on longest ago takes the
	// next; pickTCPLocked).
	placed uint64
	// upAt: when sess came up; lastBad: when the row last lost its
	// session or failed a dial (zero: never). Failover's hysteresis
	// (failoverTCPLocked).
	upAt, lastBad time.Time
	// confirmed: the server accepted our hello on the current session;
	// authRefused: it refused our credentials there (Client.Ready).
	confirmed   atomic.Bool
	authRefused atomic.Bool
}

// liveLocked reports whether the row has a session whose connection has
// not ended and that may take new tunnels.
func (r *tcpRow) liveLocked() bool {
	return r != nil && r.sess != nil && !r.unwanted && r.sess.Conn.Context().Err() == nil
}

// answers reports whether l is up (its handshake done, not ended) and its
// path answers (not suspect).
func (l *link) answers() bool { return l.live() && l.readyAt.Load() != 0 && !l.suspect.Load() }

// packetsReceived is how many packets l's connection received (0 for a
// link of the steering tests, which has no quicConn).
func (l *link) packetsReceived() uint64 {
	if l.conn == nil {
		return 0
	}
	return l.conn.ConnectionStats().PacketsReceived
}

// quicState is what the table says of s's QUIC links for its TCP row:
// answers (one is up and its path answers), up (one is up), refused (a
// member's last attempt was refused our credentials), since (when QUIC
// stopped being usable, or a server shutting down asked us to wait
// until), rx (a handshake in progress received packets).
type quicState struct {
	answers, up, refused, rx bool
	since                    time.Time
}

// quicStateLocked reads s's QUIC rows. Callers hold c.mu.
func quicStateLocked(s *server) quicState {
	var q quicState
	for _, m := range s.members {
		l := m.cur
		q.refused = q.refused || m.refused
		if m.downSince.After(q.since) {
			q.since = m.downSince
		}
		switch {
		case l.answers():
			q.answers, q.up = true, true
		case l.live() && l.readyAt.Load() != 0:
			q.up = true
		case l.live() && l.packetsReceived() > 0:
			q.rx = true // in its handshake, and the server answers
		}
	}
	return q
}

// tcpWantedLocked reports whether s's TCP row should hold a connection,
// and if not yet, when to look again (zero: at the next change): with
// --transport tcp always, with quic never; in auto mode while no QUIC link
// to s answers: at once when one that was up went silent, else once QUIC
// has been down for the fallback delay (answeringGrace more while a
// handshake the server answers is in progress); never while s refused our
// credentials over QUIC (UDP gets through, TCP would be refused too).
func (c *Client) tcpWantedLocked(s *server, now time.Time) (bool, time.Time) {
	switch c.cfg.Transport {
	case TransportTCP:
		return true, time.Time{}
	case TransportQUIC:
		return false, time.Time{}
	}
	q := quicStateLocked(s)
	switch {
	case q.answers || q.refused:
		return false, time.Time{}
	case q.up: // up, but every path has gone silent
		return true, time.Time{}
	case q.since.IsZero():
		return false, time.Time{}
	}
	delay := c.cfg.FallbackDelay
	if delay <= 0 {
		delay = DefaultFallbackDelay
	}
	if at := q.since.Add(delay); now.Before(at) {
		return false, at
	}
	if q.rx && now.Before(q.since.Add(delay+answeringGrace)) {
		return false, now.Add(answeringPoll) // UDP gets through: the server is slow
	}
	return true, time.Time{}
}

// pickTCPLocked is the TCP row a new tunnel may go on (nil: none live):
// spread, the one with the fewest streams; failover, the active row
// (failoverTCPLocked). In failover mode a server's first dial holds the
// servers after it back (nil) until it has an outcome, so that the
// tunnels of a client that starts with UDP blocked go to the first
// server, not to whichever TCP handshake happened to finish first (as
// steerLocked waits over QUIC).
func (c *Client) pickTCPLocked(now time.Time) *tcpRow {
	if c.cfg.Mode != ModeSpread {
		return c.failoverTCPLocked(now)
	}
	var best *tcpRow
	for _, s := range c.servers {
		r := s.tcp
		if !r.liveLocked() {
			continue
		}
		if best == nil || r.tcp != nil && best.tcp != nil && fewerStreams(r, best) {
			best = r
		}
	}
	return best
}

// fewerStreams reports whether a new tunnel should go on r rather than on
// best in spread mode: fewer streams, or as many and placed on less
// recently. Callers hold c.mu.
func fewerStreams(r, best *tcpRow) bool {
	a, b := r.tcp.NumStreams(), best.tcp.NumStreams()
	return a < b || a == b && r.placed < best.placed
}

// failoverTCPLocked is failover mode's TCP row, by steer's rule over the
// TCP rows (its moves counted and logged as steer's, moved; it runs on
// placement over TCP, at scrape and, while TCP carries, in each TCP
// row's loop at every table change and at the failback moment,
// tcpRoleLocked, so the role follows health): the active row
// (c.tcpActive) while it is live; when it is not, the first live row in
// order; a row earlier in order takes the role
// back only once it has been up for FailbackAfter since it was last lost
// or failed a dial (hysteresis: a server that comes and goes does not
// make the tunnels flap), at once if it never was.
func (c *Client) failoverTCPLocked(now time.Time) *tcpRow {
	cur := c.tcpActive
	curOK := cur != nil && cur.tcp.liveLocked()
	for _, s := range c.servers {
		r := s.tcp
		if !r.liveLocked() {
			if r != nil && r.dialing && !r.tried {
				return nil
			}
			continue
		}
		if curOK && s != cur && now.Sub(r.stableSince()) < c.cfg.FailbackAfter {
			return cur.tcp // s earlier in order, not up for long enough
		}
		if s != cur {
			c.tcpActive = s
			c.moved(s, cur, curOK, TransportTCP)
		}
		return r
	}
	return nil
}

// tcpRoleLocked moves the TCP rows' role by their health while TCP
// carries new tunnels in failover mode (failoverTCPLocked), and returns
// when s's row, up and earlier in order than the role's, will have been
// up for FailbackAfter (zero: no such moment), so that s's loop looks
// again then and the failback follows health, not the next tunnel.
func (c *Client) tcpRoleLocked(s *server, now time.Time) time.Time {
	if c.carrier != TransportTCP || c.cfg.Mode == ModeSpread {
		return time.Time{}
	}
	c.failoverTCPLocked(now)
	cur := c.tcpActive
	if cur == nil || s.idx >= cur.idx || !s.tcp.liveLocked() {
		return time.Time{}
	}
	if at := s.tcp.stableSince().Add(c.cfg.FailbackAfter); at.After(now) {
		return at
	}
	return time.Time{}
}

// stableSince is when the row's session came up after its last loss or
// failed dial (zero: it never had one).
func (r *tcpRow) stableSince() time.Time {
	if r.lastBad.IsZero() {
		return time.Time{}
	}
	return r.upAt
}

// anyQUICUpLocked reports whether a QUIC link is up (handshake done, not
// ended).
func (c *Client) anyQUICUpLocked() bool {
	for _, m := range c.members {
		if m.cur.live() && m.cur.readyAt.Load() != 0 {
			return true
		}
	}
	return false
}

// anyTCPLocked reports whether a TCP row has a session.
func (c *Client) anyTCPLocked() bool {
	for _, s := range c.servers {
		if s.tcp != nil && s.tcp.sess != nil {
			return true
		}
	}
	return false
}

// tcpRows are the servers' TCP rows (none with --transport quic).
func (c *Client) tcpRows() []*tcpRow {
	var out []*tcpRow
	for _, s := range c.servers {
		if s.tcp != nil {
			out = append(out, s.tcp)
		}
	}
	return out
}

// tcpReady reports whether a TCP session is up whose server did not refuse
// our credentials and, with a secret (confirmedNeeded), accepted our hello.
func (c *Client) tcpReady(confirmedNeeded bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.tcpRows() {
		if r.sess != nil && !r.authRefused.Load() && (!confirmedNeeded || r.confirmed.Load()) {
			return true
		}
	}
	return false
}

// tcpConns are the TCP rows' connections.
func (c *Client) tcpConns() []*tcpmux.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tcpmux.Conn
	for _, r := range c.tcpRows() {
		if r.tcp != nil {
			out = append(out, r.tcp)
		}
	}
	return out
}

// overTCP reports whether new tunnels go over TCP while QUIC does not get
// through (auto mode; the links' health, carryLocked).
func (c *Client) overTCP() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.carrier == TransportTCP && c.cfg.Transport == TransportAuto
}

// quicGrace is how long new tunnels wait for a silent QUIC connection
// once a TCP connection is up (took: its TCP and TLS handshake, about
// two round trips): two heartbeat intervals (a heartbeat and a rescue
// probe go out each) and that handshake's time for the echo, at least
// minQUICGrace.
func quicGrace(heartbeat, took time.Duration) time.Duration {
	return max(2*heartbeat+took, minQUICGrace)
}

// minQUICGrace is quicGrace's floor.
const minQUICGrace = 300 * time.Millisecond

// useLocked records the transport a new tunnel went on (-v 2).
func (c *Client) useLocked(transport string) {
	if c.using == transport {
		return
	}
	c.using = transport
	c.logger.V(2).Info("A new tunnel goes over " + transport)
}

// carryLocked records which transport carries new tunnels by the health
// of the links, not by where the last tunnel went: QUIC while a QUIC link
// answers, else TCP while a TCP row is live. It sets the transport gauge
// and says each change at -v 0. Callers hold c.mu.
func (c *Client) carryLocked() {
	transport, addr := "", ""
	for _, s := range c.servers {
		if transport == "" && s.tcp.liveLocked() {
			transport, addr = TransportTCP, c.tcpAddrOf(s)
		}
	}
	for _, m := range c.members {
		if m.cur.answers() {
			transport = TransportQUIC
		}
	}
	if transport == "" || c.carrier == transport {
		return
	}
	prev := c.carrier
	c.carrier = transport
	m := c.cfg.Metrics
	m.Transport.WithLabelValues(TransportQUIC).Set(boolGauge(transport == TransportQUIC))
	m.Transport.WithLabelValues(TransportTCP).Set(boolGauge(transport == TransportTCP))
	switch {
	case transport == TransportTCP && c.cfg.Transport == TransportTCP:
		c.logger.Info("Tunnels go over TCP (--transport tcp)", "address", addr)
	case transport == TransportTCP:
		c.logger.Info("New tunnels go over TCP: QUIC does not get through (UDP blocked?); UDP is tried again in the background",
			"address", addr)
	case prev == TransportTCP:
		c.logger.Info("New tunnels go over QUIC again; those opened over TCP finish there")
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// setTCP makes s the session of t's row (nil: none) and wakes the table's
// waiters; a new one that took took to connect holds new tunnels back
// for a silent QUIC link for quicGrace (pick).
func (t *tcpLink) setTCP(s *session, conn *tcpmux.Conn, took time.Duration) {
	c, r := t.c, t.srv.tcp
	c.mu.Lock()
	if s != nil {
		r.upAt = time.Now()
	}
	r.sess, r.tcp, r.unwanted, r.graceUntil = s, conn, false, time.Time{}
	r.confirmed.Store(false)
	if s != nil && c.cfg.Transport == TransportAuto {
		r.graceUntil = time.Now().Add(quicGrace(c.cfg.HeartbeatInterval, took))
	}
	c.mu.Unlock()
	c.sessionsChanged()
}

// runTCP runs a TCP link per server, each keeping its row's connection
// while it is wanted (tcpWantedLocked), until ctx ends.
func (c *Client) runTCP(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, srv := range c.servers {
		if srv.tcp == nil {
			continue
		}
		t := &tcpLink{c: c, srv: srv, dialer: c.tcpDialer, logger: klog.FromContext(ctx), stopReverse: func() {},
			bo:     &backoff.Backoff{Initial: 100 * time.Millisecond, Max: 10 * time.Second, Multiplier: 2, Clock: backoff.RealClock()},
			authBo: authBackoff(c.cfg.Backoff)}
		if len(c.servers) > 1 {
			t.logger = klog.LoggerWithValues(t.logger, "server", srv.label)
		}
		wg.Go(func() { t.run(ctx) })
	}
}

// run keeps t's TCP connection while it is wanted, until ctx ends.
func (t *tcpLink) run(ctx context.Context) {
	c := t.c
	defer t.hellos.Wait()
	defer t.close()
	for ctx.Err() == nil {
		c.mu.Lock()
		now := time.Now()
		wanted, at := c.tcpWantedLocked(t.srv, now)
		if fb := c.tcpRoleLocked(t.srv, now); !fb.IsZero() && (at.IsZero() || fb.Before(at)) {
			at = fb
		}
		changed := c.changed
		c.mu.Unlock()
		switch {
		case t.conn != nil && t.conn.Context().Err() != nil:
			t.lost(ctx)
		case wanted && t.conn == nil:
			t.connect(ctx)
		default:
			t.idle(ctx, wanted, at, changed)
		}
	}
}

// tcpLink is the loop of one server's TCP row, one step per event:
// connect (dial, hello, reverse forwards), lost (log, backoff), idle (wait
// for a change of the table; close the connection once no longer wanted
// and unused).
type tcpLink struct {
	c      *Client
	srv    *server
	logger klog.Logger
	// bo paces dials that fail and connections that end at once; authBo
	// those the server refused our credentials on.
	bo, authBo *backoff.Backoff
	// dialer connects (nil: tcpmux over TLS, Client.dialTCP;
	// Client.tcpDialer in tests).
	dialer tcpDialer
	conn   ingress.Conn
	raw    *tcpmux.Conn // conn's tcpmux connection (nil on a fake)
	// upSince is when conn came up; unwanted when it stopped being wanted
	// (zero: wanted): it is closed once no tunnel uses it, a second later
	// at the earliest, so a tunnel that chose it just before is not cut.
	upSince, unwanted time.Time
	// lastRejected is the refused certificate last logged at -v 0 (it
	// does not go away by itself); lostLoggedAt when a loss last was.
	lastRejected string
	lostLoggedAt time.Time
	// stopReverse ends the reverse forwards bound over TCP (their bind
	// streams would keep an unwanted connection open).
	stopReverse context.CancelFunc
	hellos      sync.WaitGroup
}

// tcpDialer connects a TCP row to its server: the Client itself (tcpmux
// over TLS), or a fake, so that the TCP links run without a network (the
// raw *tcpmux.Conn is then nil).
type tcpDialer interface {
	dialTCP(ctx context.Context, s *server) (ingress.Conn, *tcpmux.Conn, error)
}

// close ends the connection on shutdown.
func (t *tcpLink) close() {
	t.stopReverse()
	if t.conn != nil {
		_ = t.conn.CloseWithError(proto.CodeShutdown.ApplicationErrorCode(), "client shutting down")
		t.setTCP(nil, nil, 0)
	}
}

// connect dials the row's server; on success the connection carries new
// tunnels at once (its hello and reverse forwards run beside it).
func (t *tcpLink) connect(ctx context.Context) {
	c, srv := t.c, t.srv
	addr := c.tcpAddrOf(srv)
	dialed := time.Now()
	var d tcpDialer = c
	if t.dialer != nil {
		d = t.dialer
	}
	t.setDialing(true)
	conn, raw, err := d.dialTCP(ctx, srv)
	if err != nil {
		t.markBad()
		t.setDialing(false)
		if ctx.Err() == nil {
			t.dialFailed(ctx, addr, err)
		}
		return
	}
	c.cfg.Metrics.TCPDialsTotal.WithLabelValues("ok").Inc()
	t.bo.Success(time.Now())
	t.conn, t.raw, t.upSince, t.unwanted = conn, raw, time.Now(), time.Time{}
	s := &session{Conn: conn, Flows: udpflow.NewTable(c.cfg.Metrics.UDP.Drop)}
	if raw != nil {
		t.logger.V(2).Info("Connected to server over TCP", "address", addr, "localAddress", raw.LocalAddr().String(),
			"resumed", raw.TLS().DidResume, "handshakeDuration", time.Since(dialed))
	}
	srv.tcp.authRefused.Store(false)
	t.setTCP(s, raw, time.Since(dialed)) // before the hello: it clears what the hello confirms
	// The dial's outcome is known once the row is live: a later row's
	// waiters (pickTCPLocked) and the role (failoverTCPLocked) see it up.
	t.setDialing(false)
	t.hellos.Go(func() { c.helloTCP(ctx, s, srv.tcp) })
	rctx, stop := context.WithCancel(ctx)
	t.stopReverse = stop
	if raw != nil {
		t.hellos.Go(func() { c.reverseOn(rctx, s, raw, srv) })
	}
}

// setDialing marks the row's dial in progress (true) or ended (false; it
// then counts as tried, and the table's waiters wake: pickTCPLocked may
// have held them back for it).
func (t *tcpLink) setDialing(on bool) {
	c, r := t.c, t.srv.tcp
	c.mu.Lock()
	r.dialing = on
	r.tried = r.tried || !on
	c.mu.Unlock()
	if !on {
		c.sessionsChanged()
	}
}

// dialFailed counts and logs a failed dial and waits for the next attempt.
func (t *tcpLink) dialFailed(ctx context.Context, addr string, err error) {
	m := t.c.cfg.Metrics
	if certRejected(err) {
		m.TCPDialsTotal.WithLabelValues("cert_rejected").Inc()
		if msg := err.Error(); msg != t.lastRejected {
			t.lastRejected = msg
			t.logger.Error(err, "Could not connect to server over TCP; retrying", "address", addr,
				"presentedFingerprint", presentedFingerprint(err), "fix", DialErrorFix(t.srv.addr, err))
		}
	} else {
		m.TCPDialsTotal.WithLabelValues("error").Inc()
	}
	t.logger.V(2).Info("Could not connect to server over TCP", "address", addr, "err", err)
	_ = t.bo.Wait(ctx)
}

// lost handles the end of the connection: a refusal of our credentials
// is said once (as over QUIC) and waits authBackoff; a connection that
// ended at once waits the backoff; another is redialed at once (after the
// spread a server shutting down asked for).
func (t *tcpLink) lost(ctx context.Context) {
	c := t.c
	cause := context.Cause(t.conn.Context())
	_ = t.conn.CloseWithError(0, "")
	t.conn = nil
	t.stopReverse()
	t.markBad()
	t.setTCP(nil, nil, 0)
	addr := c.tcpAddrOf(t.srv)
	code, remote := proto.FromError(cause)
	if (remote && code == proto.CodeAuthFailed) || t.srv.tcp.authRefused.Load() {
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

// idle waits for a change of the table (changed closes) or the time at,
// and closes a connection no longer wanted once no tunnel uses it.
func (t *tcpLink) idle(ctx context.Context, wanted bool, at time.Time, changed <-chan struct{}) {
	if wanted || t.conn == nil {
		t.unwanted = time.Time{}
	} else if t.unwanted.IsZero() {
		t.unwanted = time.Now()
		t.stopReverse()
		t.markUnwanted()
	}
	var timer *time.Timer
	switch {
	case !wanted && t.conn != nil:
		if (t.raw == nil || t.raw.NumStreams() == 0) && time.Since(t.unwanted) >= time.Second {
			t.logger.V(2).Info("Closed TCP connection to server: QUIC carries new tunnels", "address", t.c.tcpAddrOf(t.srv))
			_ = t.conn.CloseWithError(proto.CodeOK.ApplicationErrorCode(), "back on QUIC")
			t.conn = nil
			t.setTCP(nil, nil, 0)
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
	case <-changed:
	case <-poll:
	case <-closed:
	}
}

// markBad records that the row lost its session or failed a dial
// (failoverTCPLocked's hysteresis).
func (t *tcpLink) markBad() {
	t.c.mu.Lock()
	t.srv.tcp.lastBad = time.Now()
	t.c.mu.Unlock()
}

// markUnwanted takes the row out of placement: its server's QUIC answers
// again.
func (t *tcpLink) markUnwanted() {
	c := t.c
	c.mu.Lock()
	t.srv.tcp.unwanted = true
	c.carryLocked()
	c.mu.Unlock()
}

// authFix is what to do when the server refuses our credentials.
const authFix = "give --secret-file the same secret as the server's --secret-file (or a certificate its --client-ca-file accepts)"

// tcpAddrOf is the TCP address of server s: its Config.TCPServers entry,
// Config.TCPServerAddr for the first server, else its QUIC host:port.
func (c *Client) tcpAddrOf(s *server) string {
	cfg := c.cfg
	if a := cfg.TCPServers[s.addr]; a != "" {
		return a
	}
	if s.idx == 0 && cfg.TCPServerAddr != "" {
		return cfg.TCPServerAddr
	}
	return s.addr
}

// dialTCP connects to s over TCP with s's TLS configuration (the same
// pins or CAs as its QUIC dials, tcpTLS).
func (c *Client) dialTCP(ctx context.Context, s *server) (ingress.Conn, *tcpmux.Conn, error) {
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
	conn, err := tcpmux.Dial(dctx, c.tcpAddrOf(s), c.tcpTLS(s), &cfg)
	if err != nil {
		return nil, nil, err
	}
	return ingress.OverTCP(conn), conn, nil
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

// helloTCP is hello for a TCP session (see hello.go); slot, its row,
// records the answer.
func (c *Client) helloTCP(ctx context.Context, sess *session, slot *tcpRow) {
	secret := c.signer.Load().Secret()
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
