package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/lograte"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
)

// Defaults of the reverse forward limits.
const (
	DefaultMaxRemoteListens        = 256
	DefaultMaxRemoteListensPerConn = 16
	// DefaultReverseConnections bounds the connections and UDP flows one
	// reverse forward's listener carries at once.
	DefaultReverseConnections = 1024
	// DefaultReverseUDPQueueMemory bounds the packets one reverse
	// forward's UDP flows queue toward the client.
	DefaultReverseUDPQueueMemory = 4 << 20
)

// DefaultRemoteListensPerIdentity is MaxRemoteListensPerIdentity when it is
// not set: an eighth of the server's listeners, so that at least eight
// identities share them, and at least one connection's share.
func DefaultRemoteListensPerIdentity(maxRemoteListens, perConn int) int {
	return max(perConn, maxRemoteListens/8)
}

// Reasons a reverse forward request is refused: the reason label of
// quictun_server_refused_remote_listens_total.
const (
	// RemoteListenNotAllowed: no --allow-remote-listen rule admits the
	// address for this client (refused).
	RemoteListenNotAllowed = "not_allowed"
	// RemoteListenReservedPort: the port is one the server itself listens
	// on, at any address, on TCP or UDP (refused).
	RemoteListenReservedPort = "reserved_port"
	// RemoteListenAddrInUse: another client's binding, or another program,
	// holds the address (addr_in_use).
	RemoteListenAddrInUse = "addr_in_use"
	// RemoteListenServerLimit: the server holds MaxRemoteListens (overloaded).
	RemoteListenServerLimit = "server_limit"
	// RemoteListenConnLimit: the connection holds MaxRemoteListensPerConn
	// (overloaded).
	RemoteListenConnLimit = "conn_limit"
	// RemoteListenIdentityLimit: the client's identity holds
	// MaxRemoteListensPerIdentity (overloaded).
	RemoteListenIdentityLimit = "identity_limit"
	// RemoteListenNeedsQUIC: the client's connection carries no streams
	// toward it (none does now: reverse forwards run over QUIC and TCP;
	// kept so the series stays).
	RemoteListenNeedsQUIC = "needs_quic"
	// RemoteListenBadAddress: the listen address does not parse (bad_token).
	RemoteListenBadAddress = "bad_address"
	// RemoteListenFailed: the server could not listen there (internal).
	RemoteListenFailed = "listen_failed"
)

// RemoteListenRefusalReasons lists the reasons a reverse forward request is
// refused, for pre-creating the metric's series.
func RemoteListenRefusalReasons() []string {
	return []string{RemoteListenNotAllowed, RemoteListenReservedPort, RemoteListenAddrInUse, RemoteListenServerLimit,
		RemoteListenConnLimit, RemoteListenIdentityLimit, RemoteListenNeedsQUIC, RemoteListenBadAddress, RemoteListenFailed}
}

// NewRemoteListenMetrics creates and registers on reg the metrics of the
// listeners the server opens for reverse forwards (Config.RemoteListenMetrics).
func NewRemoteListenMetrics(reg prometheus.Registerer) *metrics.RemoteListens {
	return metrics.NewRemoteListens(reg, RemoteListenRefusalReasons())
}

// binder opens the listeners of reverse forwards (egress.Binder): for a
// verified client whose --allow-remote-listen rules admit the address, it
// listens there and carries each connection (or UDP flow) accepted as a
// stream toward that client with pkg/ingress (Config.Reverse), naming the
// binding (proto.BoundToken), never a destination. Safe for concurrent use.
type binder struct {
	s *Server
	// closing is cancelled when the server starts to drain: every listener
	// closes and its client is told (shutdown).
	closing context.Context
	close   context.CancelFunc
	// reserved are the ports of the server's own listeners (Config.Self:
	// QUIC, TCP, admin): no client listens on them, at any address, on TCP
	// or UDP, whatever the rules say.
	reserved map[uint16]bool
	metrics  *metrics.RemoteListens

	mu sync.Mutex
	// rules are the --allow-remote-listen rules in force (SetRemoteListen).
	rules listenRules
	// bound holds the bindings in use by listen address
	// (endpoint.String()); perConn counts each connection's, perAccount
	// each client identity's (egress.BindRequest.Account).
	bound      map[string]*binding
	perConn    map[uint64]int
	perAccount map[string]int

	// refusals chooses which refusals are logged at -v 0.
	refusals *lograte.Limiter
	// inherited are reverse forwards' sockets kept for their clients to
	// bind again (listen), by listen address: those the previous process
	// handed over (an upgrade of the server), until InheritedReverseGrace
	// passes, and those of a client that upgrades, for ClientUpgradeGrace
	// (held.expire).
	inherited map[string]*held
}

