package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/backoff"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/liveness"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/pkg/udpflow"
)

// TokenSource chooses the destination token for a local connection (pkg/token implements it).
type TokenSource = ingress.TokenSource

// ErrNoSession is returned when no QUIC connection came up within SessionWait.
var ErrNoSession = errors.New("no connection to the server")

// Config holds everything a Client needs: the settings of its local
// connections (ingress.Config, embedded: the app fills it directly) and
// those of its connection to the server.
type Config struct {
	// Config is what each local connection and UDP flow is carried with:
	// stream-open timeout, connection limits, UDP idle timeout, events
	// (nil: Metrics) and the tunnel registry (nil: a new one).
	ingress.Config
	// Metrics are the client's metrics (NewMetrics); they count the
	// ingress Events too.
	Metrics *metrics.Client

	// ServerAddr is the server's UDP host:port (one server; see Servers).
	// It is the older form of Servers with one entry (read only when
	// Servers is empty): the app sets Servers; internal/testutil and
	// tools/bench still set it, so it stays (not marked deprecated, which
	// would fail their lint).
	ServerAddr string
	// Servers are several servers' UDP host:port, in order of preference;
	// when set, ServerAddr is ignored. A name resolving to several
	// addresses of one family counts as one server per address.
	Servers []string
	// Mode places new tunnels across the servers (default ModeFailover).
	Mode Mode
	// ConnectionsPerServer is how many QUIC connections go to each server,
	// each reconnecting on its own (0: 1); tunnels go to the one with the
	// fewest active streams.
	ConnectionsPerServer int
	// FailbackAfter is how long a server earlier in Servers must have been
	// healthy again before failover mode moves new tunnels back to it
	// (0: 10 s).
	FailbackAfter time.Duration
	// Transport is what carries tunnels: TransportAuto (default: QUIC, TCP
	// while QUIC cannot get through), TransportQUIC or TransportTCP.
	Transport string
	// TCPServerAddr is the server's TCP host:port (its --tcp-listen-on);
	// "": ServerAddr. With several servers it is the first one's.
	TCPServerAddr string
	// TCPServers are the TCP host:port of servers whose TCP listener is
	// not at their QUIC host:port, by endpoint as written in Servers (as
	// ServerTLS); TCPServerAddr is the first server's. Each server has
	// its own TCP link, dialed while no QUIC link to it answers.
	TCPServers map[string]string
	// FallbackDelay is how long QUIC may fail to connect before new tunnels
	// go over TCP (0: DefaultFallbackDelay).
	FallbackDelay time.Duration
	// TLS verifies every server without a configuration of its own in
	// ServerTLS (nil: each has one there).
	TLS *tls.Config
	// ServerTLS are the TLS configurations of servers with pins of their
	// own (--server-fingerprint ENDPOINT=sha256:HEX), by endpoint as written
	// in Servers (or ServerAddr): such a server is verified with its own
	// configuration only, so another server's certificate does not pass.
	ServerTLS map[string]*tls.Config
	QUIC      *quic.Config
	// Secret authenticates stream headers when non-empty.
	Secret []byte
	Tokens TokenSource
	// Listeners are the local listeners whose destinations Tokens chooses;
	// the client closes them when it stops.
	Listeners []net.Listener
	// Forwards are further listeners, each with its own destination; the
	// client closes them when it stops.
	Forwards []Forward
	// RemoteForwards are the reverse forwards the client asks the server
	// for on each new connection (reverse.go); Reverse is what the streams
	// the server opens for them are served with (pkg/egress: the client
	// fills Parser and Allow from RemoteForwards; Metrics are required with
	// remote forwards, metrics.NewReverseServer).
	RemoteForwards []RemoteForward
	Reverse        egress.Config
	// Check are the fixed destinations (of forwards, of a Fixed token
	// source) the client asks the server about on each new connection
	// (proto.KindCheck, checkDestinations): one the server's rules refuse
	// is logged at -v 0 when the client connects, not at its first use.
	Check []string

	// SessionWait bounds how long a local connection waits for a QUIC connection.
	SessionWait  time.Duration
	DrainTimeout time.Duration
	// Backoff paces reconnects; nil uses DefaultBackoff.
	Backoff *backoff.Backoff

	// HeartbeatInterval is how often a heartbeat datagram goes to the server
	// (0 disables heartbeats and path rescue).
	HeartbeatInterval time.Duration
	// RescueAfter is how long without a heartbeat echo before the client
	// probes a new path to the server (see rescue.go).
	RescueAfter time.Duration
	// IdleAfter is how long a connection goes without work (a tunnel
	// opening, bytes on a tunnel, a rescue) before its heartbeats stop; an
	// idle connection sends only QUIC's keep-alives (0: 5 s).
	IdleAfter time.Duration
	// TailProbes is how many tail-loss probe datagrams follow a burst of
	// upstream writes (0 disables); TailProbeDelay spaces them.
	TailProbes     int
	TailProbeDelay time.Duration

	// RouteWatch moves the connection to a new path as soon as the route to
	// the server changes (roam.go; Linux only, and only with heartbeats on),
	// not only after a blackout. DefaultConfig turns it on.
	RouteWatch bool

	// WrapConn, when set, wraps the extra UDP sockets of path rescue the
	// way the main socket was wrapped (forward error correction).
	WrapConn func(net.PacketConn) net.PacketConn

	QUICStat *metrics.QUICCollector
}

// Forward is a local listener whose connections go to its own destinations
// (--forward LISTEN=DESTINATION): a stream listener, or a UDP socket whose
// flows (one per application address) go to a udp: destination.
type Forward struct {
	Listener net.Listener
	Packet   *net.UDPConn
	Tokens   TokenSource
	// Proxy, with Listener, makes it an entry point where the application
	// names each destination (--proxy socks5:... or http-connect:...).
	Proxy ingress.Proxy
	// Name says what the entry point is in the log: the destination of a
	// forward ("tcp:10.0.0.5:22"), the kind of a proxy ("socks5").
	Name string
}

// addr names the forward's local address, e.g. "udp:127.0.0.1:5353".
func (f Forward) addr() string {
	if f.Packet != nil {
		return "udp:" + f.Packet.LocalAddr().String()
	}
	return f.Listener.Addr().Network() + ":" + f.Listener.Addr().String()
}

