package server

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/liveness"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/ratecap"
	"github.com/quictun/quictun/pkg/rawsock"
	"github.com/quictun/quictun/pkg/tcpmux"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/pkg/usage"
)

// TokenParser turns a destination token into an endpoint (pkg/token implements it).
type TokenParser = egress.TokenParser

// Dialer connects to destinations; *net.Dialer implements it.
type Dialer = egress.Dialer

// Config holds everything a Server needs: the settings of each stream
// (egress.Config, embedded: the app fills it directly) and those of the
// listener and its connections. Zero durations and limits take the defaults
// of DefaultConfig.
type Config struct {
	// Config is what each accepted stream is served with: the destination
	// rules and keys, dial and replay limits, UDP flows, the audit line,
	// events (nil: Metrics) and the tunnel registry (nil: a new one).
	egress.Config
	// Metrics are the server's metrics (NewMetrics); they count the egress
	// Events too.
	Metrics *metrics.Server

	TLS      *tls.Config
	QUIC     *quic.Config
	ResetKey *quic.StatelessResetKey
	TokenKey *quic.TokenGeneratorKey
	// ReplicaID names this server among the servers that share its
	// session-ticket key (replicas): the tickets it issues carry it, and it
	// accepts 0-RTT data only with its own tickets, since only its replay
	// cache records their 0-RTT streams; another replica's ticket resumes
	// without 0-RTT (transport.TagTickets). Empty: DefaultReplicaID, the
	// host's name, distinct for replicas on distinct hosts and the same
	// after a restart (which the process-start bound of pkg/egress covers).
	ReplicaID string

	// SelfAddrs are the addresses of the server's other listeners (the admin
	// API). Streams to them, and to the QUIC listener's own address and
	// port, are refused whatever Allow says (a wildcard address stands for
	// every local address at that port; see endpoint.AllowList.WithSelf).
	SelfAddrs []net.Addr

	DrainTimeout time.Duration
	// ShutdownHandshakeRate is the handshakes per second the clients are
	// asked to spread their reconnects for when the server shuts down
	// (ShutdownSpread); 0: DefaultShutdownHandshakeRate per core of GOMAXPROCS.
	ShutdownHandshakeRate float64

	// TailProbes is how many tail-loss probe datagrams follow a burst of
	// downstream writes (0 disables); TailProbeDelay spaces them.
	TailProbes     int
	TailProbeDelay time.Duration
	// MaxEchoesPerSecond bounds heartbeat echoes per connection.
	MaxEchoesPerSecond int

	// HandshakesPerSecond bounds new connections per source IP (token
	// bucket, burst twice that; 0 disables). A source past half its burst
	// must first prove its address (a Retry round trip), so spoofed floods
	// cannot use a victim's budget.
	HandshakesPerSecond float64
	// MaxConnsPerSource bounds open connections per source IP, an IPv6
	// source counted by its /64 (0 disables).
	MaxConnsPerSource int
	// MaxConnections bounds open QUIC connections in total; more are refused
	// (before the handshake when possible) with overloaded.
	MaxConnections int

	// MaxUnverifiedStreamsPerConn bounds the streams of one connection that
	// are being served before their header was verified: past it, the
	// connection's accept loop waits (no goroutine, no read) until one of
	// them is verified or fails. With shared secrets (Keys) it is also a
	// connection's QUIC stream credit until its first verified header (then
	// QUIC's MaxIncomingStreams): the whole budget of a peer that has not
	// proven the secret yet.
	MaxUnverifiedStreamsPerConn int
	// MaxUnverifiedStreams bounds, across the server, the streams of
	// connections that have not yet presented a verified header; past it,
	// such streams are reset with overloaded at once.
	MaxUnverifiedStreams int
	// MaxUnverifiedStreamsPerSource is one source's share of
	// MaxUnverifiedStreams (a source is an IPv4 address or an IPv6 /64, as
	// for MaxConnsPerSource), so that one source cannot take the whole
	// budget and have every new client's first stream reset; past it, its
	// streams are reset with overloaded at once. 0: an eighth of
	// MaxUnverifiedStreams, at least MaxUnverifiedStreamsPerConn.
	MaxUnverifiedStreamsPerSource int
	// AuthTimeout is how long a connection has, from its first stream, to
	// present a verified header (with a shared secret); then it is closed
	// with auth_failed.
	AuthTimeout time.Duration
	// IdleAuthTimeout is how long a connection has, from its handshake, to
	// present a verified header (with a shared secret), whether it opened
	// streams or not: clients send one at once (a hello, proto.KindHello).
	// A connection that opened no stream is then closed with timeout (a
	// client from before the hello that sat idle: it reconnects), one that
	// did with auth_failed. The longer default spares such old clients a
	// reconnect every few seconds.
	IdleAuthTimeout time.Duration

	// TCP, if set, also accepts connections on it: streams over TLS 1.3
	// on TCP (pkg/tcpmux) for clients whose UDP is blocked, with the same
	// authentication, limits, rules and audit as QUIC. The server closes it
	// when it stops accepting.
	TCP net.Listener
	// TCPMux bounds TCP connections; zero fields: tcpmux's defaults, the
	// stream limits those of QUIC, the idle timeout QUIC's.
	TCPMux tcpmux.Config
	// MaxTCPHandshakes bounds the TCP connections in their TLS handshake
	// at once (the CPU-costly phase; QUIC's equivalent is quic-go's queue of
	// incoming handshakes); four times as many may wait for their
	// ClientHello, which must arrive within 3 s of accept. A source (as for
	// MaxConnsPerSource) holds at most a sixteenth of either, at least 8.
	// More are closed at once and counted in refused_connections_total.
	MaxTCPHandshakes int
	// AllowRemoteListen are the addresses any verified client may ask the
	// server to listen on for a reverse forward
	// (endpoint.AllowList.AuthorizeListen), AllowRemoteListenFor further
	// ones by client identity (as AllowFor). Both empty: reverse forwards
	// are refused (unsupported), the default.
	AllowRemoteListen    *endpoint.AllowList
	AllowRemoteListenFor map[string]*endpoint.AllowList
	// Reverse is what the connections (and UDP flows) accepted on those
	// listeners are carried toward their client with (pkg/ingress, one
	// Handler per listener); its Metrics are required when reverse
	// forwards are allowed (metrics.NewReverseClient). Zero fields:
	// DefaultReverseConnections, DefaultReverseUDPQueueMemory, ingress's
	// defaults.
	Reverse ingress.Config
	// MaxRemoteListens bounds the reverse forward listeners open on the
	// server, MaxRemoteListensPerConn those of one connection (0: the
	// defaults).
	MaxRemoteListens        int
	MaxRemoteListensPerConn int
	// MaxRemoteListensPerIdentity is one client identity's share of
	// MaxRemoteListens: the listeners of all connections of one client
	// certificate's common name or named key, or, for a client with
	// neither, of one source (as egress.Config.MaxUDPFlowsPerIdentity
	// counts), so that one client cannot take every listener; past it,
	// its binds are refused with overloaded. 0:
	// DefaultRemoteListensPerIdentity, an eighth of MaxRemoteListens, at
	// least MaxRemoteListensPerConn.
	MaxRemoteListensPerIdentity int
	// RemoteListenMetrics count the reverse forward listeners and the
	// refused requests (NewRemoteListenMetrics; nil: unregistered ones).
	RemoteListenMetrics *metrics.RemoteListens
	// ListenRemote opens a reverse forward's listener (tcp:, unix:) or UDP
	// socket (udp:) at the address its client asked for (nil: there, with
	// net.ListenConfig). In-process tests give each server a loopback
	// address of its own this way, as separate hosts would have.
	ListenRemote func(ctx context.Context, ep endpoint.Endpoint) (net.Listener, *net.UDPConn, error)
	// InheritedReverse are the reverse forwards' sockets the previous
	// process handed over in an upgrade (ReverseSockets), by listen address
	// (endpoint.String): the server takes each over when a client binds
	// that address again, and closes those not taken after
	// InheritedReverseGrace. The server owns the files.
	InheritedReverse map[string]*os.File

	QUICStat *metrics.QUICCollector // optional; told about closed connections

	// Usage keeps what each client identity uses (bytes, tunnels,
	// connections, refused destinations) and its suspensions (Kick); the
	// server runs it (rates, periodic saves) while it runs. nil: none.
	Usage *usage.Ledger
	// RateLimits caps each identity's download and upload (pkg/ratecap):
	// downloads in the server's sender (quic.Config.Congestion is wrapped,
	// so it must be set: bbr or cubic), uploads by reading its streams no
	// faster; TCP fallback connections are paced per stream. Needs Usage.
	// nil: no caps.
	RateLimits *ratecap.Table
	// UsageReporter, if set, runs while the server does (pkg/report: the
	// usage posted to --usage-report-url); its last batch is made after
	// the connections have closed.
	UsageReporter interface{ Run(ctx context.Context) }
	// CertAuthHook, if set, is asked about the client certificate of
	// every stream whose connection presented one (--auth-hook with
	// --client-ca-file; pkg/authhook's Hook): New makes it the egress's
	// CertHook, a refusal failing the authentication, the answer's rules,
	// caps and quota applied to the certificate's identity, CN=NAME
	// (withHookLimits).
	CertAuthHook CertAuthHook
}

