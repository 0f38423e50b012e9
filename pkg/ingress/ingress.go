// Package ingress is the client's half of a tunnel: it accepts local
// connections, chooses each one's destination (the token), opens a stream on
// the client's current QUIC connection, writes the authenticated header and
// the application's first bytes at once (as 0-RTT data when resuming, re-sent
// if the server rejects it), and splices until both directions end.
//
// The client (package client) owns the QUIC connection: it supervises dials
// and reconnects, path rescue and the drain, and gives ingress the current
// connection through Sessions.
package ingress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/liveness"
	"github.com/quictun/quictun/pkg/lograte"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/splice"
	"github.com/quictun/quictun/pkg/tcpmux"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/pkg/udpflow"
)

// TokenSource chooses the destination token for a local connection (pkg/token implements it).
type TokenSource interface {
	Token(ctx context.Context, clientAddr net.Addr) (string, error)
}

// Session is one connection to the peer (QUIC or TCP: Conn), its tail
// prober and the table its UDP flow datagrams are routed by (on TCP: no
// datagrams, no 0-RTT; Prober may be nil).
type Session struct {
	// Conn carries the session's streams: OverQUIC or OverTCP.
	Conn   Conn
	Prober *liveness.TailProber
	Flows  *udpflow.Table
	// Waker, if set, is woken as a stream or flow is about to be opened on
	// the session and as bytes move on it: the client's liveness checks,
	// silent while the connection is idle, start again at once
	// (client/rescue.go).
	Waker *liveness.Waker
	// Server names the server the session goes to (the client's label of
	// it; "" not known): a resumable tunnel re-attaches to the server it
	// was opened on, which holds its far end (ServerSessions).
	Server string

	// verdicts: destinations the server accepted recently on this
	// connection, which a proxy answers at once (verdicts.go).
	verdicts verdicts
	// aheads counts the re-attachments on this connection that did not
	// wait for the server's reply (maxAheadPerSession).
	aheads atomic.Int32
}

// Transport names the session's transport: "quic" or "tcp".
func (s *Session) Transport() string { return s.Conn.Transport() }

// Conn is what ingress uses of a connection, QUIC or TCP (as the server's
// tunnelConn): streams both ways, its end, and the QUIC connection behind
// it for 0-RTT and datagrams.
type Conn interface {
	// OpenStream opens a stream at once; it fails with a stream-limit
	// error (quic.StreamLimitReachedError, tcpmux.ErrStreamLimit) while
	// the peer's limit is reached.
	OpenStream() (Stream, error)
	// OpenStreamSync waits for stream credit until ctx ends.
	OpenStreamSync(ctx context.Context) (Stream, error)
	// AcceptStream returns the next stream the peer opened.
	AcceptStream(ctx context.Context) (Stream, error)
	// Context ends with the connection.
	Context() context.Context
	CloseWithError(code quic.ApplicationErrorCode, msg string) error
	// Transport is "quic" or "tcp".
	Transport() string
	// QUIC is the QUIC connection, nil on TCP.
	QUIC() *quic.Conn
}

// OverQUIC is c as a Conn.
func OverQUIC(c *quic.Conn) Conn { return overQUIC{c} }

// OverTCP is c (the TCP fallback, pkg/tcpmux) as a Conn.
func OverTCP(c *tcpmux.Conn) Conn { return overTCP{c} }

type overQUIC struct{ *quic.Conn }

func (c overQUIC) OpenStream() (Stream, error) { return nilIfErr(c.Conn.OpenStream()) }
func (c overQUIC) OpenStreamSync(ctx context.Context) (Stream, error) {
	return nilIfErr(c.Conn.OpenStreamSync(ctx))
}

func (c overQUIC) AcceptStream(ctx context.Context) (Stream, error) {
	return nilIfErr(c.Conn.AcceptStream(ctx))
}
func (overQUIC) Transport() string  { return "quic" }
func (c overQUIC) QUIC() *quic.Conn { return c.Conn }

type overTCP struct{ *tcpmux.Conn }

func (c overTCP) OpenStream() (Stream, error) { return nilIfErr(c.Conn.OpenStream()) }
func (c overTCP) OpenStreamSync(ctx context.Context) (Stream, error) {
	return nilIfErr(c.Conn.OpenStreamSync(ctx))
}