// DefaultConfig returns the defaults of the limits and timeouts; New fills
// in those left zero (HeartbeatInterval excepted: zero disables heartbeats).
func DefaultConfig() Config {
	return Config{
		Config:               ingress.DefaultConfig(),
		Transport:            TransportAuto,
		SessionWait:          10 * time.Second,
		HeartbeatInterval:    200 * time.Millisecond,
		RescueAfter:          time.Second,
		RouteWatch:           true,
		IdleAfter:            5 * time.Second,
		DrainTimeout:         30 * time.Second,
		TailProbes:           1,
		TailProbeDelay:       time.Millisecond,
		Mode:                 ModeFailover,
		ConnectionsPerServer: 1,
		FailbackAfter:        10 * time.Second,
	}
}

// orDefault sets *v to def when it is zero or negative (unset).
func orDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// DefaultBackoff is the reconnect pacing: 100 ms doubling to 10 s, full jitter,
// reset once a connection stayed up for 30 s.
func DefaultBackoff() *backoff.Backoff {
	return &backoff.Backoff{Initial: 100 * time.Millisecond, Max: 10 * time.Second, Multiplier: 2,
		StableAfter: 30 * time.Second, Clock: backoff.RealClock()}
}

// authBackoff is the pacing of redials after the server refused our
// credentials (auth_failed): a jittered exponential backoff from 2 s up to
// three times bo's longest delay (30 s by default), each delay between half
// its ceiling and the ceiling ("equal jitter"), so a client with a wrong
// secret makes at most eight attempts a minute (about six). Only a new
// secret (a reload, which cuts the wait short) or the server's keys change
// the answer.
func authBackoff(bo *backoff.Backoff) *backoff.Backoff {
	r := bo.Rand
	if r == nil {
		r = rand.Float64
	}
	return &backoff.Backoff{Initial: 2 * time.Second, Max: 3 * bo.Max, Multiplier: 2, Clock: bo.Clock,
		Rand: func() float64 { return 0.5 + 0.5*r() }}
}

// Client is a quictun client. Create it with New and call Run once.
type Client struct {
	cfg Config
	pc  net.PacketConn

	// servers, in order of preference, and every connection slot of them.
	servers []*server
	members []*member

	mu      sync.Mutex
	changed chan struct{} // closed and replaced whenever a member's link changes
	// active is failover mode's server (steer); switches counts its moves.
	// tcpActive is its TCP row's server (failoverTCPLocked).
	active, tcpActive *server
	switches          atomic.Uint64
	// up counts the members with a link (quictun_client_session_up).
	up int

	liveness liveness.Stats

	nextConnID atomic.Uint64
	draining   atomic.Bool
	// staleLogged is set once a header refused as stale was logged at -v 0.
	staleLogged atomic.Bool
	// said is what was logged, so each outcome is said once: destinations
	// refused, reverse bindings' outcomes.
	said logMemory
	// lastRefusal is the refusal of our credentials last logged at -v 0;
	// nil once the server accepted them again (confirm), so each distinct
	// refusal, and the recovery, is logged once.
	lastRefusal atomic.Pointer[string]
	// using is the transport new tunnels went on last ("" before any);
	// carrier the one the links' health says carries them (carryLocked).
	// Guarded by mu.
	using, carrier string
	// placements counts the tunnels placed (pick, placeLocked): the order
	// spread breaks ties by (lessLoaded, fewerStreams). Guarded by mu.
	placements uint64
	// tcpDialer dials the TCP rows, quicDialer the QUIC ones (nil: the
	// Client, dialTCP and dialQUIC; fakes in tests).
	tcpDialer  tcpDialer
	quicDialer quicDialer
	// logger is Run's logger, for what is logged outside its goroutines'
	// contexts (confirm from ingress); set before Run starts any.
	logger klog.Logger

	// signer signs with Config.Secret, replaced by SetSecret.
	signer atomic.Pointer[proto.Signer]
	// tlsConf is Config.TLS and Config.ServerTLS, replaced by SetTLS.
	tlsConf atomic.Pointer[tlsConfigs]
	// tcpTickets are the session tickets of the TCP connections (tcpTLS).
	tcpTickets tls.ClientSessionCache
	// tokens holds Config.Tokens, replaced by SetTokens.
	tokens atomic.Pointer[TokenSource]
	// ingress carries the local connections over the current session.
	ingress *ingress.Handler
	// reverse serves the streams the server opens for RemoteForwards (nil:
	// none); unbinding ends the bindings when the client drains.
	reverse     *egress.Handler
	unbinding   context.Context
	stopBinding context.CancelFunc

	// handovers and imports are Run's requests of an upgrade (upgrade.go).
	handovers chan handoverReq
	imports   chan importReq
}

// SetTokens replaces the token source for local connections accepted from
// now on (a reload); open tunnels are not affected.
func (c *Client) SetTokens(ts TokenSource) { c.tokens.Store(&ts) }

// tlsConfigs are Config.TLS and Config.ServerTLS as one value, replaced
// whole.
type tlsConfigs struct {
	all      *tls.Config
	byServer map[string]*tls.Config
}

// SetTLS replaces the TLS configurations (how the servers are verified,
// the client certificate: conf for every server without one of its own in
// byServer, see Config.ServerTLS) for connections dialed from now on (a
// reload); open connections and their tunnels are not affected. Keep the
// session cache of the previous configuration to keep resuming (see
// transport.ClientTLSConfig). It returns an error, and changes nothing,
// when a server would be left without a configuration.
func (c *Client) SetTLS(conf *tls.Config, byServer map[string]*tls.Config) error {
	if conf == nil {
		for _, s := range c.servers {
			if byServer[s.addr] == nil {
				return fmt.Errorf("client: no TLS configuration for server %s", s.addr)
			}
		}
	}
	c.tlsConf.Store(&tlsConfigs{all: conf, byServer: byServer})
	return nil
}

// serverTLS is the TLS configuration server s is verified with now.
func (c *Client) serverTLS(s *server) *tls.Config {
	set := c.tlsConf.Load()
	if conf := set.byServer[s.addr]; conf != nil {
		return conf
	}
	return set.all
}

// SetSecret replaces the shared secret for stream headers made from now on
// (a reload); open tunnels are not affected. A connection whose hello the
// server has not accepted (it refuses our credentials, or has not answered
// yet) proved the old secret: it is closed, and the next one is dialed at
// once, without waiting for the reconnect backoff.
func (c *Client) SetSecret(secret []byte) {
	old := c.signer.Swap(proto.NewSigner(secret))
	if old == nil || bytes.Equal(old.Secret(), secret) {
		return
	}
	for _, m := range c.members {
		c.mu.Lock()
		cur := m.cur
		c.mu.Unlock()
		unproven := cur != nil && !cur.confirmed.Load()
		if unproven {
			_ = cur.Conn.CloseWithError(proto.CodeOK.ApplicationErrorCode(), "client credentials changed")
		}
		if unproven || m.srv.authRefused.Load() {
			select {
			case m.redial <- struct{}{}:
			default:
			}
		}
	}
}