// DefaultConfig returns the defaults for the limits and timeouts.
func DefaultConfig() Config {
	return Config{
		Config:              egress.DefaultConfig(),
		DrainTimeout:        30 * time.Second,
		TailProbes:          1,
		TailProbeDelay:      time.Millisecond,
		MaxEchoesPerSecond:  50,
		HandshakesPerSecond: 20,
		MaxConnsPerSource:   64,
		MaxTCPHandshakes:    256,

		MaxRemoteListens:        DefaultMaxRemoteListens,
		MaxRemoteListensPerConn: DefaultMaxRemoteListensPerConn,

		MaxConnections:              4096,
		MaxUnverifiedStreamsPerConn: 16,
		MaxUnverifiedStreams:        1024,
		AuthTimeout:                 10 * time.Second,
		IdleAuthTimeout:             time.Minute,
	}
}

// DefaultUnverifiedStreamsPerSource is MaxUnverifiedStreamsPerSource when it
// is not set: an eighth of the server-wide budget, so that at least eight
// sources share it, and at least one connection's budget.
func DefaultUnverifiedStreamsPerSource(maxUnverifiedStreams, perConn int) int {
	return max(perConn, maxUnverifiedStreams/8)
}

// Server is a quictun server. Create it with New and call Run once.
type Server struct {
	cfg    Config
	pc     net.PacketConn
	limits *sourceLimiter
	// egress serves each stream once accepted: authentication, rules, dial, splice.
	egress *egress.Handler
	// workers run the streams; Run stops them.
	workers *streamWorkers
	// binder opens the listeners of reverse forwards (nil: none allowed).
	binder *binder

	liveness liveness.Stats

	// unverified holds a slot per stream being served on a connection that
	// has not presented a verified header yet (MaxUnverifiedStreams).
	unverified chan struct{}
	// active counts the connections admitted by serveConn (MaxConnections).
	active atomic.Int64
	// raiseStreamsTo, when positive, is the stream limit a connection gets
	// once verified: with a shared secret connections start with only
	// MaxUnverifiedStreamsPerConn streams of credit (quic-go then holds no
	// more state for an unverified peer).
	raiseStreamsTo int64

	// tcpSlots bounds the TCP connections between accept and the end of
	// their TLS handshake (MaxTCPHandshakes).
	tcpSlots *tcpSlots

	nextConnID atomic.Uint64
	ready      atomic.Bool
	draining   atomic.Bool
	// reconnectSpread is what the shutdown close asks the clients to
	// spread their reconnects over (proto.ShutdownReason), set as the
	// connections are closed.
	reconnectSpread atomic.Int64
	// handover takes an upgrade's request (HandOver) in Run; upgrading
	// makes the connections close with proto.UpgradeReason.
	handover  chan handoverReq
	upgrading atomic.Bool

	mu    sync.Mutex
	conns map[uint64]liveConn
}