func (c overTCP) AcceptStream(ctx context.Context) (Stream, error) {
	return nilIfErr(c.Conn.AcceptStream(ctx))
}
func (overTCP) Transport() string { return "tcp" }
func (overTCP) QUIC() *quic.Conn  { return nil }

// nilIfErr returns s as a Stream, or a nil interface (not a typed nil
// pointer) with err.
func nilIfErr[S Stream](s S, err error) (Stream, error) {
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Stream is a tunnel stream: a *quic.Stream, or a *tcpmux.Stream on a TCP
// session.
type Stream interface {
	splice.Stream
	StreamID() quic.StreamID
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// Sessions gives ingress the connection a new stream goes on: the client
// chooses among its connections (servers, --connections, the TCP fallback).
type Sessions interface {
	// Wait returns the session a new stream (or UDP flow) goes on, waiting
	// (bounded) for one, and counts it there until release is called
	// (once, when the stream ends; release is never nil).
	Wait(ctx context.Context) (sess *Session, release func(), err error)
}

// ServerSessions is Sessions that can wait for a session to one server
// (Session.Server): a resumable tunnel re-attaches there and nowhere else,
// since only that server holds its far end. With several servers, any
// other server would refuse it and the tunnel would be reset.
type ServerSessions interface {
	// WaitServer is Wait, for a QUIC session to server.
	WaitServer(ctx context.Context, server string) (sess *Session, release func(), err error)
}

// Config are the settings of a Handler, filled once by whoever runs it (the
// client's app fills the ingress.Config its client.Config embeds).
// DefaultConfig holds the defaults; New fills a field left zero with its
// default. Events and Registry are required.
type Config struct {
	// StreamOpenTimeout bounds waiting for stream credit from the peer.
	StreamOpenTimeout time.Duration
	// MaxConnections bounds concurrently handled local connections and UDP
	// flows. A proxied connection counts once its request is read (and
	// authenticated), not before.
	MaxConnections int
	// MaxProxyHandshakes bounds the proxied connections whose request is
	// still being read (not yet authenticated), apart from MaxConnections,
	// so that idle connections to a proxy entry point cannot take the
	// forwards' slots.
	MaxProxyHandshakes int
	// UDPIdleTimeout ends a UDP flow without packets either way.
	UDPIdleTimeout time.Duration
	// UDPQueueMemory bounds the packets all UDP flows queue toward the peer
	// (0: UDPQueueMemory).
	UDPQueueMemory int64
	// Reverse: this Handler carries reverse forwards (on the server, from
	// the listeners it opened for a client toward that client): its
	// tunnels show the direction "reverse" (/tunnels).
	Reverse bool
	// AuditLog logs one line per tunnel at -v 0 when it ends: direction,
	// the application's address, destination token, result, bytes,
	// duration (and what the context's logger carries: on the server the
	// client's identity and the listen address).
	AuditLog bool

	// Resume, if set, makes the tunnels resumable (--resume-window); nil:
	// none are.
	Resume *Resume

	// Events are told what happens to local connections and flows (the
	// daemon's metrics).
	Events   Events
	Registry *tunnel.Registry
}

// DefaultConfig returns the defaults of the limits and timeouts.
func DefaultConfig() Config {
	return Config{
		StreamOpenTimeout:  10 * time.Second,
		MaxConnections:     16384,
		MaxProxyHandshakes: DefaultMaxProxyHandshakes,
		UDPIdleTimeout:     DefaultUDPIdleTimeout,
	}
}

// Links are what a Handler asks its owner while it runs: the connection to
// carry streams on and the credentials in force (a reload may change them).
type Links struct {
	Sessions Sessions
	// Tokens and Signer return the token source and the signer of the
	// shared secret in force; Signer may return nil (no MAC).
	Tokens func() TokenSource
	Signer func() *proto.Signer
	// Accepted, if set, is called when the peer accepted a stream header
	// on sess.
	Accepted func(sess *Session)
}

// Handler carries local connections; safe for concurrent use.
type Handler struct {
	cfg   Config
	links Links
	slots chan struct{}
	// handshakes: the proxied connections whose request is being read.
	handshakes chan struct{}
	// udpQueues bounds the packets all UDP flows hold for the server.
	udpQueues *udpflow.Budget
	// badHeaderLogged is set once a bad_header refusal was logged at -v 0;
	// udpRefusalLogged once a UDP flow refused as unreadable or unsupported.
	badHeaderLogged, udpRefusalLogged atomic.Bool
	// refusals chooses which destinations the server refused are logged at
	// -v 0 (logRefused).
	refusals *lograte.Limiter
}

// RefusalLogInterval is how often a destination the server keeps refusing is
// logged at -v 0 (with the number of refusals left out).
const RefusalLogInterval = time.Minute

// logRefused says at -v 0, once per RefusalLogInterval for each destination,
// that the server refused token (the application only sees a reset, or its
// proxy's refusal), and what to do; it reports whether it did.
func (h *Handler) logRefused(logger klog.Logger, token string) bool {
	ok, n := h.refusals.Allow(token)
	if ok {
		logger.Info("Server refused the destination: its --allow rules do not admit it (or a --deny rule matches, or its name does not resolve there); "+
			"allow it on the server (its log names the rule to add), or fix the destination here", "destination", LoggableToken(token), "suppressed", n)
	}
	return ok
}

// LoggableToken is token as logs may show it: a cleartext destination
// ("tcp:10.0.0.5:22") as is, anything else (a token a --token-parser-key
// server decrypts) as a placeholder: tokens are not logged.
func LoggableToken(token string) string {
	if _, err := endpoint.Parse(token); err == nil {
		return token
	}
	return "(opaque token)"
}

// New returns a Handler for cfg, its zero fields filled with their
// defaults, that runs with links.
func New(cfg Config, links Links) (*Handler, error) {
	if links.Sessions == nil || links.Tokens == nil || links.Signer == nil || cfg.Events == nil || cfg.Registry == nil {
		return nil, errors.New("ingress: sessions, tokens, secret, metrics and registry are required")
	}
	def := DefaultConfig()
	if cfg.StreamOpenTimeout <= 0 {
		cfg.StreamOpenTimeout = def.StreamOpenTimeout
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = def.MaxConnections
	}
	if cfg.UDPIdleTimeout <= 0 {
		cfg.UDPIdleTimeout = def.UDPIdleTimeout
	}
	if cfg.MaxProxyHandshakes <= 0 {
		cfg.MaxProxyHandshakes = def.MaxProxyHandshakes
	}
	if cfg.UDPQueueMemory <= 0 {
		cfg.UDPQueueMemory = UDPQueueMemory
	}
	return &Handler{
		cfg: cfg, links: links, slots: make(chan struct{}, cfg.MaxConnections), handshakes: make(chan struct{}, cfg.MaxProxyHandshakes),
		udpQueues: udpflow.NewBudget(cfg.UDPQueueMemory, udpflow.GaugeFunc(cfg.Events.UDPQueued)),
		refusals:  lograte.New(RefusalLogInterval, 64),
	}, nil
}

// direction is the direction of the Handler's tunnels (tunnel.Forward or
// tunnel.Reverse).
func (h *Handler) direction() string {
	if h.cfg.Reverse {
		return tunnel.Reverse
	}
	return tunnel.Forward
}

// logDestination is how the log names a tunnel's destination: token, or
// for a reverse forward the address it was bound to (bound,
// "tcp:HOST:PORT", "udp:HOST:PORT"): its token is an internal one
// ("bound/1/ID"), and where the client takes it the server does not know.
func (h *Handler) logDestination(token, bound string) string {
	if h.cfg.Reverse {
		return bound
	}
	return token
}

// audit writes a tunnel's audit line (AuditLog), naming its destination
// as logDestination does.
func (h *Handler) audit(logger klog.Logger, source, token, bound, result string, up, down int64, start time.Time) {
	if !h.cfg.AuditLog {
		return
	}
	dest := LoggableToken(token)
	if h.cfg.Reverse {
		dest = bound
	}
	logger.Info("Closed tunnel", "direction", h.direction(), "source", source, "destination", dest, "result", result,
		"bytesUpstream", up, "bytesDownstream", down, "duration", time.Since(start).Round(time.Millisecond))
}

// Config returns the settings in use: the Config given to New, its zero
// fields filled with their defaults.
func (h *Handler) Config() Config { return h.cfg }

// Accept serves ln until it is closed: each local connection, within
// MaxConnections, is carried by Serve on a goroutine added to handlers.
// tokens chooses the destinations of this listener (a forward's fixed
// destination); nil means Config.Tokens.
func (h *Handler) Accept(ctx context.Context, ln net.Listener, tokens TokenSource, handlers *sync.WaitGroup) {
	h.accept(ctx, ln, handlers, h.slots, h.cfg.MaxConnections, "Too many local connections; refusing",
		func(nc net.Conn, _ func()) { h.serve(ctx, ln.Addr().String(), nc, tokens, nil, nil) })
}

// AcceptProxy is Accept for a listener where the application names each
// connection's destination through proxy (SOCKS5, HTTP CONNECT). Until its
// request is read, within proxyHandshakeTimeout, a connection holds one of
// MaxProxyHandshakes; then one of MaxConnections.
func (h *Handler) AcceptProxy(ctx context.Context, ln net.Listener, proxy Proxy, handlers *sync.WaitGroup) {
	h.accept(ctx, ln, handlers, h.handshakes, h.cfg.MaxProxyHandshakes,
		"Too many proxy connections yet to send their request; refusing. A local client may be holding them open; raise --max-proxy-handshakes if they are legitimate",
		func(nc net.Conn, release func()) { h.serve(ctx, ln.Addr().String(), nc, nil, proxy, release) })
}

// accept serves ln: each connection takes one of slots (limit) for as long
// as serve runs, or until serve calls its release func.
func (h *Handler) accept(ctx context.Context, ln net.Listener, handlers *sync.WaitGroup, slots chan struct{}, limit int,
	refusal string, serve func(nc net.Conn, release func()),
) {
	logger := klog.FromContext(ctx)
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (e.g. EMFILE): pause, as net/http does, instead of exiting.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			logger.Error(err, "Accept failed; retrying", "address", ln.Addr().String(), "delay", delay)
			select {
			case <-time.After(delay):
				continue
			case <-ctx.Done():
				return
			}
		}
		delay = 0
		h.cfg.Events.Accepted()
		select {
		case slots <- struct{}{}:
		default:
			// Counted before the reset, so whoever sees the reset sees the count.
			h.cfg.Events.StreamFailed(proto.CodeOverloaded.String())
			logger.V(2).Info(refusal, "limit", limit, "address", ln.Addr().String())
			resetConn(nc)
			continue
		}
		handlers.Go(func() {
			var once sync.Once
			release := func() { once.Do(func() { <-slots }) }
			defer release()
			serve(nc, release)
		})
	}
}