// complete checks cfg and fills the fields left zero with their defaults.
func (cfg *Config) complete() error {
	switch {
	case cfg.ServerAddr == "" && len(cfg.Servers) == 0:
		return errors.New("client: server address is required")
	case cfg.TLS == nil && len(cfg.ServerTLS) == 0:
		return errors.New("client: TLS config is required")
	case cfg.Tokens == nil && len(cfg.Listeners) > 0:
		return errors.New("client: token source is required for Listeners")
	case cfg.Metrics == nil:
		return errors.New("client: metrics are required")
	}
	def := DefaultConfig()
	orDefault(&cfg.SessionWait, def.SessionWait)
	orDefault(&cfg.RescueAfter, def.RescueAfter)
	orDefault(&cfg.IdleAfter, def.IdleAfter)
	orDefault(&cfg.TailProbeDelay, def.TailProbeDelay)
	if cfg.TailProbes < 0 {
		cfg.TailProbes = 0
	}
	if cfg.Backoff == nil {
		cfg.Backoff = DefaultBackoff()
	}
	if cfg.Registry == nil {
		cfg.Registry = tunnel.NewRegistry()
	}
	if cfg.Events == nil {
		cfg.Events = cfg.Metrics
	}
	switch cfg.Transport {
	case "":
		cfg.Transport = TransportAuto
	case TransportAuto, TransportQUIC, TransportTCP:
	default:
		return errNoTransport
	}
	if cfg.Mode == "" {
		cfg.Mode = def.Mode
	}
	if _, err := ParseMode(string(cfg.Mode)); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	orDefault(&cfg.ConnectionsPerServer, 1)
	orDefault(&cfg.FailbackAfter, def.FailbackAfter)
	return nil
}

// New checks cfg and returns a Client that dials from pc. The caller keeps
// ownership of pc and closes it after Run returns.
func New(cfg Config, pc net.PacketConn) (*Client, error) {
	if pc == nil {
		return nil, errors.New("client: packet conn is required")
	}
	if err := cfg.complete(); err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, pc: pc, changed: make(chan struct{}), logger: klog.Background(),
		tcpTickets: tls.NewLRUClientSessionCache(0), handovers: make(chan handoverReq), imports: make(chan importReq)}
	if len(cfg.Servers) == 0 {
		c.servers = []*server{{addr: cfg.ServerAddr, label: cfg.ServerAddr}}
	} else {
		c.servers = expandServers(context.Background(), cfg.Servers, net.DefaultResolver.LookupHost)
	}
	for _, s := range c.servers {
		s.tokens = newTokenStore()
	}
	c.members = newMembers(c.servers, cfg.ConnectionsPerServer, cfg.Backoff)
	if c.cfg.TCPServerAddr == "" { // the first server's, at the QUIC port
		c.cfg.TCPServerAddr = c.servers[0].addr
	}
	if c.cfg.Transport != TransportQUIC {
		for _, s := range c.servers {
			s.tcp = &tcpRow{} // a TCP row per server (fallback.go)
		}
	}
	c.SetSecret(cfg.Secret)
	c.SetTokens(cfg.Tokens)
	if err := c.SetTLS(cfg.TLS, cfg.ServerTLS); err != nil {
		return nil, err
	}
	in, err := ingress.New(cfg.Config, ingress.Links{
		Sessions: sessions{c},
		Tokens:   func() TokenSource { return *c.tokens.Load() },
		Signer:   c.signer.Load,
		Accepted: func(sess *session) {
			if l := c.linkOf(sess); l != nil {
				c.confirm(l)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	c.ingress = in
	c.cfg.Config = in.Config() // with the defaults filled
	c.unbinding, c.stopBinding = context.WithCancel(context.Background())
	if len(cfg.RemoteForwards) > 0 {
		if cfg.Reverse.Events == nil {
			return nil, errors.New("client: Reverse.Events are required with RemoteForwards")
		}
		if c.reverse, err = newReverse(c.cfg); err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
	}
	return c, nil
}

// Ready reports whether a QUIC connection to a server is up (for /readyz):
// its handshake completed, so the server is known to be there, and with a
// shared secret the server accepted a stream header on it (the hello each
// connection starts with, see hello.go), so our credentials are good. A
// resumed connection is used for 0-RTT data before that, but does not count
// yet; nor does anything once the client has started to drain, nor a server
// that refuses our credentials (from its auth_failed close until it accepts
// a stream header). With several servers, one such server is enough.
func (c *Client) Ready() bool {
	if c.draining.Load() {
		return false
	}
	noSecret := len(c.signer.Load().Secret()) == 0
	if c.tcpReady(!noSecret) {
		return true // over TCP (fallback.go)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		l := m.cur
		if l.live() && !m.srv.authRefused.Load() && transport.HandshakeComplete(l.conn) && (noSecret || l.confirmed.Load()) {
			return true
		}
	}
	return false
}

// linkOf is the QUIC link whose session sess is (nil: none, a TCP
// session or one replaced).
func (c *Client) linkOf(sess *session) *link {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		if m.cur != nil && m.cur.session == sess {
			return m.cur
		}
	}
	return nil
}

// current returns m's link (nil: none).
func (c *Client) current(m *member) *link {
	c.mu.Lock()
	defer c.mu.Unlock()
	return m.cur
}

// session is one QUIC connection with its tail prober.
type session = ingress.Session

func (c *Client) newSession(conn quicConn, m *member) *session {
	prober := liveness.NewTailProber(conn, c.cfg.TailProbes, c.cfg.TailProbeDelay, &c.liveness).
		WithRTT(func() time.Duration { return conn.ConnectionStats().SmoothedRTT })
	return &session{Conn: conn.streams(), Prober: prober, Flows: udpflow.NewTable(c.cfg.Metrics.UDP.Drop), Waker: liveness.NewWaker(),
		Server: m.srv.label}
}

// LivenessStats counts heartbeat and tail-probe datagrams.
func (c *Client) LivenessStats() *liveness.Stats { return &c.liveness }

// Registry is the client's tunnel registry.
func (c *Client) Registry() *tunnel.Registry { return c.cfg.Registry }

// ConnStats returns the statistics of the live QUIC connections, labelled
// by connection index ("0"; with several servers "ENDPOINT#0"), and each
// TCP row's connection ("tcp") while there is one.
func (c *Client) ConnStats() []transport.ConnStats {
	c.mu.Lock()
	type lc struct {
		label string
		conn  *quic.Conn
	}
	var live []lc
	for _, m := range c.members {
		if m.cur != nil && m.cur.Conn.QUIC() != nil { // nil: a fake (tests)
			live = append(live, lc{m.label, m.cur.Conn.QUIC()})
		}
	}
	c.mu.Unlock()
	out := make([]transport.ConnStats, 0, len(live)+1)
	for _, l := range live {
		out = append(out, transport.ConnStatsOf(l.label, l.conn))
	}
	for _, t := range c.tcpConns() {
		if t.Context().Err() == nil {
			out = append(out, transport.TCPConnStats(transport.TransportTCP, t.RemoteAddr(), t.LocalAddr()))
		}
	}
	return out
}

// conns returns the live QUIC connections.
func (c *Client) conns() []*quic.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*quic.Conn
	for _, m := range c.members {
		if m.cur.live() && m.cur.Conn.QUIC() != nil {
			out = append(out, m.cur.Conn.QUIC())
		}
	}
	return out
}

// Run serves the listeners and keeps a QUIC connection up until ctx is
// cancelled; then it closes the listeners, waits up to DrainTimeout for open
// tunnels, aborts the rest and closes the connection. In an upgrade
// (HandOver) it hands its tunnels over instead, and Import continues those
// of the previous process. It returns after every goroutine it started has
// ended.
func (c *Client) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	c.logger = logger
	// A send error must not end the connection while the host's address changes (senderr.go).
	tr := &quic.Transport{Conn: sendErrorsAsLoss(c.pc, logger)}
	defer func() { _ = tr.Close() }()
	c.logRouteWatch(logger)

	// The session outlives ctx until the drain is over; the links (each
	// connection's loop) end before it in an upgrade.
	sessCtx, stopSession := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), logger))
	defer stopSession()
	linkCtx, stopLinks := context.WithCancelCause(sessCtx)
	defer stopLinks(nil)
	var wg, links, handlers sync.WaitGroup
	if c.cfg.Transport != TransportTCP {
		for _, m := range c.members {
			links.Go(func() { c.supervise(linkCtx, tr, m) })
		}
	}
	links.Go(func() { c.runTCP(linkCtx) })
	if r := c.cfg.Resume; r != nil {
		wg.Go(func() { r.Table.Run(sessCtx) })
	}
	c.serveEntries(sessCtx, &wg, &handlers)
	defer func() {
		stopSession()
		links.Wait()
		wg.Wait()
		handlers.Wait()
		logger.Info("Client stopped")
	}()
	for {
		select {
		case <-ctx.Done():
			c.drain(logger)
			return nil
		case req := <-c.imports:
			n, err := c.importTunnels(sessCtx, req.tunnels, &handlers)
			req.done <- importResult{n, err}
		case req := <-c.handovers:
			err := c.handOver(logger, stopLinks, &links, req)
			req.done <- err
			return err
		}
	}
}