// orDefault sets *v to def when it is zero or negative (unset).
func orDefault[T int | uint32 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// DefaultReplicaID is Config.ReplicaID when none is given: the host's name,
// or a random one (for this process) if the host has none.
func DefaultReplicaID() string {
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "random-" + rand.Text()
}

// New checks cfg and returns a Server that will serve on pc. The caller keeps
// ownership of pc and closes it after Run returns.
func New(cfg Config, pc net.PacketConn) (*Server, error) {
	cfg.fillDefaults()
	if err := cfg.validate(pc); err != nil {
		return nil, err
	}
	cfg.refuseSelf(pc)
	if err := cfg.wireAccounts(); err != nil {
		return nil, err
	}
	cfg.tagTickets()
	raiseStreamsTo := cfg.unverifiedStreamCredit()
	cfg.tcpMuxLimits()
	bind, err := cfg.reverseBinder()
	if err != nil {
		return nil, err
	}
	return newServer(cfg, pc, raiseStreamsTo, bind)
}

// fillDefaults sets the limits and timeouts left zero to those of
// DefaultConfig (or derived from other fields), and the optional parts left
// nil to their stand-ins: a new tunnel registry, the metrics as the egress
// events, the host's replica name. The reverse forward limits are filled by
// reverseBinder, only when reverse forwards are allowed.
func (cfg *Config) fillDefaults() {
	def := DefaultConfig()
	cfg.DrainTimeout = max(cfg.DrainTimeout, 0)
	cfg.TailProbes = max(cfg.TailProbes, 0)
	orDefault(&cfg.TailProbeDelay, def.TailProbeDelay)
	orDefault(&cfg.MaxEchoesPerSecond, def.MaxEchoesPerSecond)
	orDefault(&cfg.MaxConnections, def.MaxConnections)
	orDefault(&cfg.MaxTCPHandshakes, def.MaxTCPHandshakes)
	orDefault(&cfg.MaxUnverifiedStreamsPerConn, def.MaxUnverifiedStreamsPerConn)
	orDefault(&cfg.MaxUnverifiedStreams, def.MaxUnverifiedStreams)
	orDefault(&cfg.MaxUnverifiedStreamsPerSource, DefaultUnverifiedStreamsPerSource(cfg.MaxUnverifiedStreams, cfg.MaxUnverifiedStreamsPerConn))
	orDefault(&cfg.AuthTimeout, def.AuthTimeout)
	orDefault(&cfg.IdleAuthTimeout, def.IdleAuthTimeout)
	if cfg.Registry == nil {
		cfg.Registry = tunnel.NewRegistry()
	}
	if cfg.ShutdownHandshakeRate <= 0 {
		cfg.ShutdownHandshakeRate = DefaultShutdownHandshakeRate * float64(runtime.GOMAXPROCS(0))
	}
	if cfg.Events == nil {
		cfg.Events = cfg.Metrics
	}
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = DefaultReplicaID()
	}
}

// validate returns an error naming the first required part that is missing:
// the TLS config, the token parser, the allow-list, the metrics, the packet
// conn.
func (cfg *Config) validate(pc net.PacketConn) error {
	switch {
	case cfg.TLS == nil:
		return errors.New("server: TLS config is required")
	case cfg.Parser == nil:
		return errors.New("server: token parser is required")
	case cfg.Allow == nil:
		return errNoAllowList
	case cfg.Metrics == nil:
		return errors.New("server: metrics are required")
	case pc == nil:
		return errors.New("server: packet conn is required")
	}
	return nil
}

