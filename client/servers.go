package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/quictun/quictun/pkg/backoff"
	"github.com/quictun/quictun/pkg/metrics"
)

// Mode is how new tunnels are placed when there are several servers.
type Mode string

// Modes of Config.Mode.
const (
	// ModeFailover puts new tunnels on one server, the active one: the first
	// server of Config.Servers that is healthy. When it stops answering, new
	// tunnels go to the next healthy one at once; a server earlier in the
	// list takes the role back only after it has been healthy for
	// FailbackAfter (hysteresis, so a server that comes and goes does not
	// make the tunnels flap between servers).
	ModeFailover Mode = "failover"
	// ModeSpread puts each new tunnel on the healthy connection, of any
	// server, with the fewest active streams.
	ModeSpread Mode = "spread"
)

// ParseMode returns the Mode named s ("" is ModeFailover).
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeFailover:
		return ModeFailover, nil
	case ModeSpread:
		return ModeSpread, nil
	}
	return "", fmt.Errorf("unknown server mode %q: want failover or spread", s)
}

// server is one server the client connects to: a configured endpoint, or one
// address of a name that resolved to several.
type server struct {
	idx int
	// addr is the UDP host:port dialed; host is the name the server's
	// certificate is verified against when the TLS configuration names none.
	addr, host string
	// label names it in logs, metrics and /connections: the configured
	// endpoint, or "ENDPOINT/i" for the i-th address of a name that
	// resolved to several.
	label string
	// nth, for the i-th address of such a name, is i: each dial resolves
	// the name again and takes the i-th address in sorted order, so the
	// server follows the replicas when their addresses change.
	nth    int
	lookup func(ctx context.Context, host string) ([]string, error)
	port   string
	// members are its QUIC rows of the link table (one per connection
	// slot), tcp its TCP row (nil with --transport quic).
	members []*member
	tcp     *tcpRow
	// authRefused is set when this server refused our credentials (an
	// auth_failed close or dial), cleared when it accepts a stream header.
	authRefused atomic.Bool
	// lastBad is when the server was last seen unusable (UnixNano): a
	// connection lost or stalled, a dial failed. 0: never.
	lastBad atomic.Int64
	// tokens keeps the address-validation tokens (NEW_TOKEN) this server
	// gave, for the next connection to it (newTokenStore; nil: none).
	tokens quic.TokenStore
}

func (s *server) markBad(now time.Time) { s.lastBad.Store(now.UnixNano()) }

// member is one connection slot to a server (Config.ConnectionsPerServer of
// them): its own supervise loop, backoff and current link.
type member struct {
	srv   *server
	idx   int
	label string // the "conn" label of its QUIC metrics
	bo    *backoff.Backoff
	// authBo paces redials after the server refused our credentials
	// (authBackoff): slower than bo, as only a new secret (a reload, which
	// cuts it short) or the server's keys can change the answer.
	authBo *backoff.Backoff
	// redial cuts the reconnect backoff short (SetSecret).
	redial chan struct{}
	// pathLost: its last connection ended by an idle timeout (the path
	// went dark, not the server: no close, no stateless reset), so
	// parked tunnels may redial soon (waitBackoff).
	pathLost atomic.Bool
	cur      *link // guarded by Client.mu
	// downSince is when the member stopped having a usable link, pushed
	// to the end of the wait a server shutting down asked for (zero: up,
	// or no attempt yet); refused: its last attempt was refused our
	// credentials over QUIC. Both guarded by Client.mu; its server's TCP
	// row reads them (tcpWantedLocked).
	downSince time.Time
	refused   bool
}

// link is one QUIC connection of a member, with what steering needs to know
// about it.
type link struct {
	*session
	// conn is the session's QUIC connection (quicConn: a *quic.Conn, or a
	// fake in tests).
	conn quicConn
	m    *member
	// readyAt is when its handshake completed (UnixNano; 0: not yet): a
	// resumed connection carries 0-RTT data before, but a server that may
	// not be there is not preferred until it answered.
	readyAt atomic.Int64
	// confirmed: the server accepted a stream header on it (hello.go).
	confirmed atomic.Bool
	// accepted is set by confirm before confirmed (so the line is written
	// before Ready says so); announce is its connection's "Connected to
	// server" line, set by quicLink.up once the handshake is done. The line
	// is logged by whichever of the two comes second (announceIfDue), once
	// (announced).
	accepted, announced atomic.Bool
	announce            atomic.Pointer[func()]
	// stalled: no heartbeat echo for RescueAfter while it has work (the
	// condition that starts a path rescue); set and cleared by monitor.
	stalled atomic.Bool
	// suspect: nothing came back on its path for RescueAfter, not even a
	// packet, or no echo for suspectLateEchoes (watch.suspect); its
	// server's TCP row is then wanted, and a TCP row takes new tunnels
	// before it (pick).
	suspect atomic.Bool
	// active counts the tunnels (and UDP flows) placed on it and not ended.
	active atomic.Int64
	// placed is the client's placement count (Client.placements) when a
	// tunnel was last placed on it: of links equally loaded, the one placed
	// on longest ago takes the next tunnel (lessLoaded), so short tunnels,
	// each ended before the next opens, go round the links instead of all
	// to the first.
	placed atomic.Uint64
}