func resetConn(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = nc.Close()
}

// replyStream consumes the server's one-byte reply before the first downstream byte.
type replyStream struct {
	Stream
	once    bool
	onReply func(error)
}

func (r *replyStream) Read(b []byte) (int, error) {
	if !r.once {
		r.once = true
		err := proto.ReadReply(r.Stream)
		r.onReply(err)
		if err != nil {
			return 0, err
		}
	}
	return r.Stream.Read(b)
}

// header encodes a stream header for token with a fresh nonce; id is the
// tunnel's ID (proto.Header.TunnelID).
func (h *Handler) header(token string) (b []byte, id string, err error) {
	return h.headerFor(token, nil)
}

// headerFor is header for a resumable tunnel's when rid is not nil.
func (h *Handler) headerFor(token string, rid *resume.ID) (b []byte, id string, err error) {
	hdr, err := proto.NewHeader(token, time.Now())
	if err != nil {
		return nil, "", err
	}
	if rid != nil {
		hdr.ResumeID, hdr.HasResumeID = *rid, true
	}
	b, err = hdr.AppendSigned(nil, h.links.Signer())
	return b, hdr.TunnelID(), err
}

// proxyHandshakeTimeout bounds reading a proxy request (SOCKS5
// negotiation and authentication and its request, or an HTTP CONNECT
// request): applications send it at once.
const proxyHandshakeTimeout = 5 * time.Second