// listenRules are the addresses clients may bind: for everyone, and by
// identity.
type listenRules struct {
	all  *endpoint.AllowList
	byID map[string]*endpoint.AllowList
}

// binding is one reverse forward's listen address held by a connection.
type binding struct {
	connID     uint64
	ep         endpoint.Endpoint
	identities []string
	stream     egress.TunnelStream // the bind stream: its reset ends the binding
	logger     klog.Logger
	// sock is its listener or UDP socket once open (setSocket);
	// handedOver: an upgrade's new process got a duplicate of it.
	sock       any
	handedOver bool
}

// init readies b for s, before s serves.
func (b *binder) init(s *Server) {
	b.s = s
	b.closing, b.close = context.WithCancel(context.Background())
	b.rules = listenRules{all: s.cfg.AllowRemoteListen, byID: s.cfg.AllowRemoteListenFor}
	b.bound, b.perConn, b.perAccount = map[string]*binding{}, map[uint64]int{}, map[string]int{}
	b.reserved = map[uint16]bool{}
	for _, ap := range s.cfg.Self {
		if ap.Port() != 0 {
			b.reserved[ap.Port()] = true
		}
	}
	b.metrics = s.cfg.RemoteListenMetrics
	b.refusals = lograte.New(egress.LogInterval, 64)
	b.inherited = map[string]*held{}
	for key, f := range s.cfg.InheritedReverse {
		b.inherited[key] = &held{f: f}
	}
}

// errReverseNeedsQUIC refuses a reverse forward on a connection that is
// neither QUIC nor TCP (none is).
var errReverseNeedsQUIC = errors.New("reverse forwards need a QUIC or TCP connection")

// refusal is a refused reverse forward request: the code its client is
// told, the metric's reason, and the log line.
type refusal struct {
	code   proto.Code
	reason string
	msg    string
	err    error
	kv     []any
}

// refuse counts r, logs it and returns its error. A client over its share
// (conn_limit, identity_limit) is logged at -v 2, as a UDP flow over its
// identity's share is; the others at -v 0 once per interval, reason and
// address, else -v 2.
func (b *binder) refuse(req egress.BindRequest, r refusal) error {
	b.metrics.RefusedTotal.WithLabelValues(r.reason).Inc()
	lvl, kv := 2, r.kv
	if r.reason != RemoteListenConnLimit && r.reason != RemoteListenIdentityLimit {
		if ok, n := b.refusals.Allow(r.reason + " " + req.Bind.Listen); ok {
			lvl, kv = 0, append(kv, "suppressed", n)
		}
	}
	req.Logger.V(lvl).Info(r.msg, append(kv, "code", r.code.String(), "reason", r.reason, "err", r.err)...)
	return &egress.BindError{Code: r.code, Err: r.err}
}

// authorize checks ep against the rules for everyone, then those of each
// identity. Call it with mu held.
func (b *binder) authorize(ep endpoint.Endpoint, identities []string) (string, error) {
	var err error = fmt.Errorf("%w: no --allow-remote-listen rule", endpoint.ErrForbidden)
	if b.rules.all != nil {
		var rule string
		if rule, err = b.rules.all.AuthorizeListen(ep); err == nil {
			return rule, nil
		}
	}
	for _, id := range identities {
		if a := b.rules.byID[id]; a != nil {
			if rule, err2 := a.AuthorizeListen(ep); err2 == nil {
				return id + ":" + rule, nil
			}
		}
	}
	return "", err
}