// refuseSelf adds the server's own listeners (pc, the TCP listener, the
// SelfAddrs) to the destinations refused whatever the rules say (cfg.Self),
// and names the listener in the tunnel registry (cfg.Endpoint).
func (cfg *Config) refuseSelf(pc net.PacketConn) {
	selfAddrs := append([]net.Addr{pc.LocalAddr()}, cfg.SelfAddrs...)
	if cfg.TCP != nil {
		selfAddrs = append(selfAddrs, cfg.TCP.Addr())
	}
	for _, a := range selfAddrs {
		if a == nil {
			continue
		}
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			cfg.Self = append(cfg.Self, ap)
		}
	}
	cfg.Endpoint = pc.LocalAddr().String()
}

// wireAccounts wraps the congestion controller with the per-identity rate
// caps (RateLimits, and those an auth hook answers; on a clone of cfg.QUIC)
// and gives the egress the usage ledger as its accounts. Rate limits
// without Usage, or without a congestion controller of ours, are an error.
func (cfg *Config) wireAccounts() error {
	withHookLimits(cfg)
	if cfg.RateLimits != nil {
		if cfg.Usage == nil || cfg.QUIC == nil || cfg.QUIC.Congestion == nil {
			return errors.New("server: rate limits need Usage and a congestion controller of ours (bbr or cubic; reno is quic-go's own, which has no hook)")
		}
		cfg.QUIC = cfg.QUIC.Clone()
		cfg.QUIC.Congestion = ratecap.Factory(cfg.QUIC.Congestion)
		// The table may drop the budgets of identities with nothing open
		// (an auth hook's identities come and go): the ledger knows which.
		cfg.RateLimits.SetLive(cfg.Usage.Active)
	}
	if cfg.Usage != nil {
		cfg.Accounts = ledgerAccounts{l: cfg.Usage, caps: cfg.RateLimits}
	}
	return nil
}

// tagTickets makes the session tickets the server issues carry its
// ReplicaID (and counts them when the metrics have the counter), so that
// it accepts 0-RTT data only with its own (transport.TagTickets).
func (cfg *Config) tagTickets() {
	var ticketSeen func(string)
	if cfg.Metrics.SessionTicketsTotal != nil {
		ticketSeen = cfg.Metrics.SessionTicket
	}
	cfg.TLS = transport.TagTickets(cfg.TLS, cfg.ReplicaID, ticketSeen)
}

// unverifiedStreamCredit returns the stream limit a connection is raised to
// once verified (0: none; Server.raiseStreamsTo), and lowers cfg.QUIC's
// (a clone's) to the unverified budget. With a shared secret the handshake
// proves nothing about the peer: it gets MaxUnverifiedStreamsPerConn as its
// stream credit, and the configured limit once it has presented a verified
// header (Conn.RaiseMaxIncomingStreams, our quic-go patch 0005). Its
// session ticket is sent only then, and remembers the configured limit
// (quic.Config.TicketMaxIncomingStreams, patch 0013): a client that resumes
// it opens that many streams in its first flight (re-attachments after an
// upgrade or an outage), where the unverified credit would hold all but the
// first few back a round trip. Without a secret nothing changes.
func (cfg *Config) unverifiedStreamCredit() (raiseStreamsTo int64) {
	if cfg.Keys.Len() == 0 {
		return 0
	}
	q := &quic.Config{}
	if cfg.QUIC != nil {
		q = cfg.QUIC.Clone()
	}
	full := q.MaxIncomingStreams
	if full == 0 {
		full = quicDefaultMaxIncomingStreams
	}
	if pre := int64(cfg.MaxUnverifiedStreamsPerConn); full > pre {
		q.MaxIncomingStreams, q.TicketMaxIncomingStreams, raiseStreamsTo = pre, full, full
	}
	cfg.QUIC = q
	return raiseStreamsTo
}

// tcpMuxLimits gives TCP connections QUIC's stream limits (the
// pre-authentication budget, then the full limit: run it after
// unverifiedStreamCredit) and idle timeout, and with a secret small receive
// windows until the peer has proven it, so that what an unauthenticated
// connection can make the server buffer is 128 KiB, not 16 MiB.
func (cfg *Config) tcpMuxLimits() {
	cfg.TCPMux.MaxIncomingStreams = quicDefaultMaxIncomingStreams
	if cfg.QUIC != nil && cfg.QUIC.MaxIncomingStreams > 0 {
		cfg.TCPMux.MaxIncomingStreams = cfg.QUIC.MaxIncomingStreams
	}
	if cfg.Keys.Len() > 0 {
		orDefault(&cfg.TCPMux.InitialStreamReceiveWindow, preAuthTCPStreamWindow)
		orDefault(&cfg.TCPMux.InitialConnReceiveWindow, preAuthTCPConnWindow)
	}
	if cfg.TCPMux.IdleTimeout <= 0 && cfg.QUIC != nil {
		cfg.TCPMux.IdleTimeout = cfg.QUIC.MaxIdleTimeout
	}
}