// lessLoaded reports whether a new tunnel should go on l rather than on
// best: fewer active tunnels, or as many and placed on less recently.
func lessLoaded(l, best *link) bool {
	a, b := l.active.Load(), best.active.Load()
	return a < b || a == b && l.placed.Load() < best.placed.Load()
}

// announceIfDue logs l's connected line (announce) once its handshake is
// done and the server accepted our hello (accepted), if not logged yet.
// Safe for concurrent use.
func (l *link) announceIfDue() {
	f := l.announce.Load()
	if f == nil || !l.accepted.Load() || !l.announced.CompareAndSwap(false, true) {
		return
	}
	(*f)()
}

// live reports whether the link's connection has not ended.
func (l *link) live() bool { return l != nil && l.Conn.Context().Err() == nil }

// healthy: live, its handshake done, answering heartbeats, and its server
// accepts our credentials.
func (l *link) healthy() bool {
	return l.live() && l.readyAt.Load() != 0 && !l.stalled.Load() && !l.m.srv.authRefused.Load()
}

// expandServers turns the configured endpoints into servers: a name that
// resolves to several addresses of one family (IPv4 first) counts as one
// server per address, labelled by the address; anything else (an address,
// a name with one address of each family, a name that does not resolve yet)
// stays one server, resolved at each dial.
func expandServers(ctx context.Context, endpoints []string, lookup func(ctx context.Context, host string) ([]string, error)) []*server {
	var out []*server
	seen := map[string]bool{}
	add := func(addr, host, label string) *server {
		if seen[label] {
			return nil
		}
		seen[label] = true
		s := &server{idx: len(out), addr: addr, host: host, label: label}
		out = append(out, s)
		return s
	}
	for _, ep := range endpoints {
		host, port, err := net.SplitHostPort(ep)
		if err != nil || lookup == nil {
			add(ep, host, ep)
			continue
		}
		if _, err := netip.ParseAddr(host); err == nil {
			add(ep, host, ep)
			continue
		}
		ips, err := resolveFamily(ctx, lookup, host)
		if err != nil || len(ips) < 2 {
			add(ep, host, ep)
			continue
		}
		for i := range ips {
			if s := add(ep, host, ep+"/"+strconv.Itoa(i)); s != nil {
				s.nth, s.lookup, s.port = i, lookup, port
			}
		}
	}
	return out
}

// resolveFamily returns host's addresses of one family, sorted: its IPv4
// addresses, or its IPv6 ones when it has none.
func resolveFamily(ctx context.Context, lookup func(ctx context.Context, host string) ([]string, error), host string) ([]string, error) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	addrs, err := lookup(lctx, host)
	cancel()
	if err != nil {
		return nil, err
	}
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil {
			if ip.Unmap().Is4() {
				v4 = append(v4, ip.Unmap())
			} else {
				v6 = append(v6, ip)
			}
		}
	}
	ips := v4
	if len(ips) == 0 {
		ips = v6
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	out := make([]string, 0, len(ips))
	for _, ip := range slices.Compact(ips) {
		out = append(out, ip.String())
	}
	return out, nil
}

// resolve returns the UDP address a dial to s goes to: for the i-th address
// of a name, the name's i-th address now (modulo their number: fewer
// replicas than at start share them).
func (s *server) resolve(ctx context.Context) (*net.UDPAddr, error) {
	if s.lookup == nil {
		return net.ResolveUDPAddr("udp", s.addr)
	}
	ips, err := resolveFamily(ctx, s.lookup, s.host)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("%s has no address", s.host)
	}
	return net.ResolveUDPAddr("udp", net.JoinHostPort(ips[s.nth%len(ips)], s.port))
}

// newMembers gives each server n connection slots. Labels stay "0", "1", ...
// with one server (as before several), else "ENDPOINT#i".
func newMembers(servers []*server, n int, bo *backoff.Backoff) []*member {
	var all []*member
	for _, s := range servers {
		for i := range n {
			label := strconv.Itoa(i)
			if len(servers) > 1 {
				label = s.label + "#" + label
			}
			b := bo
			if len(all) > 0 {
				nb := *bo
				nb.Reset()
				b = &nb
			}
			m := &member{srv: s, idx: i, label: label, bo: b, authBo: authBackoff(bo), redial: make(chan struct{}, 1)}
			s.members = append(s.members, m)
			all = append(all, m)
		}
	}
	return all
}

