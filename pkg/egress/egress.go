package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/liveness"
	"github.com/quictun/quictun/pkg/lograte"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/splice"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/pkg/udpflow"
)

// TokenParser turns a destination token into an endpoint (pkg/token implements it).
type TokenParser interface {
	Parse(token string) (endpoint.Endpoint, error)
}

// Dialer connects to destinations; *net.Dialer implements it.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Config are the settings of a Handler, filled once by whoever runs it (the
// server's app fills the egress.Config its server.Config embeds).
// DefaultConfig holds the defaults of the limits and timeouts; New fills a
// field left zero (or negative) with its default. Parser, Allow, Events and
// Registry are required.
type Config struct {
	Parser TokenParser
	// Allow holds the destination rules for every client.
	Allow *endpoint.AllowList
	// AllowFor holds further rules by client identity: "CN=NAME" for a
	// client certificate's subject common name (mutual TLS), "key=NAME" for
	// a shared-secret key's name (Key.Label). A stream may reach what Allow
	// or the lists of its identities allow; each list must carry the deny
	// rules too (endpoint.ParseRules), so deny still wins.
	AllowFor map[string]*endpoint.AllowList
	// Self are the addresses refused whatever the rules say (the server's
	// own listeners; a wildcard address stands for that port everywhere).
	Self []netip.AddrPort
	// Keys, when not empty, are the shared secrets a stream header must be
	// authenticated with (several during a rotation). When empty, the TLS
	// layer authenticates the peer (mutual TLS), or the operator explicitly
	// chose no authentication.
	Keys *proto.Keyring
	// Resolver resolves destination host names (nil: net.DefaultResolver).
	Resolver endpoint.Resolver
	// Dialer connects to destinations (nil: a *net.Dialer); a *net.Dialer
	// is wrapped to check each address it connects to (checkedDialer).
	Dialer Dialer

	// HeaderTimeout bounds reading a stream header.
	HeaderTimeout time.Duration
	// DialTimeout bounds a dial, waiting for a dial slot included.
	DialTimeout        time.Duration
	MaxConcurrentDials int
	// MaxDialsPerDestination bounds concurrent dials to one address, so a
	// slow or blackholed destination cannot take every dial slot; more wait
	// (within DialTimeout) without holding one. 0: a quarter of
	// MaxConcurrentDials, at least 1.
	MaxDialsPerDestination int
	// ReplayWindow is how far a header's time may be from ours; headers
	// within it are recorded (MaxReplayEntries) to refuse a second use.
	ReplayWindow     time.Duration
	MaxReplayEntries int
	// MaxReplayEntriesPerConn bounds the nonces one connection records per
	// ReplayWindow (ConnState), so one client cannot fill the cache.
	// 0: MaxReplayEntries/64, at least 1.
	MaxReplayEntriesPerConn int
	// AuditLog logs one line per tunnel at -v 0 once its header is verified:
	// who (identity), from where, to what, result, bytes and duration.
	AuditLog bool

	// MaxUDPFlows bounds the UDP flows open on the server, and
	// MaxUDPFlowsPerConn those of one connection; UDPIdleTimeout ends a
	// flow without packets either way.
	MaxUDPFlows        int
	MaxUDPFlowsPerConn int
	// MaxUDPFlowsPerIdentity is one client identity's share of MaxUDPFlows:
	// the flows of all connections of one client certificate's common name
	// or named key (Key.Name), or, for a client with neither, of one source
	// (see flowAccount), so that one client cannot take every flow; past
	// it, its flows are refused with overloaded. 0:
	// DefaultUDPFlowsPerIdentity, a quarter of MaxUDPFlows, at least
	// MaxUDPFlowsPerConn.
	MaxUDPFlowsPerIdentity int
	UDPIdleTimeout         time.Duration
	// UDPSocketMemory bounds the receive buffers of all flow sockets, as the
	// kernel books them (0: udpflow.MaxSocketMemory); each starts at
	// udpflow.InitialFlowBuffer and grows with its flow's rate.
	UDPSocketMemory int64

	// Binder serves reverse forward requests (proto.KindReverse) once
	// their header is verified; nil: they are refused as unsupported.
	Binder Binder
	// Reverse: this Handler serves the streams of reverse forwards (on the
	// client, toward its declared destinations): only tcp and udp streams,
	// and its tunnels show the direction "reverse" (/tunnels, audit line).
	Reverse bool

	// KeyHook, if set, is asked for the key of a header's key ID that
	// Keys does not hold (pkg/authhook, --auth-hook). Its error wraps
	// proto.ErrUnknownKey when it has no such key (authentication fails);
	// any other error (the hook down, slow or busy) refuses the stream
	// with overloaded, fail closed, and the client tries again. Only with
	// Keys (shared-secret authentication).
	KeyHook KeyHook
	// CertHook, if set, is asked about the client certificate of every
	// stream whose connection presented one (mutual TLS; pkg/authhook,
	// --auth-hook): after the header's key (held, or answered by KeyHook),
	// before anything else. Its error wraps ErrCertRefused when the hook
	// says no (authentication fails: auth_failed, the connection closed);
	// any other error refuses the stream with overloaded, as KeyHook's.
	CertHook CertHook

	// Accounts, if set, count each identity's tunnels, bytes and refused
	// destinations, and refuse the tunnels of a suspended identity
	// (CodeSuspended); nil: nothing is accounted.
	Accounts Accounts

	// Resume, if set, keeps the tunnels whose header asks for it
	// resumable and serves resume requests (--resume-window); nil: such
	// headers open plain tunnels, resume requests are refused.
	Resume *Resume

	// Endpoint names the listener in the tunnel registry.
	Endpoint string
	// Events are told what happens to streams (the daemon's metrics).
	Events   Events
	Registry *tunnel.Registry
}