// errReservedPort refuses a reverse forward on a port of the server's own
// listeners.
var errReservedPort = errors.New("the server's own listening port")

// reservedPort reports whether ep (tcp: or udp:) asks for a port the server
// itself listens on, whatever the address and family: 127.0.0.1:8086 held
// by the admin server reserves [::1]:8086 and 0.0.0.0:8086 too, and the
// QUIC port is reserved on TCP as well (the TCP fallback's default).
func (b *binder) reservedPort(ep endpoint.Endpoint) (uint16, bool) {
	if ep.Network != endpoint.NetworkTCP && ep.Network != endpoint.NetworkUDP {
		return 0, false
	}
	_, p, err := net.SplitHostPort(ep.Address)
	if err != nil {
		return 0, false
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return 0, false
	}
	return uint16(port), b.reserved[uint16(port)]
}

// Bind implements egress.Binder.
func (b *binder) Bind(ctx context.Context, req egress.BindRequest) (func(), error) {
	st := req.Stream
	ic := ingressOf(st.Conn)
	if ic == nil { // unreachable: every connection is QUIC or TCP
		return nil, b.refuse(req, refusal{code: proto.CodeUnsupported, reason: RemoteListenNeedsQUIC, err: errReverseNeedsQUIC,
			msg: "Refused a reverse forward: its connection can carry no streams toward the client"})
	}
	ep, err := endpoint.Parse(req.Bind.Listen)
	if err != nil {
		return nil, b.refuse(req, refusal{code: proto.CodeBadToken, reason: RemoteListenBadAddress, err: err,
			msg: "Refused a reverse forward: its listen address does not parse"})
	}
	rule, release, err := b.hold(req, ep)
	if err != nil {
		return nil, err
	}
	ln, pc, err := b.listen(ctx, ep, req.Logger)
	if err != nil {
		release()
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, b.refuse(req, refusal{code: proto.CodeAddrInUse, reason: RemoteListenAddrInUse, err: err,
				msg: "Refused a reverse forward: its address is in use on the server (by another program)"})
		}
		return nil, b.refuse(req, refusal{code: proto.CodeInternal, reason: RemoteListenFailed, err: err,
			msg: "Refused a reverse forward: could not listen at its address"})
	}
	b.setSocket(ep.String(), req.Stream.ConnID, ln, pc)
	unbind, err := b.serve(ctx, req, ic, ep, ln, pc)
	if err != nil {
		release()
		return nil, err
	}
	req.Logger.Info("Listening for a reverse forward", "rule", rule)
	return func() {
		if proto.IsUpgrade(context.Cause(st.Conn.Context())) {
			b.keepForUpgrade(ep, ln, pc, req.Logger) // the client's successor binds it again at once
		}
		unbind()
		release()
		req.Logger.V(2).Info("Closed a reverse forward's listener", "address", ep.String())
	}, nil
}

// hold checks a request for ep against the rules, the reserved ports, the
// bindings held and the limits, and records its binding (the refusal is
// logged and counted); release ends it. Checked and recorded under mu, so
// a reload (setRules) either comes before the check or finds the binding
// to check again.
func (b *binder) hold(req egress.BindRequest, ep endpoint.Endpoint) (rule string, release func(), err error) {
	b.mu.Lock()
	rule, r := b.admit(req, ep)
	b.mu.Unlock()
	if r != nil {
		return "", nil, b.refuse(req, *r)
	}
	key, connID := ep.String(), req.Stream.ConnID
	return rule, func() { b.unhold(key, connID, req.Account) }, nil
}