// serveEntries serves the local entry points (Listeners, Forwards) until
// ctx ends or they are closed, in goroutines counted in wg; each local
// connection's in handlers.
func (c *Client) serveEntries(ctx context.Context, wg, handlers *sync.WaitGroup) {
	for _, ln := range c.cfg.Listeners {
		c.logger.Info("Listening for local connections", "address", ln.Addr().Network()+":"+ln.Addr().String())
		wg.Go(func() { c.ingress.Accept(ctx, ln, nil, handlers) })
	}
	for _, f := range c.cfg.Forwards {
		if f.Proxy != nil {
			c.logger.Info("Listening for local connections", "address", f.addr(), "proxy", f.Name)
		} else {
			c.logger.Info("Listening for local connections", "address", f.addr(), "forwardTo", f.Name)
		}
		switch {
		case f.Packet != nil:
			wg.Go(func() { c.ingress.ServeUDP(ctx, f.Packet, f.Tokens, handlers) })
			continue
		case f.Proxy != nil:
			wg.Go(func() { c.ingress.AcceptProxy(ctx, f.Listener, f.Proxy, handlers) })
			continue
		}
		wg.Go(func() { c.ingress.Accept(ctx, f.Listener, f.Tokens, handlers) })
	}
}

// closeEntries closes the local entry points. keepFiles (an upgrade: the
// new process serves the same sockets) leaves the UNIX sockets' files.
func (c *Client) closeEntries(keepFiles bool) {
	closeLn := func(ln net.Listener) {
		if ul, ok := ln.(*net.UnixListener); ok && keepFiles {
			ul.SetUnlinkOnClose(false)
		}
		_ = ln.Close()
	}
	for _, ln := range c.cfg.Listeners {
		closeLn(ln)
	}
	for _, f := range c.cfg.Forwards {
		if f.Packet != nil {
			_ = f.Packet.Close()
		} else {
			closeLn(f.Listener)
		}
	}
}

// drain is Run's end once ctx is cancelled: the entry points closed, the
// open tunnels waited for up to DrainTimeout, then aborted.
func (c *Client) drain(logger klog.Logger) {
	c.closeEntries(false)
	c.draining.Store(true)
	if r := c.cfg.Resume; r != nil {
		r.Table.Close() // parked tunnels are not re-attached while draining
	}
	c.stopBinding() // the server stops listening for our reverse forwards
	if n := c.cfg.Registry.Len(); n > 0 && c.cfg.DrainTimeout > 0 {
		logger.Info("Draining tunnels", "tunnels", n, "timeout", c.cfg.DrainTimeout)
		dctx, cancel := context.WithTimeout(context.Background(), c.cfg.DrainTimeout)
		if err := c.cfg.Registry.WaitEmpty(dctx); err != nil {
			logger.Info("Drain timeout expired, aborting tunnels", "tunnels", c.cfg.Registry.Len())
		} else if conns := c.conns(); len(conns) > 0 {
			// Let the server acknowledge the last bytes before the connection closes.
			transport.Linger(dctx, conns)
		}
		cancel()
	}
	c.cfg.Registry.AbortAll(proto.CodeShutdown)
}