// DefaultConfig returns the defaults of the limits and timeouts (the rules,
// the parser and the dependencies are left empty).
func DefaultConfig() Config {
	return Config{
		HeaderTimeout:      10 * time.Second,
		DialTimeout:        10 * time.Second,
		MaxConcurrentDials: 256,
		ReplayWindow:       2 * time.Minute,
		MaxReplayEntries:   1 << 20,
		MaxUDPFlows:        DefaultMaxUDPFlows,
		MaxUDPFlowsPerConn: DefaultMaxUDPFlowsPerConn,
		UDPIdleTimeout:     DefaultUDPIdleTimeout,
	}
}

// orDefault sets *v to def when it is zero or negative (unset).
func orDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// complete fills the fields of c left zero with their defaults.
func (c *Config) complete() {
	def := DefaultConfig()
	orDefault(&c.HeaderTimeout, def.HeaderTimeout)
	orDefault(&c.DialTimeout, def.DialTimeout)
	orDefault(&c.MaxConcurrentDials, def.MaxConcurrentDials)
	orDefault(&c.MaxDialsPerDestination, max(1, c.MaxConcurrentDials/4))
	orDefault(&c.ReplayWindow, def.ReplayWindow)
	orDefault(&c.MaxReplayEntries, def.MaxReplayEntries)
	orDefault(&c.MaxReplayEntriesPerConn, max(1, c.MaxReplayEntries/64))
	orDefault(&c.MaxUDPFlows, def.MaxUDPFlows)
	orDefault(&c.MaxUDPFlowsPerConn, def.MaxUDPFlowsPerConn)
	orDefault(&c.MaxUDPFlowsPerIdentity, DefaultUDPFlowsPerIdentity(c.MaxUDPFlows, c.MaxUDPFlowsPerConn))
	orDefault(&c.UDPIdleTimeout, def.UDPIdleTimeout)
	if c.UDPSocketMemory <= 0 {
		c.UDPSocketMemory = udpflow.MaxSocketMemory()
	}
	if c.Dialer == nil {
		c.Dialer = &net.Dialer{}
	}
}

// Handler serves tunnel streams of every connection of a server: the part of
// the server that runs after a stream was accepted. Safe for concurrent use.
type Handler struct {
	cfg   Config
	dials chan struct{}
	// started bounds what 0-RTT may carry at once: the replay cache is in
	// memory, so a header made before this process started cannot be checked
	// against it (settleEarly waits for its handshake).
	started time.Time
	replay  *replayCache

	// policy is what a reload changes while the server runs (Reconfigure,
	// SetKeys, SetAllowList): keys and rules, swapped together; a stream
	// uses the policy it loaded at its header. policyMu serialises writers.
	policy   atomic.Pointer[policy]
	policyMu sync.Mutex

	dialsMu     sync.Mutex
	dialsByDest map[string]*destSlots

	udpFlows atomic.Int64 // UDP flows open, for MaxUDPFlows
	// flowShares counts the UDP flows open by account, for
	// MaxUDPFlowsPerIdentity.
	flowShares shares
	// udpSockets bounds the flow sockets' receive buffers, udpQueues the
	// packets queued between them and the client.
	udpSockets, udpQueues *udpflow.Budget

	// refusals, authFailures and hookFailures choose which refused
	// destinations (by reason and destination), failed authentications (by
	// source address) and failed auth hook lookups (by error) are logged
	// at -v 0; the rest go to -v 2.
	refusals, authFailures, hookFailures *lograte.Limiter
}