// DefaultMaxProxyHandshakes is the default Config.MaxProxyHandshakes: 64
// connections that each hold one for at most proxyHandshakeTimeout.
const DefaultMaxProxyHandshakes = 64

// errTooManyConnections: a proxied connection's request was read, but
// MaxConnections were in use.
var errTooManyConnections = errors.New("too many local connections (--max-connections)")

// Serve carries one local connection accepted on listenAddr to the
// destination tokens chooses (nil: Config.Tokens).
func (h *Handler) Serve(ctx context.Context, listenAddr string, nc net.Conn, tokens TokenSource) {
	h.serve(ctx, listenAddr, nc, tokens, nil, nil)
}

// errStreamCredit: no stream credit from the server within StreamOpenTimeout.
var errStreamCredit = errors.New("server stream limit")

// openStream opens a stream on sess, waiting up to StreamOpenTimeout for
// stream credit if the server's limit is reached (the error then wraps
// errStreamCredit).
func (h *Handler) openStream(ctx context.Context, sess *Session) (Stream, error) {
	if sess.Waker != nil {
		sess.Waker.Wake()
	}
	return h.openOn(ctx, sess.Conn)
}

// openOn is openStream on c.
func (h *Handler) openOn(ctx context.Context, c Conn) (Stream, error) {
	str, err := c.OpenStream()
	if err == nil || !isStreamLimit(err) {
		return str, err
	}
	octx, cancel := context.WithTimeout(ctx, h.cfg.StreamOpenTimeout)
	defer cancel()
	str, err = c.OpenStreamSync(octx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errStreamCredit, err)
	}
	return str, nil
}