// markRow changes m's row of the link table (f, under c.mu) and wakes
// the table's waiters (sessionsChanged).
func (c *Client) markRow(m *member, f func(m *member)) {
	c.mu.Lock()
	f(m)
	c.mu.Unlock()
	c.sessionsChanged()
}

// setSession makes sess, over conn, m's link (nil: none) and returns it.
func (c *Client) setSession(m *member, sess *session, conn quicConn) *link {
	var l *link
	if sess != nil {
		l = &link{session: sess, conn: conn, m: m}
	}
	c.mu.Lock()
	if m.cur != nil {
		c.up--
	}
	m.cur = l
	if l != nil {
		c.up++
	}
	c.mu.Unlock()
	c.sessionsChanged()
	return l
}

// sessionsChanged wakes the new tunnels waiting for a session
// (waitSession) and updates the session_up gauge. c.mu must not be held.
func (c *Client) sessionsChanged() {
	c.mu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.steerLocked(time.Now())
	c.carryLocked()
	c.mu.Unlock()
	c.updateSessionUp()
}

// updateSessionUp sets session_up: 1 while a QUIC connection (any server's)
// or the TCP one (fallback.go) is up. Under c.mu, so that concurrent updates
// do not leave a stale value.
func (c *Client) updateSessionUp() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cfg.Metrics.SessionUp.Set(boolGauge(c.up > 0 || c.anyTCPLocked()))
}

// supervise owns m's QUIC connection: one link loop, dial -> hello ->
// serve -> backoff (quicLink), until ctx ends.
func (c *Client) supervise(ctx context.Context, tr *quic.Transport, m *member) {
	logger := klog.FromContext(ctx)
	if len(c.members) > 1 {
		logger = klog.LoggerWithValues(logger, "server", m.srv.label, "conn", m.idx)
		ctx = klog.NewContext(ctx, logger)
	}
	q := &quicLink{c: c, m: m, tr: tr, logger: logger}
	// Each connection's hello (hello.go) runs beside it; all have ended
	// when supervise returns (they end with their connection).
	defer q.hellos.Wait()
	for ctx.Err() == nil {
		l, start, ok := q.connect(ctx)
		if !ok {
			continue
		}
		upSince := q.up(l, start)
		c.monitor(ctx, tr, l) // returns when the connection or ctx ends
		q.down(ctx, l, upSince)
	}
}

// quicLink is the state of one member's QUIC link loop, one method per
// step: connect (dial, the handshake, 0-RTT), up, down (log, backoff),
// dialFailed.
//
// A failed dial is an error at -v 0 when its message differs from the
// previous failure's (a server that is down is not logged every second);
// the first connection, and the first after such an error, are logged at
// -v 0 too, so the default log says when the tunnel works: with a shared
// secret once the server accepted our hello (a wrong secret never logs
// "Connected", its first line is the refusal and its fix), at -v 2 at the
// handshake (announceConnected). A refusal of
// our credentials is logged the same way, once until the server accepts
// them again (confirm logs that at -v 0); the reconnects in between are
// logged at -v 2, so the default log does not alternate "Connected" and
// "rejected" at every retry. A lost connection is logged at -v 0 (and the
// reconnect after it), at most once per lostLogInterval: a server restart
// shows in the default log, a connection that keeps dropping does not
// fill it.
type quicLink struct {
	c      *Client
	m      *member
	tr     *quic.Transport
	logger klog.Logger

	lastDialErr  string
	connID       uint64 // the current connection's, for the log
	lostLoggedAt time.Time
	hellos       sync.WaitGroup

	// logMu guards connectedBefore and loggedFailure: the connected line
	// is logged on the hello's goroutine (announceConnected).
	logMu                          sync.Mutex
	connectedBefore, loggedFailure bool
}

// startHello starts l's hello and destination checks, and on each server's
// first connection its reverse forwards (bound once per server: another
// connection would be refused addr_in_use; on every server, so they work
// whichever one a peer reaches).
func (q *quicLink) startHello(ctx context.Context, l *link) {
	q.hellos.Go(func() {
		q.c.hello(ctx, l)
		q.c.checkDestinations(ctx, l)
	})
	if l.m.idx == 0 {
		q.hellos.Go(func() { q.c.serveReverse(ctx, l) })
	}
}

// connect dials m's server and returns its link once the handshake is done
// (a resumed connection is m's link at once: with a session ticket,
// streams go out as 0-RTT data). ok is false after a failed attempt,
// counted, logged and waited for.
func (q *quicLink) connect(ctx context.Context) (l *link, start time.Time, ok bool) {
	c, m := q.c, q.m
	start = time.Now()
	c.markRow(m, func(m *member) {
		if m.downSince.IsZero() {
			m.downSince = start
		}
	})
	var d quicDialer = c
	if c.quicDialer != nil {
		d = c.quicDialer
	}
	conn, err := d.dialQUIC(ctx, q.tr, m)
	if err != nil {
		if ctx.Err() == nil {
			q.dialFailed(ctx, err)
		}
		return nil, start, false
	}
	q.connID = c.nextConnID.Add(1)
	l = c.setSession(m, c.newSession(conn, m), conn)
	q.startHello(ctx, l)
	if !transport.HandshakeComplete(conn) {
		l = q.handshake(ctx, l)
	}
	if ctx.Err() == nil && !transport.HandshakeComplete(l.conn) {
		// A resumed attempt whose handshake did not complete (the
		// handshake timeout, a refusal): a failed dial, not a connection.
		c.setSession(m, nil, nil)
		q.dialFailed(ctx, fmt.Errorf("dial %s: %w", m.srv.addr, context.Cause(l.conn.Context())))
		return nil, start, false
	}
	return l, start, true
}

// handshake waits for the handshake of l, a resumed connection, and
// returns the link that goes on: l, or after a rejection of 0-RTT (its
// data was dropped; handlers re-send, ingress's earlyPhase) the link of
// the connection without it.
func (q *quicLink) handshake(ctx context.Context, l *link) *link {
	c, conn := q.c, l.conn
	select {
	case <-conn.HandshakeComplete():
	case <-conn.Context().Done():
	case <-ctx.Done():
	}
	if conn.Context().Err() != nil || ctx.Err() != nil || conn.ConnectionState().Used0RTT {
		return l
	}
	c.cfg.Metrics.DialsTotal.WithLabelValues("0rtt_rejected").Inc()
	next, err := conn.nextConnection(ctx)
	if err != nil {
		return l
	}
	l = c.setSession(q.m, c.newSession(next, q.m), next)
	q.startHello(ctx, l)
	return l
}