// LogInterval is how often the same refused destination, or failed
// authentication from one address, is logged at -v 0 (with the number left
// out); at most logKinds distinct ones are logged per interval.
const (
	LogInterval = time.Minute
	logKinds    = 64
)

// Defaults of the UDP flow limits.
const (
	DefaultMaxUDPFlows        = 1024
	DefaultMaxUDPFlowsPerConn = 256
	DefaultUDPIdleTimeout     = time.Minute
	// DefaultUDPQueueMemory bounds the packets all flows hold between their
	// sockets and the client (each flow at most udpflow.DefaultQueueBytes).
	DefaultUDPQueueMemory = 64 << 20
)

// DefaultUDPFlowsPerIdentity is MaxUDPFlowsPerIdentity when it is not set: a
// quarter of the server's flows, so that at least four identities share
// them, and at least one connection's.
func DefaultUDPFlowsPerIdentity(maxUDPFlows, perConn int) int {
	return max(perConn, maxUDPFlows/4)
}

// destSlots is the dial semaphore of one destination, shared by its waiters.
type destSlots struct {
	slots chan struct{}
	refs  int
}

// New returns a Handler for cfg, its zero fields filled with their
// defaults (Config returns the result).
func New(cfg Config) (*Handler, error) {
	switch {
	case cfg.Parser == nil:
		return nil, errors.New("egress: token parser is required")
	case cfg.Allow == nil:
		return nil, errors.New("egress: allow-list is required")
	case cfg.Events == nil || cfg.Registry == nil:
		return nil, errors.New("egress: events and registry are required")
	}
	cfg.complete()
	e := &Handler{
		cfg:         cfg,
		dials:       make(chan struct{}, cfg.MaxConcurrentDials),
		started:     time.Now(),
		replay:      newReplayCache(cfg.ReplayWindow, cfg.MaxReplayEntries),
		dialsByDest: map[string]*destSlots{},
		flowShares:  shares{open: map[string]int{}},
		udpSockets:  udpflow.NewBudget(cfg.UDPSocketMemory, udpflow.GaugeFunc(cfg.Events.UDPSocketBuffers)),
		udpQueues:   udpflow.NewBudget(DefaultUDPQueueMemory, udpflow.GaugeFunc(cfg.Events.UDPQueued)),

		refusals:     lograte.New(LogInterval, logKinds),
		authFailures: lograte.New(LogInterval, logKinds),
		hookFailures: lograte.New(LogInterval, logKinds),
	}
	e.replay.onSize = cfg.Events.ReplayCacheSize
	e.cfg.Dialer = checkedDialer(cfg.Dialer, func() *endpoint.AllowList { return e.policy.Load().all })
	e.Reconfigure(Policy{Keys: cfg.Keys, Allow: cfg.Allow, AllowFor: cfg.AllowFor})
	return e, nil
}

// Close stops the Handler's timers (the replay cache's sweeper). Streams
// still in progress are not affected.
func (e *Handler) Close() { e.replay.stop() }

// direction is the direction of the Handler's tunnels (tunnel.Forward or
// tunnel.Reverse).
func (e *Handler) direction() string {
	if e.cfg.Reverse {
		return tunnel.Reverse
	}
	return tunnel.Forward
}

// Config returns the settings in use: the Config given to New, its zero
// fields filled with their defaults.
func (e *Handler) Config() Config { return e.cfg }

// Keys are the shared secrets in force.
func (e *Handler) Keys() *proto.Keyring { return e.policy.Load().keys }

// Policy is what a reload changes while the server runs; Reconfigure
// applies it whole.
type Policy struct {
	// Keys are the shared secrets (Config.Keys).
	Keys *proto.Keyring
	// Allow and AllowFor are the destination rules (Config.Allow and
	// Config.AllowFor).
	Allow    *endpoint.AllowList
	AllowFor map[string]*endpoint.AllowList
	// CutRemovedKeys resets, with auth_failed, the open tunnels and UDP
	// flows of the keys Keys no longer holds (a key is its secret: one
	// replaced under the same name is removed), and refuses their streams
	// still being checked; otherwise they run until they end.
	CutRemovedKeys bool
}

// Reconfigure replaces the shared secrets and the destination rules in one
// step, for streams whose header arrives from now on: a stream is checked
// against the keys and rules of one configuration, never the keys of one
// and the rules of another. Tunnels already open keep running, unless
// p.CutRemovedKeys cuts those of removed keys. Config.Self stays refused.
func (e *Handler) Reconfigure(p Policy) {
	e.policyMu.Lock()
	defer e.policyMu.Unlock()
	e.store(p.Keys, p.Allow, p.AllowFor, p.CutRemovedKeys)
}

