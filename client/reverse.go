package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/backoff"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/proto"
)

// RemoteForward is one --remote-forward LISTEN=DESTINATION: the server
// listens at Listen, and each connection (or UDP flow) it accepts there
// comes to the client as a stream, which it carries to Destination. The
// server names the forward by its index in Config.RemoteForwards (its
// binding ID), never a destination: the client dials only these.
type RemoteForward struct {
	Listen      endpoint.Endpoint
	Destination endpoint.Endpoint
}

func (f RemoteForward) String() string { return f.Listen.String() + "=" + f.Destination.String() }

// Bind retry pacing, on the same connection while it lasts: a bind the
// server could not grant now (overloaded: its listeners, or this client's
// share, are taken; addr_in_use: the holder may be this client's previous
// connection, which the server has not seen end yet; or no answer) is asked
// again after a jittered delay whose ceiling doubles from bindRetry to
// bindRetryMax (pkg/backoff). A bind no rule admits (refused) is asked again
// only every bindRetryRefused or so, in case the server's rules are
// reloaded; other refusals are not asked again on that connection.
const (
	bindRetry        = time.Second
	bindRetryMax     = 30 * time.Second
	bindRetryRefused = 5 * time.Minute
)

// newReverse returns the egress Handler that serves the streams the server
// opens for cfg.RemoteForwards: its parser maps a bound stream's token to
// its forward's destination and refuses any other, and its rules admit
// only those destinations (a second fence: a token can only ever name one
// of them).
func newReverse(cfg Config) (*egress.Handler, error) {
	dests := make([]string, len(cfg.RemoteForwards))
	for i, f := range cfg.RemoteForwards {
		dests[i] = f.Destination.String()
	}
	allow, err := endpoint.ParseRules(dests, nil)
	if err != nil {
		return nil, fmt.Errorf("remote forward destinations: %w", err)
	}
	ec := cfg.Reverse
	ec.Parser = boundParser(cfg.RemoteForwards)
	ec.Allow, ec.AllowFor, ec.Keys = allow, nil, nil // the TLS handshake authenticated the server
	ec.Reverse, ec.Binder, ec.Registry = true, nil, cfg.Registry
	if ec.Endpoint == "" {
		ec.Endpoint = "remote-forward"
	}
	return egress.New(ec)
}

// boundParser reads the token of a bound stream: the destination of the
// forward it names.
type boundParser []RemoteForward

// errNotDeclared: a bound stream named no forward of this client.
var errNotDeclared = errors.New("names no --remote-forward of this client")

// Parse implements egress.TokenParser.
func (p boundParser) Parse(token string) (endpoint.Endpoint, error) {
	id, err := proto.ParseBoundToken(token)
	if err != nil {
		return endpoint.Endpoint{}, err
	}
	if id >= len(p) {
		return endpoint.Endpoint{}, fmt.Errorf("binding %d %w", id, errNotDeclared)
	}
	return p[id].Destination, nil
}

// serveReverse runs the reverse forwards on l's connection once its
// handshake is done (reverseOn). Without remote forwards it returns at once.
func (c *Client) serveReverse(ctx context.Context, l *link) {
	if c.reverse == nil {
		return
	}
	if !c.settled(ctx, l) {
		return // ended, or replaced (0-RTT rejected): the new session binds
	}
	c.reverseOn(ctx, l.session, l.conn, l.m.srv)
}

// reverseOn runs the reverse forwards on sess, a connection to srv over
// QUIC or TCP (raw is its connection as egress sees it): it asks the server
// to listen for each (bind), and serves the streams the server opens
// (egress, toward the declared destinations only) until the connection
// ends.
func (c *Client) reverseOn(ctx context.Context, sess *session, raw egress.Conn, srv *server) {
	if c.reverse == nil {
		return
	}
	conn := sess.Conn
	state := c.reverse.NewConn()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		for {
			str, err := conn.AcceptStream(conn.Context())
			if err != nil {
				return
			}
			wg.Go(func() {
				c.reverse.Serve(ctx, egress.Stream{Conn: raw, Stream: str, Prober: sess.Prober, Conn0: state, Flows: sess.Flows, Source: "server"})
			})
		}
	})
	for i, f := range c.cfg.RemoteForwards {
		wg.Go(func() { c.bind(ctx, sess, bindKey{srv, i}, f) })
	}
}