// dialFailed counts and logs a connection attempt that did not complete
// its handshake, and waits for the next one: after a refusal of our
// credentials the slower authBackoff, with no TCP meanwhile.
func (q *quicLink) dialFailed(ctx context.Context, err error) {
	c, m, srv := q.c, q.m, q.m.srv
	met := c.cfg.Metrics
	srv.markBad(time.Now())
	var kv []any
	authFailed := false
	if code, ok := proto.FromError(err); ok && code == proto.CodeAuthFailed {
		met.DialsTotal.WithLabelValues("auth_failed").Inc()
		srv.authRefused.Store(true)
		authFailed = true
	} else if certRejected(err) {
		met.DialsTotal.WithLabelValues("cert_rejected").Inc()
		if fp := presentedFingerprint(err); fp != "" {
			kv = append(kv, "presentedFingerprint", fp)
		}
	} else {
		met.DialsTotal.WithLabelValues("error").Inc()
	}
	var idle *quic.IdleTimeoutError
	var hs *quic.HandshakeTimeoutError
	overTCP := c.overTCP() && (errors.As(err, &idle) || errors.As(err, &hs) || errors.Is(err, context.DeadlineExceeded))
	switch msg := err.Error(); {
	case overTCP:
		// Tunnels go over TCP, which the -v 0 log said (UDP blocked?): a
		// QUIC attempt with no answer is no news.
		q.logger.V(2).Info("Could not connect to server over QUIC; tunnels go over TCP", "address", srv.addr, "err", err)
	case msg != q.lastDialErr:
		q.lastDialErr = msg
		q.failureLogged()
		q.logger.Error(err, "Could not connect to server; retrying", append([]any{"address", srv.addr, "fix", DialErrorFix(srv.addr, err)}, kv...)...)
	default:
		q.logger.V(2).Info("Could not connect to server", "address", srv.addr, "attempt", m.bo.Attempts()+1, "err", err)
	}
	if authFailed {
		c.waitAuthBackoff(ctx, m)
		return
	}
	c.markRow(m, func(m *member) { m.refused = false })
	c.waitBackoff(ctx, m)
}

// up records l, its handshake done, as up: counted, its row answering,
// logged (announceConnected), the backoff reset. It returns when.
func (q *quicLink) up(l *link, start time.Time) time.Time {
	c, conn, met := q.c, l.conn, q.c.cfg.Metrics
	if conn.Context().Err() == nil && transport.HandshakeComplete(conn) {
		l.readyAt.Store(time.Now().UnixNano())
	}
	used0RTT := conn.ConnectionState().Used0RTT
	if used0RTT {
		met.DialsTotal.WithLabelValues("ok_0rtt").Inc()
	} else {
		met.DialsTotal.WithLabelValues("ok").Inc()
	}
	met.HandshakeDuration.Observe(time.Since(start).Seconds())
	c.markRow(q.m, func(m *member) { m.downSince = time.Time{} }) // its row answers
	q.lastDialErr = ""
	q.announceConnected(l, []any{"address", q.m.srv.addr, "connID", q.connID,
		"localAddress", conn.LocalAddr().String(), "handshakeDuration", time.Since(start), "used0RTT", used0RTT,
		"serverFingerprint", serverFingerprint(conn)})
	upSince := time.Now()
	q.m.bo.Success(upSince)
	return upSince
}

// announceConnected logs l's connection, its handshake done, with kv. At
// -v 0 (the first connection, and the first after a failure logged at -v
// 0) it waits for the server to accept our hello when there is one (a
// shared secret), as Ready does: a wrong secret then never says
// "Connected", only the refusal with its fix; the handshake is logged at
// -v 2 meanwhile. Without a secret (mutual TLS, --insecure-no-auth) there
// is no hello: the handshake is the connection's line.
func (q *quicLink) announceConnected(l *link, kv []any) {
	if len(q.c.signer.Load().Secret()) == 0 {
		q.logConnected(kv)
		return
	}
	q.logger.V(2).Info("Completed handshake with server; waiting for the answer to our hello", kv...)
	announce := func() { q.logConnected(kv) }
	l.announce.Store(&announce)
	l.announceIfDue()
}

// logConnected logs a connection, up and accepted, with kv: at -v 0 the
// first time and after a failure logged at -v 0 ("Reconnected" when one
// came before), else at -v 2. Safe for concurrent use.
func (q *quicLink) logConnected(kv []any) {
	q.logMu.Lock()
	defer q.logMu.Unlock()
	level, msg := 2, "Connected to server"
	if !q.connectedBefore || q.loggedFailure {
		level = 0
	}
	if q.connectedBefore && q.loggedFailure {
		msg = "Reconnected to server"
	}
	q.connectedBefore, q.loggedFailure = true, false
	q.logger.V(level).Info(msg, kv...)
}

// failureLogged records that a failure was logged at -v 0: the next
// connection is logged at -v 0 too (logConnected).
func (q *quicLink) failureLogged() {
	q.logMu.Lock()
	defer q.logMu.Unlock()
	q.loggedFailure = true
}

// down handles the end of l, up since upSince: it is no longer m's link;
// the reason is logged (a refusal of our credentials once, a loss at most
// once per lostLogInterval at -v 0) and the next dial waits: after a
// refusal authBackoff; the spread a server shutting down asked for; the
// backoff after failed attempts, and after a connection that ended right
// after it came up (the server refused our hello, or closes at once: the
// attempt count grows only in a wait, so without one that would be a
// reconnect loop without any delay). A connection that was up for a while
// (a server restart) is redialed at once: streams opened meanwhile go out
// as 0-RTT data on the new connection and wait for the server there. A
// server's upgrade close (proto.UpgradeReason) is redialed at once in any
// case, and does not mark the server bad: its new process already serves.
func (q *quicLink) down(ctx context.Context, l *link, upSince time.Time) {
	c, m, conn := q.c, q.m, l.conn
	c.setSession(m, nil, nil)
	c.markRow(m, func(m *member) { m.downSince = time.Now() })
	// A server's upgrade (proto.UpgradeReason) is no failure of the
	// server: its new process serves the same address at once.
	upgrade := proto.IsUpgrade(context.Cause(conn.Context()))
	if !upgrade {
		m.srv.markBad(time.Now())
	}
	if ctx.Err() != nil {
		_ = conn.CloseWithError(proto.CodeShutdown.ApplicationErrorCode(), closeReason(ctx))
	}
	if c.cfg.QUICStat != nil {
		c.cfg.QUICStat.Closed(conn.ConnectionStats())
	}
	if ctx.Err() != nil {
		return
	}
	cause := context.Cause(conn.Context())
	var idle *quic.IdleTimeoutError
	m.pathLost.Store(errors.As(cause, &idle))
	spreadWait := reconnectWait(cause)
	c.cfg.Metrics.ReconnectsTotal.Inc()
	m.bo.Failure(time.Now())
	code, remote := proto.FromError(cause)
	authFailed := remote && code == proto.CodeAuthFailed
	if authFailed {
		m.srv.authRefused.Store(true)
	} else {
		c.markRow(m, func(m *member) { m.refused = false })
		m.authBo.Reset()
	}
	q.logDown(cause, authFailed, upSince, spreadWait)
	switch {
	case authFailed:
		c.waitAuthBackoff(ctx, m)
	case upgrade:
		m.bo.Reset() // redial at once, whatever the connection's age: tunnels wait to re-attach
	case spreadWait > 0:
		c.waitSpread(ctx, m, spreadWait)
	case m.bo.Attempts() > 0 || time.Since(upSince) < shortConnection:
		c.waitBackoff(ctx, m)
	}
}

