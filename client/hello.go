package client

import (
	"context"
	"errors"
	"time"

	"github.com/quic-go/quic-go"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/proto"
)

// helloTimeout bounds waiting for the server's answer to a hello; a server
// answers at once (or resets the stream after its --header-timeout).
const helloTimeout = 15 * time.Second

// helloRetry is the first delay before a hello refused with overloaded (the
// server's pre-authentication budget is full) is sent again; it doubles up to
// helloRetryMax while the connection lasts.
const (
	helloRetry    = 250 * time.Millisecond
	helloRetryMax = 4 * time.Second
)

// hello proves the shared secret on sess's connection at once, before any
// tunnel (proto.KindHello): the server then counts the connection as
// authenticated (it closes connections that prove nothing within its
// --idle-auth-timeout), and the client learns whether its credentials are
// accepted before an application connects. It runs beside the tunnels, which
// never wait for it, and returns when the answer is in or the connection
// ends. Without a shared secret there is nothing to prove: it returns at once.
func (c *Client) hello(ctx context.Context, l *link) {
	secret := c.signer.Load().Secret()
	if len(secret) == 0 {
		return
	}
	logger := klog.FromContext(ctx)
	conn := l.Conn
	delay := helloRetry
	for {
		err := sayHello(conn, secret)
		code, remote := proto.FromError(err)
		switch {
		case err == nil:
			c.confirm(l)
			logger.V(4).Info("Server accepted our hello")
			return
		case !remote:
			// The connection ended (the supervisor logs why), its 0-RTT data
			// was discarded (the supervisor starts a hello on the next
			// connection), or no answer came: nothing is known.
			if conn.Context().Err() == nil && !errors.Is(err, quic.Err0RTTRejected) {
				logger.V(2).Info("Server did not answer our hello", "err", err)
			}
			return
		case code == proto.CodeAuthFailed:
			// The server closes the connection too; the supervisor logs it.
			l.m.srv.authRefused.Store(true)
			return
		case code == proto.CodeOverloaded:
			// The server's budget for unauthenticated streams is full: try
			// again, the connection is closed if no header is verified in time.
			logger.V(2).Info("Server refused our hello for now; trying again", "code", code.String(), "delay", delay)
			select {
			case <-time.After(delay):
				delay = min(2*delay, helloRetryMax)
				continue
			case <-conn.Context().Done():
				return
			case <-ctx.Done():
				return
			}
		case code == proto.CodeReplay:
			c.confirm(l) // the MAC was verified first
			c.logHeaderStale(logger)
			return
		default:
			// unsupported: a server from before the hello, which verifies
			// the MAC before it looks at the kind: it accepted our
			// credentials. bad_header: a server from before stream kinds
			// cannot read a hello, nor tell us anything: as before the
			// hello, the handshake is taken as enough.
			c.confirm(l)
			logger.V(4).Info("Server answered our hello", "code", code.String())
			return
		}
	}
}

// sayHello sends one hello on conn and returns the server's answer: nil for
// CodeOK, a *proto.RemoteError or quic error otherwise.
func sayHello(conn ingress.Conn, secret []byte) error {
	h, err := proto.NewHello(time.Now())
	if err != nil {
		return err
	}
	return ask(conn, h, secret)
}

// ask sends h, a header nothing follows (a hello, a check), on a new stream
// of conn and returns the server's answer: nil for CodeOK, a
// *proto.RemoteError or quic error otherwise.
func ask(conn ingress.Conn, h *proto.Header, secret []byte) error {
	ctx, cancel := context.WithTimeout(conn.Context(), helloTimeout)
	defer cancel()
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	return askOn(ctx, str, h, secret)
}

// confirm records that the server accepted a stream header on l (Ready),
// and says so at -v 0 when it had refused our credentials before; then
// the connection's "Connected to server" line is due (announceIfDue),
// logged before Ready says so.
func (c *Client) confirm(l *link) {
	l.m.srv.authRefused.Store(false)
	if c.lastRefusal.Swap(nil) != nil {
		c.logger.Info("Server accepted our credentials")
	}
	l.accepted.Store(true)
	l.announceIfDue()
	l.confirmed.Store(true)
	c.resteer()
}

// logHeaderStale logs once at -v 0 that the server refused our header as
// outside its replay window: the clocks differ, and every tunnel fails too.
func (c *Client) logHeaderStale(logger klog.Logger) {
	if c.staleLogged.CompareAndSwap(false, true) {
		logger.Error(&proto.RemoteError{Code: proto.CodeReplay}, "Server refused our stream header as stale: the clocks of client and server differ by more than 2 minutes",
			"fix", "synchronise both clocks (timedatectl set-ntp true, or chrony)")
	}
}