// reverseBinder returns the binder of reverse forward listeners (set as
// cfg.Binder; newServer ties it to the server), or nil when no reverse
// forward is allowed (AllowRemoteListen and AllowRemoteListenFor empty). It
// fills the listener limits and the Reverse ingress defaults; Reverse.Events
// are required.
func (cfg *Config) reverseBinder() (*binder, error) {
	if cfg.AllowRemoteListen == nil && len(cfg.AllowRemoteListenFor) == 0 {
		return nil, nil // no binder: reverse forwards are refused
	}
	if cfg.Reverse.Events == nil {
		return nil, errors.New("server: Reverse.Events are required with AllowRemoteListen")
	}
	orDefault(&cfg.MaxRemoteListens, DefaultMaxRemoteListens)
	orDefault(&cfg.MaxRemoteListensPerConn, DefaultMaxRemoteListensPerConn)
	orDefault(&cfg.MaxRemoteListensPerIdentity, DefaultRemoteListensPerIdentity(cfg.MaxRemoteListens, cfg.MaxRemoteListensPerConn))
	if cfg.RemoteListenMetrics == nil {
		cfg.RemoteListenMetrics = NewRemoteListenMetrics(nil) // counted, not exported
	}
	if cfg.ListenRemote == nil {
		cfg.ListenRemote = ListenRemote
	}
	orDefault(&cfg.Reverse.MaxConnections, DefaultReverseConnections)
	if cfg.Reverse.UDPQueueMemory <= 0 {
		cfg.Reverse.UDPQueueMemory = DefaultReverseUDPQueueMemory
	}
	cfg.Reverse.Reverse, cfg.Reverse.Registry = true, cfg.Registry
	bind := &binder{}
	cfg.Binder = bind
	return bind, nil
}

// newServer builds the Server from the completed cfg: the egress handler
// (whose filled defaults cfg then takes), the source limits, the budget of
// unverified streams, the TCP handshake slots, and the binder (nil: none).
func newServer(cfg Config, pc net.PacketConn, raiseStreamsTo int64, bind *binder) (*Server, error) {
	eg, err := egress.New(cfg.Config)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	cfg.Config = eg.Config() // with the defaults filled
	srv := &Server{
		cfg:            cfg,
		pc:             pc,
		egress:         eg,
		limits:         newSourceLimiter(cfg.HandshakesPerSecond, cfg.MaxConnsPerSource, cfg.MaxUnverifiedStreamsPerSource),
		unverified:     make(chan struct{}, cfg.MaxUnverifiedStreams),
		raiseStreamsTo: raiseStreamsTo,
		tcpSlots:       newTCPSlots(cfg.MaxTCPHandshakes),
		conns:          map[uint64]liveConn{},
		handover:       make(chan handoverReq),
		workers:        newStreamWorkers(maxIdleStreamWorkers),
	}
	if bind != nil {
		bind.init(srv)
		srv.binder = bind
	} else {
		closeInherited(cfg.InheritedReverse, klog.Background()) // no reverse forwards allowed any more
	}
	return srv, nil
}

// SetAllowList replaces the destination rules (all: for every client;
// forIdentity: see Config.AllowFor) for streams whose header arrives from now
// on; tunnels already open are not affected. The server's own listeners stay
// refused.
func (s *Server) SetAllowList(all *endpoint.AllowList, forIdentity map[string]*endpoint.AllowList) {
	s.egress.SetAllowList(all, forIdentity)
}

// Policy is what a reload changes: the shared secrets, the destination
// rules, and whether the open tunnels of removed keys are cut.
type Policy = egress.Policy

// Reconfigure replaces the shared secrets and the destination rules in one
// step, as a reload does: each stream header from now on is checked against
// the new keys and the new rules together, never the keys of one
// configuration and the rules of another. Open tunnels keep running, unless
// p.CutRemovedKeys resets those of keys p.Keys no longer holds with
// auth_failed. A change between shared-secret authentication and none
// returns ErrAuthModeChange and changes nothing.
func (s *Server) Reconfigure(p Policy) error {
	if p.Allow == nil { // as New: an empty list refuses everything, nil is a mistake
		return errNoAllowList
	}
	if (p.Keys.Len() > 0) != (s.egress.Keys().Len() > 0) {
		return ErrAuthModeChange
	}
	s.egress.Reconfigure(p)
	return nil
}

// errNoAllowList: New and Reconfigure need destination rules (an empty list
// refuses every destination).
var errNoAllowList = errors.New("server: allow-list is required")

// ErrAuthModeChange is returned by SetKeys and Reconfigure for a change between shared-secret
// authentication and none (mutual TLS or --insecure-no-auth): connection
// credit and verification depend on the mode, so it takes a restart.
var ErrAuthModeChange = errors.New("switching between shared-secret and other authentication needs a restart")

// SetKeys replaces the shared secrets for stream headers verified from now
// on. Connections already verified stay so (their tunnels keep running), but
// each new stream must carry a MAC made with one of the new keys.
func (s *Server) SetKeys(kr *proto.Keyring) error {
	if (kr.Len() > 0) != (s.egress.Keys().Len() > 0) {
		return ErrAuthModeChange
	}
	s.egress.SetKeys(kr)
	return nil
}

// Ready reports whether the server is listening and not draining (for /readyz).
func (s *Server) Ready() bool { return s.ready.Load() && !s.draining.Load() }

// Addr is the UDP address the server listens on.
func (s *Server) Addr() net.Addr { return s.pc.LocalAddr() }

// LivenessStats counts heartbeat and tail-probe datagrams.
func (s *Server) LivenessStats() *liveness.Stats { return &s.liveness }

// Registry is the server's tunnel registry.
func (s *Server) Registry() *tunnel.Registry { return s.cfg.Registry }