// admit checks a request for ep (see hold) and records its binding, or
// returns why not. Call it with mu held.
func (b *binder) admit(req egress.BindRequest, ep endpoint.Endpoint) (string, *refusal) {
	st, key, cfg := req.Stream, ep.String(), &b.s.cfg
	rule, err := b.authorize(ep, req.Identities)
	if err != nil {
		return "", &refusal{code: proto.CodeRefused, reason: RemoteListenNotAllowed, err: err, kv: []any{"allowRemoteListen", key},
			msg: "Refused a reverse forward: no --allow-remote-listen rule admits its address for this client; " +
				"if it may listen there, add --allow-remote-listen LISTEN (or IDENTITY=LISTEN, e.g. key=NAME=LISTEN) and reload (SIGHUP)"}
	}
	if port, ok := b.reservedPort(ep); ok {
		return "", &refusal{code: proto.CodeRefused, reason: RemoteListenReservedPort, err: errReservedPort, kv: []any{"port", port},
			msg: "Refused a reverse forward: its port is one the server itself listens on (QUIC, TCP or admin), reserved at every address; " +
				"the client must choose another port (and the rule admitting it should not span the server's ports)"}
	}
	holder, taken := b.bound[key]
	switch {
	case taken:
		return "", &refusal{code: proto.CodeAddrInUse, reason: RemoteListenAddrInUse, kv: []any{"holderConnID", holder.connID},
			err: errors.New("address bound by another connection"), msg: "Refused a reverse forward: another client's reverse forward holds its address"}
	case b.perConn[st.ConnID] >= cfg.MaxRemoteListensPerConn:
		return "", &refusal{code: proto.CodeOverloaded, reason: RemoteListenConnLimit, kv: []any{"limit", cfg.MaxRemoteListensPerConn},
			err: errors.New("too many reverse forwards on this connection"),
			msg: "Refused a reverse forward: the connection holds its share of listeners; raise --max-remote-listeners-per-conn if it needs more"}
	case b.perAccount[req.Account] >= cfg.MaxRemoteListensPerIdentity:
		return "", &refusal{code: proto.CodeOverloaded, reason: RemoteListenIdentityLimit,
			kv:  []any{"account", req.Account, "open", b.perAccount[req.Account], "limit", cfg.MaxRemoteListensPerIdentity},
			err: errors.New("too many reverse forwards for this client identity"),
			msg: "Refused a reverse forward: this client identity holds its share of the server's listeners; raise --max-remote-listeners-per-identity if it needs more"}
	case len(b.bound) >= cfg.MaxRemoteListens:
		return "", &refusal{code: proto.CodeOverloaded, reason: RemoteListenServerLimit, kv: []any{"limit", cfg.MaxRemoteListens},
			err: errors.New("too many reverse forwards"),
			msg: "Refused a reverse forward: the server holds its limit of reverse forward listeners; raise --max-remote-listeners if clients need more"}
	}
	b.bound[key] = &binding{connID: st.ConnID, ep: ep, identities: req.Identities, stream: st.Stream, logger: req.Logger}
	b.perConn[st.ConnID]++
	b.perAccount[req.Account]++
	b.metrics.Active.Set(float64(len(b.bound)))
	return rule, nil
}

// unhold ends the binding at key of connection connID and account.
func (b *binder) unhold(key string, connID uint64, account string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.bound, key)
	if b.perConn[connID]--; b.perConn[connID] <= 0 {
		delete(b.perConn, connID)
	}
	if b.perAccount[account]--; b.perAccount[account] <= 0 {
		delete(b.perAccount, account)
	}
	b.metrics.Active.Set(float64(len(b.bound)))
}

// serve carries the connections (or UDP flows) ln or pc accepts toward the
// client on ic (QUIC or TCP) until unbind, which returns once the listener is closed and
// what it started has ended; a drain closes the listener and tells the
// client (shutdown). It closes ln or pc.
func (b *binder) serve(ctx context.Context, req egress.BindRequest, ic ingress.Conn, ep endpoint.Endpoint, ln net.Listener, pc *net.UDPConn) (unbind func(), err error) {
	st := req.Stream
	h, err := ingress.New(b.s.cfg.Reverse, ingress.Links{
		Sessions: connSession{&ingress.Session{Conn: ic, Prober: st.Prober, Flows: st.Flows}},
		Tokens:   func() ingress.TokenSource { return boundToken(proto.BoundToken(req.Bind.ID)) },
		Signer:   func() *proto.Signer { return nil }, // TLS authenticated the server to the client
	})
	if err != nil { // unreachable: New checked Config.Reverse
		closeListener(ln, pc)
		return nil, &egress.BindError{Code: proto.CodeInternal, Err: err}
	}
	bctx, cancel := context.WithCancel(klog.NewContext(ctx, req.Logger)) // its audit lines name the client and the listener
	var accept, handlers sync.WaitGroup
	if pc != nil {
		accept.Go(func() { h.ServeUDP(bctx, pc, nil, &handlers) })
	} else {
		accept.Go(func() { h.Accept(bctx, ln, nil, &handlers) })
	}
	stopDrain := context.AfterFunc(b.closing, func() {
		closeListener(ln, pc)
		egress.Reset(st.Stream, proto.CodeShutdown)
	})
	return func() {
		stopDrain()
		closeListener(ln, pc)
		accept.Wait()
		cancel()
		handlers.Wait()
	}, nil
}