// tlsFor is conf as a dial of m uses it: with several servers, the name
// verified defaults to m's server's host, and session tickets are kept per
// server; with several connections to a server (ConnectionsPerServer),
// each connection keeps its own. Two handshakes must not resume from one
// cached ticket at once: quic-go writes into the session state it resumes
// (EarlyData) while crypto/tls reads it (a data race), and TLS 1.3 tickets
// are meant for one use (RFC 8446 C.4; the server may refuse a reused
// one's 0-RTT as a replay).
func (c *Client) tlsFor(m *member, conf *tls.Config) *tls.Config {
	several := len(c.servers) > 1
	if !several && m.idx == 0 {
		return conf
	}
	tc := withServerName(conf, m.srv, several)
	if tc == conf {
		tc = conf.Clone()
	}
	if tc.ClientSessionCache != nil {
		prefix := ""
		if several {
			prefix = m.srv.label + "|"
		}
		if m.idx > 0 { // the first connection keeps the keys of before (a --session-file)
			prefix += "conn" + strconv.Itoa(m.idx) + "|"
		}
		tc.ClientSessionCache = prefixedCache{tc.ClientSessionCache, prefix}
	}
	return tc
}

// prefixedCache keeps one server's session tickets apart from another's
// in a shared cache (the --session-file), so each resumes with its own.
type prefixedCache struct {
	tls.ClientSessionCache
	prefix string
}

func (p prefixedCache) Get(key string) (*tls.ClientSessionState, bool) {
	return p.ClientSessionCache.Get(p.prefix + key)
}

func (p prefixedCache) Put(key string, cs *tls.ClientSessionState) {
	p.ClientSessionCache.Put(p.prefix+key, cs)
}

// pick is the one placement step over the link table: it returns the
// session a new tunnel goes on, and its QUIC link (nil for a TCP row),
// on which the tunnel is counted. The QUIC link chosen by the steering
// (pickQUICLocked) while it answers; else a live TCP row (pickTCPLocked),
// unless that row came up while a QUIC link that was up has merely gone
// silent: then, until retry, the tunnel waits for QUIC rather than start
// on TCP, where it would stay, at TCP's mercy in the next blackout (the
// link is back, TCP got through, and QUIC answers within a heartbeat or a
// rescue probe unless UDP is blocked); else the QUIC link chosen (a
// handshake in progress, a silent path). All nil when no row is live.
// Callers hold c.mu.
func (c *Client) pick(now time.Time) (sess *session, l *link, retry time.Time) {
	l = c.pickQUICLocked(now)
	if !l.answers() {
		if r := c.pickTCPLocked(now); r != nil {
			if l != nil && now.Before(r.graceUntil) && c.anyQUICUpLocked() {
				return nil, nil, r.graceUntil
			}
			c.placements++
			r.placed = c.placements
			c.useLocked(TransportTCP)
			return r.sess, nil, time.Time{}
		}
	}
	if l == nil {
		return nil, nil, time.Time{}
	}
	c.placeLocked(l)
	c.useLocked(TransportQUIC)
	return l.session, l, time.Time{}
}

// placeLocked counts a tunnel placed on l (released by its caller with
// l.active.Add(-1)). Callers hold c.mu.
func (c *Client) placeLocked(l *link) {
	l.active.Add(1)
	c.placements++
	l.placed.Store(c.placements)
}

// pickQUICLocked chooses the QUIC link a new tunnel goes on: failover, the
// steered server's least active healthy link; spread (or no healthy
// server), the least active healthy link; else any live one; nil when none
// is live.
func (c *Client) pickQUICLocked(now time.Time) *link {
	var best *link
	better := func(l *link) {
		if best == nil || lessLoaded(l, best) {
			best = l
		}
	}
	if (c.cfg.Mode == ModeFailover || len(c.servers) == 1) && !c.roleOpenLocked() {
		if s := c.steer(now); s != nil {
			for _, m := range s.members {
				if m.cur.healthy() {
					better(m.cur)
				}
			}
		}
	}
	if best == nil { // spread, or no healthy server: least active healthy link
		for _, m := range c.members {
			if m.cur.healthy() {
				better(m.cur)
			}
		}
	}
	if best == nil { // nothing healthy: any live link (as with one server)
		for _, m := range c.members {
			if m.cur.live() {
				better(m.cur)
			}
		}
	}
	return best
}

// pickServerLocked chooses the QUIC link of the server labelled label a
// resumable tunnel re-attaches on: its least active healthy link, else any
// live one; nil when none is live (or no server has that label). Callers
// hold c.mu.
func (c *Client) pickServerLocked(label string) *link {
	var best *link
	for _, ok := range []func(*link) bool{(*link).healthy, (*link).live} {
		for _, m := range c.members {
			if m.srv.label == label && ok(m.cur) && (best == nil || lessLoaded(m.cur, best)) {
				best = m.cur
			}
		}
		if best != nil {
			return best
		}
	}
	return nil
}

