package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/lograte"
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

	mu sync.Mutex
	// rules are the --allow-remote-listen rules in force (SetRemoteListen).
	rules listenRules
	// bound holds the bindings in use by listen address
	// (endpoint.String()); perConn counts each connection's.
	bound   map[string]*binding
	perConn map[uint64]int

	// refusals chooses which refusals are logged at -v 0.
	refusals *lograte.Limiter
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
}

// init readies b for s, before s serves.
func (b *binder) init(s *Server) {
	b.s = s
	b.closing, b.close = context.WithCancel(context.Background())
	b.rules = listenRules{all: s.cfg.AllowRemoteListen, byID: s.cfg.AllowRemoteListenFor}
	b.bound, b.perConn = map[string]*binding{}, map[uint64]int{}
	b.refusals = lograte.New(egress.LogInterval, 64)
}

// refuse logs a refused reverse forward (at -v 0 once per interval and
// reason, else -v 2) and returns its error.
// errReverseNeedsQUIC refuses a reverse forward asked for over TCP.
var errReverseNeedsQUIC = errors.New("reverse forwards need QUIC")

func (b *binder) refuse(req egress.BindRequest, code proto.Code, msg string, err error, kv ...any) error {
	lvl := 2
	if ok, n := b.refusals.Allow(code.String() + " " + req.Bind.Listen); ok {
		lvl, kv = 0, append(kv, "suppressed", n)
	}
	req.Logger.V(lvl).Info(msg, append(kv, "code", code.String(), "err", err)...)
	return &egress.BindError{Code: code, Err: err}
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

// Bind implements egress.Binder.
func (b *binder) Bind(ctx context.Context, req egress.BindRequest) (func(), error) {
	st := req.Stream
	qc := quicOf(st.Conn)
	if qc == nil {
		// The server opens the reverse forward's streams toward the client,
		// which accepts them on its QUIC connection only.
		return nil, b.refuse(req, proto.CodeUnsupported, "Refused a reverse forward: it needs a QUIC connection, and this client came over TCP (its UDP is blocked)", errReverseNeedsQUIC)
	}
	ep, err := endpoint.Parse(req.Bind.Listen)
	if err != nil {
		return nil, b.refuse(req, proto.CodeBadToken, "Refused a reverse forward: its listen address does not parse", err)
	}
	key := ep.String()
	// Checked and recorded under mu, so a reload (setRules) either comes
	// before the check or finds the binding to check again.
	b.mu.Lock()
	rule, err := b.authorize(ep, req.Identities)
	if err != nil {
		b.mu.Unlock()
		return nil, b.refuse(req, proto.CodeRefused, "Refused a reverse forward: no --allow-remote-listen rule admits its address for this client; "+
			"if it may listen there, add --allow-remote-listen LISTEN (or IDENTITY=LISTEN, e.g. key=NAME=LISTEN) and reload (SIGHUP)", err, "allowRemoteListen", ep.String())
	}
	holder, taken := b.bound[key]
	switch {
	case taken:
		b.mu.Unlock()
		return nil, b.refuse(req, proto.CodeAddrInUse, "Refused a reverse forward: another client's reverse forward holds its address",
			errors.New("address bound by another connection"), "holderConnID", holder.connID)
	case len(b.bound) >= b.s.cfg.MaxRemoteListens:
		b.mu.Unlock()
		return nil, b.refuse(req, proto.CodeOverloaded, "Refused a reverse forward: the server holds its limit of reverse forward listeners",
			errors.New("too many reverse forwards"), "limit", b.s.cfg.MaxRemoteListens)
	case b.perConn[st.ConnID] >= b.s.cfg.MaxRemoteListensPerConn:
		b.mu.Unlock()
		return nil, b.refuse(req, proto.CodeOverloaded, "Refused a reverse forward: the connection holds its share of listeners",
			errors.New("too many reverse forwards on this connection"), "limit", b.s.cfg.MaxRemoteListensPerConn)
	}
	b.bound[key] = &binding{connID: st.ConnID, ep: ep, identities: req.Identities, stream: st.Stream, logger: req.Logger}
	b.perConn[st.ConnID]++
	b.mu.Unlock()
	release := func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.bound, key)
		if b.perConn[st.ConnID]--; b.perConn[st.ConnID] <= 0 {
			delete(b.perConn, st.ConnID)
		}
	}

	ln, pc, err := b.s.cfg.ListenRemote(ctx, ep)
	if err != nil {
		release()
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, b.refuse(req, proto.CodeAddrInUse, "Refused a reverse forward: its address is in use on the server (by another program)", err)
		}
		return nil, b.refuse(req, proto.CodeInternal, "Refused a reverse forward: could not listen at its address", err)
	}
	h, err := ingress.New(b.s.cfg.Reverse, ingress.Links{
		Sessions: connSession{&ingress.Session{Conn: qc, Prober: st.Prober, Flows: st.Flows}},
		Tokens:   func() ingress.TokenSource { return boundToken(proto.BoundToken(req.Bind.ID)) },
		Secret:   func() []byte { return nil }, // TLS authenticated the server to the client
	})
	if err != nil { // unreachable: New checked Config.Reverse
		closeListener(ln, pc)
		release()
		return nil, &egress.BindError{Code: proto.CodeInternal, Err: err}
	}
	bctx, cancel := context.WithCancel(klog.NewContext(ctx, req.Logger)) // its audit lines name the client and the listener
	var accept, handlers sync.WaitGroup
	if pc != nil {
		accept.Go(func() { h.ServeUDP(bctx, pc, nil, &handlers) })
	} else {
		accept.Go(func() { h.Accept(bctx, ln, nil, &handlers) })
	}
	// A drain closes the listener and tells the client (shutdown).
	stopDrain := context.AfterFunc(b.closing, func() {
		closeListener(ln, pc)
		egress.Reset(st.Stream, proto.CodeShutdown)
	})
	req.Logger.Info("Listening for a reverse forward", "rule", rule)
	return func() {
		stopDrain()
		closeListener(ln, pc)
		accept.Wait()
		cancel()
		handlers.Wait()
		release()
		req.Logger.V(2).Info("Closed a reverse forward's listener", "address", ep.String())
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