// bind asks the server to listen for forward f (binding key.id) on sess's
// connection and holds the binding until the connection or the server
// ends it, asking again, while the connection lasts, after the server
// ended a binding and after a refusal that may pass (see bindRetry). Each
// outcome is logged at -v 0 when it differs from the last one logged for f
// on that server.
func (c *Client) bind(ctx context.Context, sess *session, key bindKey, f RemoteForward) {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "remoteForward", f.String())
	conn := sess.Conn
	// wctx ends with the connection, the client's drain or ctx (a TCP
	// connection no longer wanted: QUIC carries the tunnels again).
	wctx, cancel := context.WithCancel(conn.Context())
	defer cancel()
	defer context.AfterFunc(c.unbinding, cancel)()
	defer context.AfterFunc(ctx, cancel)()
	retry := backoff.Backoff{Initial: bindRetry, Max: bindRetryMax}
	refused := backoff.Backoff{Initial: bindRetryRefused, Max: bindRetryRefused}
	for wctx.Err() == nil {
		bound, err := c.bindOnce(ctx, conn, key, f, logger)
		code, remote := proto.FromError(err)
		var wait time.Duration
		switch {
		case wctx.Err() != nil:
			return
		case bound:
			retry.Reset() // it was up: the next refusal starts the pacing afresh
			wait = retry.Next()
			logger.V(2).Info("Server ended a reverse forward; asking again", "err", err, "retryIn", wait)
		case remote && code == proto.CodeShutdown:
			logger.V(2).Info("Server is shutting down; its reverse forward ends with the connection")
			return
		case remote && (code == proto.CodeOverloaded || code == proto.CodeAddrInUse):
			wait = retry.Next()
			c.logBind(logger, key, code.String(), "Server refused a reverse forward for now: "+bindRefusalFix(code)+"; asking again",
				"code", code.String(), "retryIn", wait)
		case remote && code == proto.CodeRefused:
			wait = refused.Next()
			c.logBind(logger, key, code.String(), "Server refused a reverse forward: "+bindRefusalFix(code),
				"code", code.String(), "retryIn", wait)
		case remote:
			c.logBind(logger, key, code.String(), "Server refused a reverse forward: "+bindRefusalFix(code), "code", code.String())
			return
		default:
			wait = retry.Next()
			logger.V(2).Info("Server did not answer a reverse forward request", "err", err, "retryIn", wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-wctx.Done():
			t.Stop()
			return
		}
	}
}

// bindOnce sends one bind and, once the server listens, holds it until the
// stream ends (bound true): the client ends it only when it drains, or
// when ctx ends (its TCP connection is no longer wanted).
func (c *Client) bindOnce(ctx context.Context, conn ingress.Conn, key bindKey, f RemoteForward, logger klog.Logger) (bound bool, err error) {
	h, err := proto.NewBind(proto.Bind{ID: key.id, Listen: f.Listen.String()}, time.Now())
	if err != nil {
		return false, err
	}
	b, err := h.AppendSigned(nil, c.signer.Load())
	if err != nil {
		return false, err
	}
	octx, cancel := context.WithTimeout(conn.Context(), helloTimeout)
	str, err := conn.OpenStreamSync(octx)
	cancel()
	if err != nil {
		return false, err
	}
	if _, err := str.Write(b); err != nil {
		str.CancelRead(proto.CodeOK.StreamErrorCode())
		str.CancelWrite(proto.CodeOK.StreamErrorCode())
		return false, err
	}
	_ = str.SetReadDeadline(time.Now().Add(helloTimeout))
	if err := proto.ReadReply(str); err != nil {
		str.CancelRead(proto.CodeOK.StreamErrorCode())
		str.CancelWrite(proto.CodeOK.StreamErrorCode())
		return false, err
	}
	_ = str.SetReadDeadline(time.Time{})
	c.logBind(logger, key, "ok", "Server listens for a reverse forward", "listen", f.Listen.String(), "destination", f.Destination.String())
	// Held until the server ends it or the connection ends; a drain ends
	// it from here (shutdown), so the server stops accepting for it.
	stop := context.AfterFunc(c.unbinding, func() {
		str.CancelWrite(proto.CodeShutdown.StreamErrorCode())
		str.CancelRead(proto.CodeShutdown.StreamErrorCode())
	})
	defer stop()
	defer context.AfterFunc(ctx, func() {
		if errors.Is(context.Cause(ctx), errUpgrading) {
			return // the connection's close for the upgrade ends it: the server keeps the listener
		}
		str.CancelWrite(proto.CodeOK.StreamErrorCode())
		str.CancelRead(proto.CodeOK.StreamErrorCode())
	})()
	_, err = io.Copy(io.Discard, io.LimitReader(str, 1<<10))
	str.CancelRead(proto.CodeOK.StreamErrorCode())
	str.CancelWrite(proto.CodeOK.StreamErrorCode())
	return true, err
}

// bindKey names a binding on one server: each server binds every forward,
// and each binding's outcome is logged on its own.
type bindKey struct {
	srv *server
	id  int
}

// logBind logs msg at -v 0 if outcome differs from the last one logged for
// the binding key (so reconnects and retries do not repeat it, and one
// server's outcome does not hide another's), else at -v 2.
func (c *Client) logBind(logger klog.Logger, key bindKey, outcome, msg string, kv ...any) {
	lvl := 2
	if c.said.bindOutcome(key, outcome) {
		lvl = 0
	}
	logger.V(lvl).Info(msg, kv...)
}

// bindRefusalFix says what a refusal of a reverse forward means.
func bindRefusalFix(code proto.Code) string {
	switch code {
	case proto.CodeRefused:
		return "no --allow-remote-listen rule on the server admits its listen address for this client, " +
			"or its port is one the server itself listens on (QUIC, TCP or admin; reserved at every address); " +
			"ask its operator to add a rule (its log names the reason), or change the address here"
	case proto.CodeUnsupported:
		return "the server allows no reverse forwards (no --allow-remote-listen), or predates them"
	case proto.CodeOverloaded:
		return "the server holds its limit of reverse forward listeners, or this client's share of them " +
			"(its --max-remote-listeners, --max-remote-listeners-per-identity, --max-remote-listeners-per-conn)"
	case proto.CodeAddrInUse:
		return "its listen address is held by another client (or by this client's previous connection, until the server sees it end)"
	case proto.CodeBadToken, proto.CodeBadHeader:
		return "the server could not read the request (its listen address, or an older server)"
	}
	return "the server could not listen there (its log says why)"
}