// SetKeys replaces the shared secrets for headers verified from now on,
// keeping the rules; tunnels of removed keys keep running.
func (e *Handler) SetKeys(kr *proto.Keyring) {
	e.policyMu.Lock()
	defer e.policyMu.Unlock()
	cur := e.policy.Load()
	e.store(kr, cur.allow, cur.allowFor, false)
}

// SetAllowList replaces the destination rules (all: for every client;
// forIdentity: see Config.AllowFor) for streams whose header arrives from now
// on, keeping the keys; tunnels already open are not affected. Config.Self
// stays refused.
func (e *Handler) SetAllowList(all *endpoint.AllowList, forIdentity map[string]*endpoint.AllowList) {
	e.policyMu.Lock()
	defer e.policyMu.Unlock()
	e.store(e.policy.Load().keys, all, forIdentity, false)
}

// errKeyRemoved is why a key's tunnels are cut.
var errKeyRemoved = errors.New("its key was removed by a reload (--cut-removed-keys)")

// store makes the policy of kr and the rules, with Config.Self refused, the
// one in force, then cuts the keys it removed if cut. Call it with
// policyMu held.
func (e *Handler) store(kr *proto.Keyring, all *endpoint.AllowList, forIdentity map[string]*endpoint.AllowList, cut bool) {
	prev := e.policy.Load()
	p := &policy{keys: kr, allow: all, allowFor: forIdentity, all: all.WithSelf(nil, e.cfg.Self...),
		byIdentity: make(map[string]*endpoint.AllowList, len(forIdentity)), lives: make(map[keyDigest]keyLife, kr.Len())}
	for id, a := range forIdentity {
		p.byIdentity[id] = a.WithSelf(nil, e.cfg.Self...)
	}
	for _, k := range kr.Keys() {
		d := k.Digest()
		if l, ok := prev.life(k); ok {
			p.lives[d] = l
			continue
		}
		ctx, cancel := context.WithCancelCause(context.Background())
		p.lives[d] = keyLife{ctx: ctx, cut: cancel}
	}
	e.policy.Store(p)
	if !cut || prev == nil {
		return
	}
	// After the swap: a stream that loads the new policy is refused the
	// removed key at its MAC check; one that loaded the old one meets the
	// cancelled context before it dials or once its tunnel runs.
	for id, l := range prev.lives {
		if _, kept := p.lives[id]; !kept {
			l.cut(errKeyRemoved)
		}
	}
}

// KeyHook looks up keys the server does not hold (Config.KeyHook).
type KeyHook interface {
	Lookup(ctx context.Context, id proto.KeyID) (proto.Key, error)
}

// KeyRulesHook is a KeyHook whose answers can carry destination rules for
// the key's identity, key=NAME. The Handler uses LookupRules instead of
// Lookup when its KeyHook has it: the rules (nil: none) apply to the
// stream as Config.AllowFor's for key=NAME would, added to Allow and to
// AllowFor's own for that identity; the deny rules and Config.Self still
// refuse. They are taken on each lookup, so a later answer changes them
// for the streams that follow.
type KeyRulesHook interface {
	LookupRules(ctx context.Context, id proto.KeyID) (proto.Key, *endpoint.AllowList, error)
}

// CertHook asks about client certificates (Config.CertHook).
type CertHook interface {
	// LookupCert tells whether cert, the client certificate of identity
	// ("CN=NAME"; "" for a certificate without a common name), may
	// authenticate, and the destination rules the answer gives that
	// identity (nil: none): they apply to the stream as Config.AllowFor's
	// for it would, added to Allow and AllowFor's own; the deny rules and
	// Config.Self still refuse.
	LookupCert(ctx context.Context, identity string, cert *x509.Certificate) (*endpoint.AllowList, error)
}

// ErrCertRefused is wrapped by a CertHook's error when the hook refused
// the certificate.
var ErrCertRefused = errors.New("the auth hook refused the client certificate")

// Conn is what the Handler uses of a stream's connection: a *quic.Conn, or
// a *tcpmux.Conn (the TCP fallback, which has no datagrams and no 0-RTT).
type Conn interface {
	Context() context.Context
	RemoteAddr() net.Addr
	HandshakeComplete() <-chan struct{}
	ConnectionState() quic.ConnectionState
	CloseWithError(quic.ApplicationErrorCode, string) error
}