// isStreamLimit reports whether OpenStream failed only because the server's
// stream limit is reached (quic-go returns a *StreamLimitReachedError; the
// value form is accepted too).
func isStreamLimit(err error) bool {
	var v quic.StreamLimitReachedError
	var p *quic.StreamLimitReachedError
	return errors.As(err, &v) || errors.As(err, &p) || errors.Is(err, tcpmux.ErrStreamLimit)
}

// maxEarlyBytes bounds the application bytes kept for a re-send while a
// connection's 0-RTT outcome is unknown; beyond it, reading waits for the handshake.
const maxEarlyBytes = 256 << 10

// earlyPhase forwards the application's first bytes as 0-RTT data while the
// handshake completes, keeping a copy. If the server accepted 0-RTT it returns
// str unchanged. If it rejected it (all 0-RTT data is then discarded), or the
// connection died before its handshake (the server was still down), or new
// streams go on another connection whose handshake is done while nothing came
// back on this one (UDP is blocked: the client turned to TCP, and the resumed
// session's handshake would only end at its timeout), it opens a stream on the next
// connection and re-sends a fresh header and the copy. Downstream bytes cannot
// arrive before the handshake completes, so only the upstream direction needs
// this.
//
// It returns the stream in force and what went on it (earlyOutcome).
func (h *Handler) earlyPhase(ctx context.Context, conn *quic.Conn, nc splice.Conn, str Stream, token string, early []byte, id string) (earlyOutcome, error) {
	sent := append([]byte(nil), early...) // written with the header already
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 16<<10)
		for len(sent) < maxEarlyBytes {
			n, err := nc.Read(buf)
			if n > 0 {
				sent = append(sent, buf[:n]...)
				_, _ = str.Write(buf[:n]) // fails with Err0RTTRejected on rejection; the copy is re-sent
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	moved, stopWatch := h.watchMoved(ctx, conn)
	select {
	case <-conn.HandshakeComplete():
	case <-conn.Context().Done():
	case <-moved:
	case <-ctx.Done():
	}
	wasMoved := stopWatch()
	if wasMoved {
		// Its write may wait on the stalled connection for good: ended, it
		// returns (what the reader read is in sent already).
		str.CancelWrite(0)
	}
	_ = nc.SetReadDeadline(time.Now()) // stop the reader; what it read was forwarded
	rerr := <-done
	_ = nc.SetReadDeadline(time.Time{})
	if rerr != nil && !errors.Is(rerr, io.EOF) && !errors.Is(rerr, os.ErrDeadlineExceeded) {
		return earlyOutcome{}, fmt.Errorf("read before handshake: %w", rerr)
	}
	// Moved, the stream's write side is cancelled: it goes to the next
	// session even if the handshake completed meanwhile.
	complete := !wasMoved && transport.HandshakeComplete(conn)
	if conn.Context().Err() == nil && complete && conn.ConnectionState().Used0RTT {
		return earlyOutcome{str: str, id: id, sent: sent}, nil
	}
	str.CancelRead(0) // discarded with the rest of the 0-RTT data
	str.CancelWrite(0)
	var next Conn
	if conn.Context().Err() == nil && complete {
		// Rejected: the same connection goes on without 0-RTT.
		n, err := conn.NextConnection(ctx)
		if err != nil {
			return earlyOutcome{}, fmt.Errorf("connection after 0-RTT rejection: %w", err)
		}
		next = OverQUIC(n)
	} else {
		// The server never answered (it may still be down, or UDP is
		// blocked): wait for the client's next connection, with its
		// handshake done.
		n, err := h.nextSession(ctx)
		if err != nil {
			return earlyOutcome{}, err
		}
		next = n
	}
	nstr, err := h.openOn(ctx, next)
	if err != nil {
		return earlyOutcome{}, fmt.Errorf("stream after 0-RTT rejection: %w", err)
	}
	hb, id, err := h.header(token)
	if err == nil {
		_, err = nstr.Write(append(hb, sent...))
	}
	if err != nil {
		nstr.CancelRead(0)
		nstr.CancelWrite(0)
		return earlyOutcome{}, fmt.Errorf("re-send after 0-RTT rejection: %w", err)
	}
	return earlyOutcome{str: nstr, id: id, sent: sent, resent: true}, nil
}

// earlyOutcome is how earlyPhase ended: the stream in force, the tunnel ID
// of its header, the application bytes written on it after the header,
// and whether it is a new stream with a re-sent header (a plain one: a
// tunnel that moved is not made resumable, resumeID).
type earlyOutcome struct {
	str    Stream
	id     string
	sent   []byte
	resent bool
}

// movedCheck is how often a stream waiting for its connection's handshake
// looks whether new streams go elsewhere (watchMoved).
const movedCheck = 100 * time.Millisecond

// watchMoved returns a channel closed once new streams go on a connection
// other than conn whose handshake is done (a TCP one, or a QUIC one that
// completed it) while conn's handshake is not; stop ends the watch,
// returns once its goroutine has, and reports whether the channel was
// closed.
func (h *Handler) watchMoved(ctx context.Context, conn *quic.Conn) (moved <-chan struct{}, stop func() (wasMoved bool)) {
	ch := make(chan struct{})
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var closed bool // written by the goroutine only, read after wg.Wait
	wg.Go(func() {
		t := time.NewTicker(movedCheck)
		defer t.Stop()
		for {
			select {
			case <-t.C:
			case <-conn.HandshakeComplete():
				return
			case <-wctx.Done():
				return
			}
			if h.readyElsewhere(wctx, conn) {
				closed = true
				close(ch)
				return
			}
		}
	})
	return ch, func() bool { cancel(); wg.Wait(); return closed }
}

// readyElsewhere reports whether a new stream would now go on a connection
// other than conn whose handshake is done, while nothing came back on conn:
// a server that answered is completing the handshake and took the 0-RTT
// data, which moving would deliver twice.
func (h *Handler) readyElsewhere(ctx context.Context, conn *quic.Conn) bool {
	if conn.ConnectionStats().PacketsReceived > 0 {
		return false
	}
	wctx, cancel := context.WithTimeout(ctx, movedCheck)
	defer cancel()
	sess, release, err := h.links.Sessions.Wait(wctx)
	release() // only looked at
	if err != nil {
		return false
	}
	q := sess.Conn.QUIC()
	if q == nil {
		return true // TCP
	}
	return q != conn && transport.HandshakeComplete(q) && q.Context().Err() == nil
}

// nextSession waits for a connection whose handshake is done: a QUIC one
// that completed it, or a TCP one (UDP is blocked: the fallback carries it).
func (h *Handler) nextSession(ctx context.Context) (Conn, error) {
	for {
		sess, release, err := h.links.Sessions.Wait(ctx)
		release() // counted where it was first placed
		if err != nil {
			return nil, fmt.Errorf("connection died before its handshake: %w", err)
		}
		q := sess.Conn.QUIC()
		if q == nil {
			return sess.Conn, nil
		}
		select {
		case <-q.HandshakeComplete():
			if q.Context().Err() == nil {
				return sess.Conn, nil
			}
		case <-q.Context().Done():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