// logDown logs why a connection up since upSince ended (see down).
func (q *quicLink) logDown(cause error, authFailed bool, upSince time.Time, spreadWait time.Duration) {
	switch now := time.Now(); {
	case authFailed && q.c.refusedBefore(cause.Error()):
		q.logger.V(2).Info("Server rejected our credentials again", "connID", q.connID, "err", cause)
	case authFailed:
		q.logger.Error(cause, "Server rejected our credentials; check --secret-file or the client certificate", "connID", q.connID,
			"fix", authFix)
	case q.lostLoggedAt.IsZero() || now.Sub(q.lostLoggedAt) >= lostLogInterval:
		q.lostLoggedAt = now
		q.failureLogged()
		q.logger.Info("Lost connection to server; reconnecting (tunnels opened meanwhile wait for the new connection)",
			"address", q.m.srv.addr, "connID", q.connID, "uptime", now.Sub(upSince).Round(time.Millisecond), "err", cause,
			"reconnectIn", spreadWait.Round(time.Millisecond))
	default:
		q.logger.V(2).Info("Lost connection to server", "connID", q.connID, "err", cause, "reconnectIn", spreadWait.Round(time.Millisecond))
	}
}

// serverFingerprint is the fingerprint of the certificate the client
// verified on conn (for a resumed session, that of the handshake that made
// its ticket).
func serverFingerprint(conn quicConn) string {
	certs := conn.ConnectionState().TLS.PeerCertificates
	if len(certs) == 0 {
		return ""
	}
	return transport.Fingerprint(certs[0].Raw)
}

// lostLogInterval is how often a lost connection is logged at -v 0.
const lostLogInterval = time.Minute

// shortConnection is how long a connection must have been up for the
// reconnect after it to go out without a backoff delay.
const shortConnection = time.Second

// refusedBefore reports whether msg is the refusal last logged (and not
// followed by an acceptance); if not, it records msg as logged.
func (c *Client) refusedBefore(msg string) bool {
	if prev := c.lastRefusal.Swap(&msg); prev != nil && *prev == msg {
		return true
	}
	return false
}

// waitSpread waits d before a reconnect, as a server shutting down asked
// (proto.ReconnectSpread). m's server's TCP row dials no TCP meanwhile
// (the fallback delay counts from its end): the server restarts, UDP is
// not blocked.
func (c *Client) waitSpread(ctx context.Context, m *member, d time.Duration) {
	c.markRow(m, func(m *member) { m.downSince = time.Now().Add(d) })
	sleep(ctx, d)
}

// reconnectWait is how long to wait before reconnecting after a connection
// (QUIC or TCP) that ended with cause: a random part of the spread a server
// shutting down with many clients asked for (proto.ReconnectSpread), else 0.
func reconnectWait(cause error) time.Duration {
	if spread := proto.ReconnectSpread(cause); spread > 0 {
		return rand.N(spread)
	}
	return 0
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// errRedial cuts a reconnect backoff short.
var errRedial = errors.New("credentials changed")

// waitAuthBackoff waits for m's next delay after a refusal of our
// credentials (authBackoff), or until the credentials change. The server
// answered over UDP: its TCP row dials no TCP meanwhile (it would be
// refused too).
func (c *Client) waitAuthBackoff(ctx context.Context, m *member) {
	c.markRow(m, func(m *member) { m.refused = true })
	m.authBo.Failure(time.Now())
	c.waitOn(ctx, m, m.authBo)
}

// waitBackoff waits for m's next backoff delay, or until the credentials
// change (SetSecret): then it returns at once and starts the backoff afresh.
// While resumable tunnels wait for a connection the path lost (an idle
// timeout, as in a blackout) it waits at most parkedRedialMax: they come
// back soon after the path does (a long blackout grows the backoff to its
// 10 s maximum, which they waited for). A server that closed or reset the
// connection (a restart: every client reconnecting) keeps the backoff.
func (c *Client) waitBackoff(ctx context.Context, m *member) {
	if r := c.cfg.Resume; r != nil && m.pathLost.Load() && r.Table.Len() > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, parkedRedialMax)
		defer cancel()
	}
	c.waitOn(ctx, m, m.bo)
}

// parkedRedialMax bounds the wait between dials while resumable tunnels
// wait for a connection: a handshake attempt (one Initial) a second.
const parkedRedialMax = time.Second

// waitOn waits for bo's next delay, or until the credentials change
// (SetSecret): then it returns at once and starts bo afresh.
func (c *Client) waitOn(ctx context.Context, m *member, bo *backoff.Backoff) {
	select {
	case <-m.redial: // changed before the wait
		bo.Reset()
		return
	default:
	}
	wctx, cancel := context.WithCancelCause(ctx)
	if c.overTCP() {
		// Tunnels go over TCP meanwhile: try UDP again soon.
		var stop context.CancelFunc
		wctx, stop = context.WithTimeout(wctx, fallbackProbeMax)
		defer stop()
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-m.redial:
			cancel(errRedial)
		case <-wctx.Done():
		}
	})
	_ = bo.Wait(wctx)
	cancel(nil)
	wg.Wait()
	if errors.Is(context.Cause(wctx), errRedial) {
		bo.Reset()
	}
}