// ConnStats returns statistics of the live connections, QUIC and TCP (for
// metrics and the admin API).
func (s *Server) ConnStats() []transport.ConnStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]transport.ConnStats, 0, len(s.conns))
	for id, lc := range s.conns {
		var cs transport.ConnStats
		if q := lc.conn.asQUIC(); q != nil {
			cs = transport.ConnStatsOf(fmt.Sprint(id), q)
		} else {
			cs = transport.TCPConnStats(fmt.Sprint(id), lc.conn.RemoteAddr(), lc.conn.LocalAddr())
		}
		cs.ClientSubject = egress.ClientSubject(lc.conn)
		cs.ClientIdentity = lc.state.Identity(lc.conn)
		out = append(out, cs)
	}
	return out
}

// Run serves until ctx is cancelled, then drains: it stops accepting
// connections, refuses new streams, waits up to DrainTimeout for open tunnels,
// aborts the rest and closes every connection. It returns after every goroutine
// it started has ended. The shutdown order of STYLE.md, step by step:
// waitForStop, stopAccepting, then handOver (an upgrade) or drain and
// closeConns.
func (s *Server) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	tr := s.newTransport()
	defer func() { _ = tr.Close() }()
	if s.binder != nil {
		defer s.binder.dropInheritedAfter(InheritedReverseGrace, logger)()
	}
	ln, err := tr.ListenEarly(s.cfg.TLS, s.cfg.QUIC)
	if err != nil {
		return fmt.Errorf("listen quic on %s: %w", s.pc.LocalAddr(), err)
	}
	s.ready.Store(true)
	logger.Info("Server listening", "address", s.pc.LocalAddr().String())
	if s.cfg.TCP != nil {
		logger.Info("Server listening on TCP for clients whose UDP is blocked", "address", s.cfg.TCP.Addr().String())
	}

	// Connections outlive ctx until the drain is over.
	connCtx, cancelConns := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), logger))
	defer cancelConns()
	var wg sync.WaitGroup
	s.startServices(connCtx, tr, &wg)
	defer s.workers.stop() // after conns.Wait: no stream can start then
	// conns are the connections' goroutines (an upgrade waits for them
	// alone before it exports the parked tunnels).
	var conns sync.WaitGroup
	defer conns.Wait()
	acceptErr, tcpDone := s.startAccepting(ctx, connCtx, ln, &wg, &conns)
	up, runErr := s.waitForStop(ctx, acceptErr)
	s.stopAccepting(ln, up, acceptErr, tcpDone)
	if up != nil {
		// A failed handover is Run's error too: the process then exits
		// non-zero (a supervisor restarts it), since it has let go.
		err := s.handOver(logger, tr, cancelConns, &conns, up.steps)
		up.done <- err
		wg.Wait()
		s.egress.Close()
		s.ready.Store(false)
		return err
	}
	s.drain(logger)
	s.closeConns(logger, cancelConns, &conns)
	wg.Wait()
	s.egress.Close()
	s.ready.Store(false)
	logger.Info("Server stopped")
	return runErr
}

// newTransport is the QUIC transport on the server's socket, with the
// admission checks of each new connection (--max-connections, the
// handshake rate per source).
func (s *Server) newTransport() *quic.Transport {
	conn := s.pc
	if u, ok := conn.(*net.UDPConn); ok {
		conn = rawsock.Wrap(u) // sends and batched receives as raw system calls
	}
	return &quic.Transport{
		Conn: conn, StatelessResetKey: s.cfg.ResetKey, TokenGeneratorKey: s.cfg.TokenKey,
		// Every quictun client speaks QUIC v1: a Version Negotiation packet
		// would only answer garbage (half of all random datagrams look like
		// an unknown version), to whatever source it claims.
		DisableVersionNegotiationPackets: true,
		Tracer:                           s.cfg.Metrics.DropRecorder(),
		VerifySourceAddress:              func(a net.Addr) bool { return s.limits.suspicious(sourceIP(a), time.Now()) },
		ConnContext: func(ctx context.Context, ci *quic.ClientInfo) (context.Context, error) {
			if s.active.Load() >= int64(s.cfg.MaxConnections) {
				s.cfg.Metrics.RefusedConnectionsTotal.WithLabelValues(metrics.RefusedMaxConnections).Inc()
				return nil, errMaxConnections
			}
			if !s.limits.allowHandshake(sourceIP(ci.RemoteAddr), time.Now()) {
				s.cfg.Metrics.RefusedConnectionsTotal.WithLabelValues("handshake_rate").Inc()
				return nil, errHandshakeRate
			}
			return ctx, nil
		},
	}
}

// startServices starts, in wg until connCtx ends, what runs beside the
// connections: the count of datagrams that are not QUIC, the accounting,
// the rate caps' rebinding, the usage reports and the resume table.
func (s *Server) startServices(connCtx context.Context, tr *quic.Transport, wg *sync.WaitGroup) {
	wg.Go(func() {
		// Datagrams that are not QUIC at all are only counted: quic-go
		// queues them (32 at most, the rest are dropped and counted by the
		// tracer) once someone reads them.
		buf := make([]byte, 1500)
		for {
			if _, _, err := tr.ReadNonQUICPacket(connCtx, buf); err != nil {
				return
			}
			s.cfg.Metrics.DroppedDatagramsTotal.WithLabelValues(metrics.DropNotQUIC).Inc()
		}
	})
	if s.cfg.Usage != nil {
		wg.Go(func() { s.runUsage(connCtx) })
	}
	if s.cfg.RateLimits != nil {
		wg.Go(func() { s.rebindCaps(connCtx) })
	}
	if r := s.cfg.UsageReporter; r != nil {
		wg.Go(func() { r.Run(connCtx) })
	}
	if r := s.cfg.Resume; r != nil {
		wg.Go(func() { r.Table.Run(connCtx) })
	}
}