// TunnelStream is what the Handler uses of a stream: a *quic.Stream or a
// *tcpmux.Stream.
type TunnelStream interface {
	splice.Stream
	StreamID() quic.StreamID
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// ConnState is what the Handler keeps per QUIC connection: its quota in the
// replay cache.
type ConnState struct {
	quota *replayQuota
	// identity is who the connection's client proved to be, with its
	// latest verified header (Identity).
	identity atomic.Pointer[string]
	// peer is the client certificate, read once the handshake is complete
	// (peerOf): it does not change after it, and quic-go's ConnectionState
	// is a large copy (and on a new stream's goroutine a stack growth) that
	// a new tunnel need not pay for.
	peer atomic.Pointer[peer]
}

// peerOf returns the client certificate of conn, the connection s is the
// state of, kept once its handshake is complete (before it, a 0-RTT
// stream's, it is read each time). A nil s reads it each time.
func (s *ConnState) peerOf(conn Conn) peer {
	if s == nil {
		return peerOf(conn)
	}
	if p := s.peer.Load(); p != nil {
		return *p
	}
	complete := transport.HandshakeComplete(conn) // before the read: its answer is the handshake's
	p := peerOf(conn)
	if complete {
		s.peer.Store(&p)
	}
	return p
}

// Identity is who the connection's client proved to be with its latest
// verified header: "CN=NAME" of its certificate and "key=NAME" of its shared
// secret, comma-separated. Before a verified header it is what the
// handshake showed (a client certificate's "CN=NAME"), else "".
func (s *ConnState) Identity(conn Conn) string {
	if id := s.identity.Load(); id != nil {
		return *id
	}
	return strings.Join(s.peerOf(conn).identities(""), ",")
}

// verified records the identities a verified header proved.
func (s *ConnState) verified(identities []string) {
	id := strings.Join(identities, ",")
	s.identity.Store(&id)
}

// NewConn returns the state of a new connection.
func (e *Handler) NewConn() *ConnState {
	return &ConnState{quota: newReplayQuota(e.cfg.MaxReplayEntriesPerConn, time.Now())}
}

// Stream is one accepted tunnel stream and what its connection knows.
type Stream struct {
	Conn   Conn
	ConnID uint64
	Stream TunnelStream
	// Early: the stream arrived before the handshake completed (0-RTT).
	Early bool
	// Prober, if set, is kicked by the splice (tail-loss probes).
	Prober *liveness.TailProber
	// Conn0 is the connection's state (NewConn).
	Conn0 *ConnState
	// MACVerified, if set, is called once the header's MAC is verified (at
	// once without shared-secret authentication), before its freshness,
	// replay and destination checks: the header was made with the secret,
	// but a stale or replayed copy proves nothing about the peer.
	MACVerified func()
	// Verified, if set, is called once the header has proven the secret:
	// its MAC, freshness and replay checks passed (a tunnel's replay check
	// comes after its destination's, so a refused header does not call it).
	Verified func()
	// Flows routes the connection's UDP flow datagrams; nil: UDP flows
	// are refused as unsupported.
	Flows *udpflow.Table
	// Source is the connection's source (an IPv4 address or an IPv6 /64,
	// as the server's per-source limits count it): the UDP flow account of
	// a client with no identity of its own (flowAccount); "": the
	// connection's ID.
	Source string
}

// CloseConn closes conn with code. Before the handshake is complete (a
// 0-RTT stream, or a connection refused as soon as it is accepted) QUIC
// carries an application's close only as a bare APPLICATION_ERROR: it waits
// for the handshake, at most a second, so the client learns the code (that
// its credentials were refused, say). The handshake's cost is already spent.
func CloseConn(ctx context.Context, conn Conn, code proto.Code, reason string) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-conn.HandshakeComplete():
	case <-conn.Context().Done():
	case <-ctx.Done():
	case <-t.C:
	}
	_ = conn.CloseWithError(code.ApplicationErrorCode(), reason)
}

// Reset aborts both directions of str with code.
func Reset(str TunnelStream, code proto.Code) {
	str.CancelRead(code.StreamErrorCode())
	str.CancelWrite(code.StreamErrorCode())
}

// policy is the configuration a stream is checked against: the shared
// secrets, and the destination rules for everyone and by identity.
type policy struct {
	keys       *proto.Keyring
	all        *endpoint.AllowList
	byIdentity map[string]*endpoint.AllowList
	// allow and allowFor are the rules as given (without Config.Self).
	allow    *endpoint.AllowList
	allowFor map[string]*endpoint.AllowList
	// lives holds a context per key (by Key.Digest: 4-byte IDs may
	// collide among thousands of keys), cancelled when a reload removes
	// the key with Policy.CutRemovedKeys.
	lives map[keyDigest]keyLife
	// hooked are the rules auth hook answers gave the stream's key
	// (KeyRulesHook) and its certificate (CertHook), with all's deny
	// rules and listeners, each for its identity ("key=NAME", "CN=NAME");
	// none in the policy in force, set on a copy for one stream
	// (withHooked).
	hooked []hookedRules
}

// hookedRules are the rules a hook's answer gave identity.
type hookedRules struct {
	identity string
	rules    *endpoint.AllowList
}