// serverHealthy reports whether s has a healthy link.
func serverHealthy(s *server) bool {
	for _, m := range s.members {
		if m.cur.healthy() {
			return true
		}
	}
	return false
}

// stableSince is when s became healthy for the last time: zero for a server
// never seen unusable, else the later of its last bad moment (a connection
// lost or stalled, a dial failed) and the handshake of any healthy link that
// came up after it.
func stableSince(s *server) time.Time {
	bad := s.lastBad.Load()
	if bad == 0 {
		return time.Time{}
	}
	since := time.Unix(0, bad)
	for _, m := range s.members {
		if l := m.cur; l.healthy() {
			if up := time.Unix(0, l.readyAt.Load()); up.After(since) {
				since = up
			}
		}
	}
	return since
}

// steer returns the active server of failover mode (nil when none is
// healthy), moving the role when the active server is no longer healthy (to
// the first healthy server in order) or when a server earlier in order has
// been healthy for FailbackAfter. Callers hold c.mu.
func (c *Client) steer(now time.Time) *server {
	cur := c.active
	curOK := cur != nil && serverHealthy(cur)
	var next *server
	for _, s := range c.servers {
		if curOK && s == cur {
			next = cur
			break // nothing earlier in order qualified
		}
		if !serverHealthy(s) {
			continue
		}
		if !curOK || now.Sub(stableSince(s)) >= c.cfg.FailbackAfter {
			next = s
			break
		}
	}
	if next != cur && next != nil {
		c.active = next
		c.moved(next, cur, curOK, TransportQUIC)
	}
	if next == nil {
		return nil
	}
	return next
}

// moved counts and logs a move of failover's role from cur to next (no
// line for the first choice, nor with one server). over is the transport
// of the rows the role moved between.
func (c *Client) moved(next, cur *server, curOK bool, over string) {
	if cur == nil || len(c.servers) < 2 {
		return
	}
	c.switches.Add(1)
	what := "Failing over to another server: new tunnels go there"
	if next.idx < cur.idx {
		what = "Failing back to a preferred server: new tunnels go there"
	}
	c.logger.Info(what, "server", next.label, "from", cur.label, "fromHealthy", curOK, "transport", over)
}

// steerLocked moves failover's active server by the links' health now
// (steer), so its log lines and server_active follow health, not the next
// tunnel placed. Callers hold c.mu.
//
// Before the first choice it waits for the servers ahead of the first
// healthy one to have an outcome (healthy, or a failure seen), so a later
// server whose handshake happened to finish first does not take the role
// for a moment (and a failback line follow at once).
func (c *Client) steerLocked(now time.Time) {
	if c.cfg.Mode != ModeFailover || c.roleOpenLocked() {
		return
	}
	c.steer(now)
}

// roleOpenLocked reports whether failover's role is not given yet and
// waits for an outcome (healthy, or a failure seen) of a server ahead of
// the first healthy one. Meanwhile a new tunnel goes on a healthy link
// of any server (pickQUICLocked) without giving that server the role, so
// the role, its log line and server_active follow health once known, and
// a client whose first server's handshake merely ends second does not
// log a failback at start.
func (c *Client) roleOpenLocked() bool {
	if c.active != nil {
		return false
	}
	for _, s := range c.servers {
		if serverHealthy(s) {
			return false
		}
		if s.lastBad.Load() == 0 {
			return true // no outcome yet
		}
	}
	return false
}

// roleLocked is the server with failover's role: the TCP rows' role
// (failoverTCPLocked) while TCP carries new tunnels, else the steering's
// active server. Callers hold c.mu.
func (c *Client) roleLocked() *server {
	if c.carrier == TransportTCP {
		return c.tcpActive
	}
	return c.active
}

// resteer is steerLocked without c.mu held.
func (c *Client) resteer() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.steerLocked(time.Now())
}

// ServerStats returns each server's state for metrics (at scrape time).
func (c *Client) ServerStats() []metrics.ServerStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.steerLocked(time.Now())
	c.tcpRoleLocked(c.servers[0], time.Now())
	out := make([]metrics.ServerStats, 0, len(c.servers))
	for _, s := range c.servers {
		st := metrics.ServerStats{Label: s.label, Healthy: serverHealthy(s), Active: c.cfg.Mode == ModeFailover && s == c.roleLocked()}
		for _, m := range s.members {
			if m.cur.live() && m.cur.readyAt.Load() != 0 {
				st.Connections++
				st.Streams += m.cur.active.Load()
			}
		}
		out = append(out, st)
	}
	return out
}

// Switches counts the moves of failover's active server.
func (c *Client) Switches() uint64 { return c.switches.Load() }