// startAccepting starts the accept loops (QUIC, and TCP with the
// fallback) in wg, each connection served in conns: acceptErr gets the
// QUIC loop's end, tcpDone is closed when the TCP loop ended (at once
// without the fallback).
func (s *Server) startAccepting(ctx, connCtx context.Context, ln *quic.EarlyListener, wg, conns *sync.WaitGroup) (acceptErr chan error, tcpDone chan struct{}) {
	acceptErr, tcpDone = make(chan error, 1), make(chan struct{})
	wg.Go(func() {
		for {
			c, err := ln.Accept(ctx)
			if err != nil {
				acceptErr <- err
				return
			}
			conns.Go(func() { s.serveConn(connCtx, overQUIC{c}, false) })
		}
	})
	if s.cfg.TCP == nil {
		close(tcpDone)
		return acceptErr, tcpDone
	}
	wg.Go(func() {
		defer close(tcpDone)
		s.acceptTCP(ctx, connCtx, conns)
	})
	return acceptErr, tcpDone
}

// waitForStop waits for the end of ctx (a stop), an upgrade's handover
// request (returned), or the QUIC accept loop's end (put back in
// acceptErr; Run's error unless ctx ended).
func (s *Server) waitForStop(ctx context.Context, acceptErr chan error) (up *handoverReq, runErr error) {
	select {
	case <-ctx.Done():
	case req := <-s.handover:
		up = &req
		s.upgrading.Store(true)
		if s.binder != nil {
			s.binder.keepHandedOver() // before binder.close in stopAccepting
		}
	case err := <-acceptErr:
		acceptErr <- err
		if ctx.Err() == nil {
			runErr = fmt.Errorf("accept: %w", err)
		}
	}
	return up, runErr
}

// stopAccepting marks the server draining and closes its listeners (the
// reverse forwards' too: their clients are told), waits for the accept
// loops, and ends the UDP flows. Without an upgrade (up nil) the parked
// tunnels are given up: none can be re-attached while draining.
func (s *Server) stopAccepting(ln *quic.EarlyListener, up *handoverReq, acceptErr chan error, tcpDone chan struct{}) {
	s.draining.Store(true)
	s.cfg.Metrics.Draining.Set(1)
	if r := s.cfg.Resume; r != nil && up == nil {
		r.Table.Close()
	}
	_ = ln.Close()
	if s.cfg.TCP != nil {
		_ = s.cfg.TCP.Close()
	}
	if s.binder != nil {
		s.binder.close()
	}
	<-acceptErr //nolint:errcheck // waits for the accept loop to end; its error was handled by waitForStop
	<-tcpDone
	// UDP flows have no end to wait for: they end now (the client sees shutdown).
	s.cfg.Registry.AbortFlows(proto.CodeShutdown)
}

// drain waits up to DrainTimeout for the tunnels to end, then for QUIC to
// deliver their last bytes; the tunnels left are aborted.
func (s *Server) drain(logger klog.Logger) {
	if n := s.cfg.Registry.Len(); n > 0 && s.cfg.DrainTimeout > 0 {
		logger.Info("Draining tunnels", "tunnels", n, "timeout", s.cfg.DrainTimeout)
		dctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
		if err := s.cfg.Registry.WaitEmpty(dctx); err != nil {
			logger.Info("Drain timeout expired, aborting tunnels", "tunnels", s.cfg.Registry.Len())
		} else {
			// The last bytes and FINs were handed to QUIC, not yet acknowledged:
			// closing the connections now would discard them.
			transport.Linger(dctx, s.quicConns())
		}
		cancel()
	}
	s.cfg.Registry.AbortAll(proto.CodeShutdown)
}

// quicConns lists the QUIC connections served (a TCP connection's close
// sends its data first anyway).
func (s *Server) quicConns() []*quic.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	conns := make([]*quic.Conn, 0, len(s.conns))
	for _, lc := range s.conns {
		if q := lc.conn.asQUIC(); q != nil {
			conns = append(conns, q)
		}
	}
	return conns
}

// closeConns closes every connection, asking the clients to spread their
// reconnects when there are many (ShutdownSpread), and waits for their
// goroutines.
func (s *Server) closeConns(logger klog.Logger, cancelConns context.CancelFunc, conns *sync.WaitGroup) {
	nconns, verified := s.countConns()
	spread := ShutdownSpread(verified, s.cfg.ShutdownHandshakeRate)
	s.reconnectSpread.Store(int64(spread))
	if spread > 0 {
		logger.Info("Closing connections; asking their clients to spread their reconnects", "connections", nconns,
			"verifiedConnections", verified, "spread", spread)
	}
	cancelConns()
	conns.Wait()
}

// countConns returns how many connections are open, and how many of them
// are verified (a verified header; mutual TLS or no authentication: from
// the handshake). Only verified ones count toward the shutdown spread: the
// clients that will come back are those that had proven the secret, and a
// peer without it must not be able to make every client wait by holding
// idle connections.
func (s *Server) countConns() (open, verified int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, lc := range s.conns {
		if lc.verified.Load() {
			verified++
		}
	}
	return len(s.conns), verified
}