// withHooked returns a copy of p that also allows what rules (a hook's
// answer for identity) allow, as AllowFor's rules for identity would:
// all's deny rules and the server's listeners still refuse. The copy is
// shallow (the maps are shared, never written after store; hooked is
// copied, at most two long).
func (p *policy) withHooked(identity string, rules *endpoint.AllowList) *policy {
	c := *p
	c.hooked = append(p.hooked[:len(p.hooked):len(p.hooked)], hookedRules{identity: identity, rules: p.all.WithAllowOf(rules)})
	return &c
}

// keyDigest tells keys apart (proto.Key.Digest).
type keyDigest = [32]byte

// keyLife is how long a key's tunnels may run.
type keyLife struct {
	// ctx is a lifetime, not a request's: tunnels watch it with
	// context.AfterFunc.
	ctx context.Context
	cut context.CancelCauseFunc
}

// life returns the lifetime of key k (false: p is nil or has no such key).
func (p *policy) life(k proto.Key) (keyLife, bool) {
	if p == nil || len(k.Secret) == 0 {
		return keyLife{}, false
	}
	l, ok := p.lives[k.Digest()]
	return l, ok
}

// authorize checks dest against the rules for everyone and then, if none of
// them allows it, those of each of the stream's identities, then those
// auth hook answers gave its key and certificate (withHooked). A refusal other than "no rule allows
// it" (deny, reserved, self, unresolved) is final.
func (p *policy) authorize(ctx context.Context, r endpoint.Resolver, dest endpoint.Endpoint, identities []string) (endpoint.Endpoint, string, error) {
	dial, rule, err := p.all.Authorize(ctx, r, dest)
	if err == nil || endpoint.RefusalReason(err) != endpoint.ReasonNotAllowed {
		return dial, rule, err
	}
	for _, id := range identities {
		if d, r2, done, err2 := authorizeFor(ctx, p.byIdentity[id], id, r, dest); done {
			return d, r2, err2
		}
	}
	for _, h := range p.hooked {
		if d, r2, done, err2 := authorizeFor(ctx, h.rules, h.identity, r, dest); done {
			return d, r2, err2
		}
	}
	return dial, rule, err
}

// authorizeFor checks dest against identity's rules a (nil: none): done is
// false when they do not decide (none of them allows it).
func authorizeFor(ctx context.Context, a *endpoint.AllowList, identity string, r endpoint.Resolver, dest endpoint.Endpoint) (endpoint.Endpoint, string, bool, error) {
	if a == nil {
		return endpoint.Endpoint{}, "", false, nil
	}
	d, rule, err := a.Authorize(ctx, r, dest)
	if err == nil {
		return d, identity + ":" + rule, true, nil
	}
	return d, rule, endpoint.RefusalReason(err) != endpoint.ReasonNotAllowed, err
}

// hello answers a hello (proto.KindHello) whose MAC was verified: the same
// freshness and replay checks as a tunnel's header, then st.Verified, CodeOK
// and the end of the stream.
// A hello is no tunnel: it is not counted in streams_total, audited or
// registered.
func (e *Handler) hello(st Stream, h *proto.Header, keyName string, logger klog.Logger) {
	str := st.Stream
	str.CancelRead(proto.CodeOK.StreamErrorCode()) // nothing follows the header
	now := time.Now()
	code, unrecorded := e.replay.admit(h, now, st.Early, st.Conn0.quota) // settled (settleEarly)
	if unrecorded != "" {
		e.cfg.Events.ReplayUnrecorded(unrecorded)
	}
	if code != proto.CodeOK {
		str.CancelWrite(code.StreamErrorCode())
		logger.V(2).Info("Refused hello", "code", code.String(), "early", st.Early, "headerTime", h.Time)
		return
	}
	st.Conn0.verified(st.Conn0.peerOf(st.Conn).identities(keyName))
	if st.Verified != nil {
		st.Verified()
	}
	_ = str.SetWriteDeadline(now.Add(e.cfg.HeaderTimeout))
	if err := proto.WriteReply(str, proto.CodeOK); err != nil {
		str.CancelWrite(proto.CodeConnReset.StreamErrorCode())
		return
	}
	_ = str.Close()
	logger.V(4).Info("Accepted hello", "early", st.Early)
}

// refusal returns how to log a destination refused by err: at -v 0 with the
// fix, once a minute per reason and destination (the client's application
// only sees a reset), else at -v 2.
func (e *Handler) refusal(dest endpoint.Endpoint, identities []string, err error) (lvl int, msg string, kv []any) {
	reason := endpoint.RefusalReason(err)
	lvl, kv = 2, []any{"destination", dest.String(), "reason", reason, "identity", strings.Join(identities, ","), "err", err}
	if ok, n := e.refusals.Allow(reason + " " + dest.String()); ok {
		lvl, kv = 0, append(kv, "suppressed", n)
	}
	if reason == endpoint.ReasonNotAllowed {
		kv = append(kv, "allowRule", dest.String())
	}
	return lvl, "Refused destination: " + RefusalFix(reason), kv
}