// quicDialer dials a member's QUIC connection: the Client itself, or a
// fake (a quicConn), so that the whole QUIC link loop, dial -> hello ->
// serve (monitor, its watch and rescues) -> lost -> backoff, runs without
// a network in the package's tests.
type quicDialer interface {
	dialQUIC(ctx context.Context, tr *quic.Transport, m *member) (quicConn, error)
}

// dialQUIC dials m's server from tr, within one handshake timeout.
func (c *Client) dialQUIC(ctx context.Context, tr *quic.Transport, m *member) (quicConn, error) {
	srv := m.srv
	ua, err := srv.resolve(ctx)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", srv.addr, err)
	}
	// One attempt lasts one handshake timeout: a new attempt sends a fresh
	// Initial at once, instead of waiting for a backed-off retransmission, so
	// a server that comes back is reached within about a second.
	timeout := 3 * time.Second
	if c.cfg.QUIC != nil && c.cfg.QUIC.HandshakeIdleTimeout > 0 {
		timeout = c.cfg.QUIC.HandshakeIdleTimeout
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// DialEarly returns as soon as 0-RTT keys exist when a session ticket is
	// cached (after a reconnect), and after the handshake otherwise.
	conn, err := tr.DialEarly(dctx, ua, c.tlsFor(m, c.serverTLS(srv)), withTokens(c.cfg.QUIC, srv.tokens))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", srv.addr, err)
	}
	return overQUIC{conn}, nil
}

// sessions is the Client as ingress sees it.
type sessions struct{ c *Client }

// Wait returns the session a new tunnel goes on, waiting up to SessionWait
// for one; release ends the tunnel's count on it.
func (s sessions) Wait(ctx context.Context) (*session, func(), error) {
	sess, release, err := s.c.waitSession(ctx)
	if err != nil {
		return nil, func() {}, err
	}
	return sess, release, nil
}

// WaitServer implements ingress.ServerSessions: a QUIC session to the
// server labelled server, for a resumable tunnel's re-attachment (another
// server would refuse it), waiting up to SessionWait for one.
func (s sessions) WaitServer(ctx context.Context, server string) (*session, func(), error) {
	sess, release, err := s.c.waitSessionBy(ctx, func(time.Time) (*session, *link, time.Time) {
		l := s.c.pickServerLocked(server)
		if l == nil {
			return nil, nil, time.Time{}
		}
		s.c.placeLocked(l)
		return l.session, l, time.Time{}
	})
	if err != nil {
		return nil, func() {}, err
	}
	return sess, release, nil
}

// waitSession places a new tunnel (pick, one step over the link table),
// waiting up to SessionWait for a row: a QUIC link (counted on it until
// release), or a TCP row while QUIC does not get through (fallback.go).
func (c *Client) waitSession(ctx context.Context) (*session, func(), error) {
	return c.waitSessionBy(ctx, c.pick)
}

// waitSessionBy waits up to SessionWait for pick (called with c.mu held,
// as Client.pick) to place a tunnel; a link it returns counts the tunnel
// until release.
func (c *Client) waitSessionBy(ctx context.Context, pick func(now time.Time) (*session, *link, time.Time)) (*session, func(), error) {
	start := time.Now()
	var wait *time.Timer // made at the first wait: a tunnel placed at once needs none
	defer func() {
		if wait != nil {
			wait.Stop()
		}
	}()
	for now := start; ; now = time.Now() {
		c.mu.Lock()
		s, l, retry := pick(now)
		ch := c.changed
		c.mu.Unlock()
		if l != nil {
			var once sync.Once
			return s, func() { once.Do(func() { l.active.Add(-1) }) }, nil
		}
		if s != nil {
			return s, func() {}, nil
		}
		if wait == nil {
			wait = time.NewTimer(c.cfg.SessionWait - now.Sub(start))
		}
		var again <-chan time.Time // a stopped timer is not needed (Go 1.23)
		if !retry.IsZero() {
			again = time.After(time.Until(retry))
		}
		select {
		case <-ch:
		case <-again:
		case <-wait.C:
			return nil, nil, ErrNoSession
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// DialErrorFix returns what to check for an error of a dial to the server
// at endpoint, for the -v 0 log line.
func DialErrorFix(endpoint string, err error) string {
	var idle *quic.IdleTimeoutError
	var hs *quic.HandshakeTimeoutError
	msg := err.Error()
	switch {
	case errors.Is(err, transport.ErrFingerprintMismatch) || strings.Contains(msg, transport.ErrFingerprintMismatch.Error()):
		fp := presentedFingerprint(err)
		if fp == "" {
			fp = "sha256:HEX"
		}
		return "the server at " + endpoint + " presented a certificate that no pin for it accepts: run 'quictun-server fingerprint' on that host (same --state-dir); if it prints " + fp +
			", pin it with --server-fingerprint " + endpoint + "=" + fp + " (this server only; a sha256:HEX entry without an endpoint is accepted by every server without pins of its own) and reload (SIGHUP); if it prints something else, another host answered at that address: do not pin it"
	case strings.Contains(msg, "x509:") || strings.Contains(msg, "certificate"):
		return "the certificate of the server at " + endpoint + " did not verify: check --ca-file and --server-name (or pin it with --server-fingerprint " + endpoint + "=sha256:HEX)"
	case errors.As(err, &idle) || errors.As(err, &hs) || errors.Is(err, context.DeadlineExceeded):
		return "no answer from the server: check --server-endpoint, that quictun-server runs there, and that its UDP port is open in firewalls"
	case strings.Contains(msg, "resolve"):
		return "the host of --server-endpoint does not resolve: check its spelling and DNS"
	default:
		return "check --server-endpoint and that quictun-server runs there"
	}
}

// certRejected reports whether a dial failed because the server's
// certificate did not verify (a pin or the CA refused it).
func certRejected(err error) bool {
	msg := err.Error()
	return errors.Is(err, transport.ErrFingerprintMismatch) || strings.Contains(msg, transport.ErrFingerprintMismatch.Error()) ||
		strings.Contains(msg, "x509:") || strings.Contains(msg, "tls: failed to verify certificate")
}

// presentedFingerprint is the fingerprint of the certificate a server
// presented that no pin accepted ("" if err is not such a refusal).
func presentedFingerprint(err error) string {
	if pm, ok := errors.AsType[*transport.PinMismatchError](err); ok {
		return pm.Presented
	}
	return ""
}