// ShutdownSpread is the time over which a server shutting down asks the
// clients of its n connections to spread their reconnects
// (proto.ShutdownReason), so that its successor takes their handshakes at
// about rate a second as they come: n/rate, at most
// proto.MaxReconnectSpread; none below a second's worth.
func ShutdownSpread(n int, rate float64) time.Duration {
	if rate <= 0 || float64(n) <= rate {
		return 0
	}
	return min(time.Duration(float64(n)/rate*float64(time.Second)), proto.MaxReconnectSpread)
}

// DefaultShutdownHandshakeRate is the handshakes per second and core that
// ShutdownSpread plans for by default: what a core takes, resumed or full
// (about 330 to 360 measured, bench/results/loadgen-2026-11-27T005348Z,
// in git history at ecc96da),
// less a quarter for the hellos and keep-alives that come with them.
const DefaultShutdownHandshakeRate = 250

var (
	// errHandshakeRate refuses a connection from a source over its handshake rate.
	errHandshakeRate = errors.New("too many new connections from this address")
	// errMaxConnections refuses a connection when the server holds MaxConnections.
	errMaxConnections = errors.New("server at its connection limit")
)

// refuseConn closes a connection that is over a limit with overloaded.
func refuseConn(ctx context.Context, conn egress.Conn, reason string) {
	egress.CloseConn(ctx, conn, proto.CodeOverloaded, reason)
}

// IdleStreamWorkers is how many goroutines wait for the server's next
// stream (at most 32, kept between streams so that each need not grow a
// new stack): what a count of the process's goroutines after a burst of
// streams finds beyond those the streams left.
func (s *Server) IdleStreamWorkers() int { return s.workers.waiting() }

// quicDefaultMaxIncomingStreams is quic-go's default for a zero
// quic.Config.MaxIncomingStreams.
const quicDefaultMaxIncomingStreams = 100

// The receive windows of a TCP connection until its first verified header
// (tcpmux.Config.InitialStreamReceiveWindow, InitialConnReceiveWindow): a
// hello and the first bytes of a few tunnels fit.
const (
	preAuthTCPStreamWindow = 64 << 10
	preAuthTCPConnWindow   = 128 << 10
)

// liveConn is an open connection and its egress state (for ConnStats),
// and whether it is verified (connGate.verified, for the shutdown spread).
type liveConn struct {
	conn     tunnelConn
	state    *egress.ConnState
	verified *atomic.Bool
}

// connGate is what a connection may hold before it has proven the secret: a
// few streams being served (slots) and a deadline to present a verified header.
type connGate struct {
	// slots holds one token per stream being served whose header was not
	// verified yet (MaxUnverifiedStreamsPerConn).
	slots    chan struct{}
	verified atomic.Bool
	// deadline closes the connection unless it is verified first: started
	// at the handshake (IdleAuthTimeout), brought forward at the first
	// stream (AuthTimeout). nil for a connection verified from the start.
	deadline   *time.Timer
	deadlineAt time.Time
	// sawStream is set at the connection's first stream.
	sawStream atomic.Bool
	// sawMAC is set at the connection's first header with a valid MAC,
	// verified or not (stale, replayed, refused).
	sawMAC atomic.Bool
	state  *egress.ConnState
	// onVerified runs once, when the connection is first verified.
	onVerified func()
}

// stopDeadline stops the authentication deadline, if any.
func (g *connGate) stopDeadline() {
	if g.deadline != nil {
		g.deadline.Stop()
	}
}

// markVerified records that the connection presented a verified header: one
// with a valid MAC that was also fresh and not a replay (a leaked header
// proves nothing, however valid its MAC).
func (g *connGate) markVerified() {
	if !g.verified.CompareAndSwap(false, true) {
		return
	}
	if g.deadline != nil {
		g.deadline.Stop()
	}
	if g.onVerified != nil {
		g.onVerified()
	}
}

// refuseUnverified resets a stream of a connection not yet verified that is
// over a pre-authentication budget (reason), and counts it.
func (s *Server) refuseUnverified(logger klog.Logger, str egress.TunnelStream, reason, msg string, limit int) {
	egress.Reset(str, proto.CodeOverloaded)
	m := s.cfg.Metrics
	m.StreamsTotal.WithLabelValues(proto.CodeOverloaded.String()).Inc()
	m.PreauthRejectionsTotal.WithLabelValues(reason).Inc()
	logger.V(2).Info(msg, "limit", limit)
}

func connResult(err error) string {
	var idle *quic.IdleTimeoutError
	var app *quic.ApplicationError
	var flood *tcpmux.FloodError
	var perr *tcpmux.ProtocolError
	switch {
	case errors.As(err, &idle):
		return "idle_timeout"
	case errors.As(err, &flood):
		return "flood" // TCP: the peer spent a budget of free work
	case errors.As(err, &perr) && !perr.Remote:
		return "protocol_error" // TCP: malformed frames
	case errors.As(err, &app):
		switch proto.Code(app.ErrorCode) {
		case proto.CodeAuthFailed:
			return "auth_failed"
		case proto.CodeShutdown:
			return "shutdown"
		case proto.CodeTimeout:
			if !app.Remote {
				return "auth_timeout" // IdleAuthTimeout
			}
		}
		return "closed"
	}
	return "error"
}