// check answers a check (proto.KindCheck) whose MAC was verified by key of
// pol (the policy its stream loaded) and which is fresh: whether pol's
// rules admit its destination for identities, without dialing it, then the
// replay check; CodeOK and the end of the stream, or a reset with the code
// of the failure (auth_failed if a reload has removed key with
// Policy.CutRemovedKeys since, as a tunnel's). The order is a tunnel's: a
// check with a bad token or a destination the rules refuse takes no place
// in the replay cache and does not verify its connection (a refused header
// proves nothing, SECURITY.md). Like a hello it is no tunnel: not counted
// in streams_total, audited or registered; a refused destination is logged
// and counted in refused_destinations_total as a tunnel's.
func (e *Handler) check(ctx context.Context, st Stream, h *proto.Header, pol *policy, key proto.Key, identities []string, logger klog.Logger) {
	str := st.Stream
	str.CancelRead(proto.CodeOK.StreamErrorCode()) // nothing follows the header
	dest, err := e.cfg.Parser.Parse(h.Token)
	if err != nil {
		str.CancelWrite(proto.CodeBadToken.StreamErrorCode())
		logger.V(2).Info("Refused check: bad destination token", "err", err)
		return
	}
	_, rule, err := pol.authorize(ctx, e.cfg.Resolver, dest, identities)
	if err != nil {
		str.CancelWrite(proto.CodeRefused.StreamErrorCode())
		e.cfg.Events.DestinationRefused(dest.Network, endpoint.RefusalReason(err))
		if e.cfg.Accounts != nil {
			e.cfg.Accounts.Account(strings.Join(identities, ",")).Refused()
		}
		lvl, msg, kv := e.refusal(dest, identities, err)
		logger.V(lvl).Info(msg, append(kv, "check", true)...)
		return
	}
	code, unrecorded := e.replay.admit(h, time.Now(), st.Early, st.Conn0.quota)
	if unrecorded != "" {
		e.cfg.Events.ReplayUnrecorded(unrecorded)
	}
	if code != proto.CodeOK {
		str.CancelWrite(code.StreamErrorCode())
		logger.V(2).Info("Refused check", "code", code.String(), "early", st.Early, "headerTime", h.Time)
		return
	}
	st.Conn0.verified(identities)
	if st.Verified != nil {
		st.Verified()
	}
	if l, ok := pol.life(key); ok && pol.keys.Len() > 0 && context.Cause(l.ctx) != nil {
		str.CancelWrite(proto.CodeAuthFailed.StreamErrorCode())
		logger.V(2).Info("Refused check: a reload removed its key; the client needs a key the server holds", "cause", context.Cause(l.ctx))
		return
	}
	logger.V(4).Info("Answered check: allowed", "destination", dest.String(), "rule", rule)
	_ = str.SetWriteDeadline(time.Now().Add(e.cfg.HeaderTimeout))
	if err := proto.WriteReply(str, proto.CodeOK); err != nil {
		str.CancelWrite(proto.CodeConnReset.StreamErrorCode())
		return
	}
	_ = str.Close()
}

// cutOnRemoval aborts a (a tunnel or a UDP flow: what) with auth_failed when
// its key's lifetime ends (Policy.CutRemovedKeys), at once if it has ended,
// logging with what logger makes then; the returned function stops watching.
func cutOnRemoval(keyLife context.Context, a tunnel.Aborter, logger func() klog.Logger, what string) func() bool {
	return context.AfterFunc(keyLife, func() {
		logger().V(2).Info("Cut "+what+": a reload removed its key (--cut-removed-keys)", "cause", context.Cause(keyLife))
		a.Abort(proto.CodeAuthFailed)
	})
}

// peer is who a connection's client certificate says the client is (mutual
// TLS); empty without one.
type peer struct {
	subject string // the certificate's subject, e.g. "CN=ci-runner,O=Example"
	cn      string // its common name
	cert    *x509.Certificate
}

// peerOf reads the client certificate of c.
func peerOf(c Conn) peer {
	certs := c.ConnectionState().TLS.PeerCertificates
	if len(certs) == 0 {
		return peer{}
	}
	return peer{subject: certs[0].Subject.String(), cn: certs[0].Subject.CommonName, cert: certs[0]}
}