// setRules makes the rules the ones in force for binds from now on and
// ends the bindings they no longer admit: their bind streams are reset
// with refused, which closes their listeners (the client asks again, and
// is refused). It returns how many it ended.
func (b *binder) setRules(r listenRules) int {
	b.mu.Lock()
	b.rules = r
	var cut []*binding
	for _, bd := range b.bound {
		if _, err := b.authorize(bd.ep, bd.identities); err != nil {
			cut = append(cut, bd)
		}
	}
	b.mu.Unlock()
	for _, bd := range cut {
		bd.logger.Info("Closed a reverse forward's listener: a reload removed the --allow-remote-listen rule that admitted it", "address", bd.ep.String())
		egress.Reset(bd.stream, proto.CodeRefused)
	}
	return len(cut)
}

// ErrReverseOff is returned by SetRemoteListen with rules for a server
// started without reverse forwards: enabling them takes a restart.
var ErrReverseOff = errors.New("reverse forwards were off at start (no --allow-remote-listen): enabling them needs a restart")

// SetRemoteListen replaces the --allow-remote-listen rules (all: for every
// client; forIdentity: by identity, as Config.AllowFor) for reverse forward
// requests from now on, and closes the listeners of the bindings they no
// longer admit (logged); it returns how many. A server started without
// rules returns ErrReverseOff for rules, and nothing for none.
func (s *Server) SetRemoteListen(all *endpoint.AllowList, forIdentity map[string]*endpoint.AllowList) (int, error) {
	if s.binder == nil {
		if all != nil || len(forIdentity) > 0 {
			return 0, ErrReverseOff
		}
		return 0, nil
	}
	return s.binder.setRules(listenRules{all: all, byID: forIdentity}), nil
}

// ListenRemote opens a listener (tcp:, unix:) or a UDP socket (udp:) at ep
// (Config.ListenRemote's default).
func ListenRemote(ctx context.Context, ep endpoint.Endpoint) (net.Listener, *net.UDPConn, error) {
	var lc net.ListenConfig
	if ep.Network == endpoint.NetworkUDP {
		c, err := lc.ListenPacket(ctx, "udp", ep.Address)
		if err != nil {
			return nil, nil, err
		}
		return nil, c.(*net.UDPConn), nil
	}
	ln, err := lc.Listen(ctx, ep.Network, ep.Address)
	return ln, nil, err
}

func closeListener(ln net.Listener, pc *net.UDPConn) {
	if pc != nil {
		_ = pc.Close()
		return
	}
	_ = ln.Close()
}

// connSession is the one connection a reverse forward's streams go on.
type connSession struct{ sess *ingress.Session }

// errConnClosed: the client's connection ended; its reverse forwards with it.
var errConnClosed = errors.New("the client's connection ended")

// Wait returns the session while its connection lives.
func (c connSession) Wait(context.Context) (*ingress.Session, func(), error) {
	if c.sess.Conn.Context().Err() != nil {
		return nil, func() {}, errConnClosed
	}
	return c.sess, func() {}, nil
}

// boundToken is the token of every connection a reverse forward's listener
// accepts: the binding, never a destination.
type boundToken string

// Token returns t.
func (t boundToken) Token(context.Context, net.Addr) (string, error) { return string(t), nil }