// identities are the names a stream's client goes by in Config.AllowFor and
// logs: "CN=NAME" for a client certificate, "key=NAME" for the shared-secret
// key its header was made with.
func (p peer) identities(keyName string) []string {
	var ids []string
	if p.cn != "" {
		ids = append(ids, "CN="+p.cn)
	}
	if keyName != "" {
		ids = append(ids, "key="+keyName)
	}
	return ids
}

// RefusalFix says why a destination refused for reason
// (endpoint.RefusalReason) was refused and what to change if clients should
// reach it.
func RefusalFix(reason string) string {
	switch reason {
	case endpoint.ReasonNotAllowed:
		return "no --allow rule admits it; if clients should reach it, add allowRule to the server's --allow (or --allow-for IDENTITY=allowRule for one client) and reload"
	case endpoint.ReasonDenied:
		return "a --deny rule matches it (deny wins over --allow); narrow that --deny rule if clients should reach it"
	case endpoint.ReasonReserved:
		return "0.0.0.0/8, :: and cloud metadata addresses are never reachable, unless an --allow rule names the metadata address exactly"
	case endpoint.ReasonSelf:
		return "it is the server's own QUIC or admin listener, which no rule can allow; point the client's forward elsewhere"
	case endpoint.ReasonUnresolved:
		return "the server could not resolve its name; check the name in the client's forward and the server's DNS"
	}
	return "not allowed"
}

// authFailureFix says what most likely caused an authentication failure of
// reason (Auth*) and what to check.
func authFailureFix(reason string) string {
	switch reason {
	case AuthNoMAC:
		return "the client has no --secret-file; give it the server's secret"
	case AuthUnknownKey:
		return "the client's secret is none of the server's (a wrong --secret-file, or a key removed from --keys-file); give the client the server's secret"
	}
	return "the header's MAC does not match (a wrong secret on a client from before key IDs, or a forged header); give the client the server's secret"
}

// sourceOf is the address a connection comes from, without its port: one
// client host's failures count as one.
func sourceOf(c Conn) string {
	switch a := c.RemoteAddr().(type) {
	case *net.UDPAddr:
		return a.IP.String()
	case *net.TCPAddr:
		return a.IP.String()
	}
	return c.RemoteAddr().String()
}

// keyIDOf returns the key ID a header names, in hex, or "" for none.
func keyIDOf(h *proto.Header) string {
	if !h.HasKeyID {
		return ""
	}
	return h.KeyID.String()
}

// destination returns dest's dial semaphore, counting the caller as a user
// until releaseDestination.
func (e *Handler) destination(dest string) *destSlots {
	e.dialsMu.Lock()
	defer e.dialsMu.Unlock()
	d := e.dialsByDest[dest]
	if d == nil {
		d = &destSlots{slots: make(chan struct{}, e.cfg.MaxDialsPerDestination)}
		e.dialsByDest[dest] = d
	}
	d.refs++
	return d
}

// releaseDestination ends a use of dest's semaphore, freeing a slot if held.
func (e *Handler) releaseDestination(dest string, held bool) {
	e.dialsMu.Lock()
	defer e.dialsMu.Unlock()
	d := e.dialsByDest[dest]
	if held {
		<-d.slots
	}
	if d.refs--; d.refs == 0 {
		delete(e.dialsByDest, dest)
	}
}

// checkedDialer makes a *net.Dialer check, with allow.CheckDial, every
// address it connects to after its own name resolution: a destination that
// an exact host-name rule allowed is dialed by name, and whatever the name
// resolves to then must still not be the server itself, a reserved address
// or a denied one. Other Dialers (test fakes) are returned unchanged; the
// IP addresses Authorize returns were checked already.
func checkedDialer(d Dialer, allow func() *endpoint.AllowList) Dialer {
	nd, ok := d.(*net.Dialer)
	if !ok {
		return d
	}
	c := *nd // copy: the caller's dialer is left alone
	prevCtx, prev := nd.ControlContext, nd.Control
	c.ControlContext = func(ctx context.Context, network, address string, rc syscall.RawConn) error {
		if ap, err := netip.ParseAddrPort(address); err == nil {
			if err := allow().CheckDial(network, ap); err != nil {
				return err
			}
		}
		switch {
		case prevCtx != nil:
			return prevCtx(ctx, network, address, rc)
		case prev != nil:
			return prev(network, address, rc)
		}
		return nil
	}
	return &c
}

// transportOf names what carries c's streams for /tunnels: "quic", or
// "tcp" for a connection without datagrams (pkg/tcpmux).
func transportOf(c Conn) string {
	if _, ok := c.(udpflow.DatagramConn); ok {
		return "quic"
	}
	return "tcp"
}

// ClientSubject is the subject of c's client certificate (mutual TLS), or "".
func ClientSubject(c Conn) string { return peerOf(c).subject }
