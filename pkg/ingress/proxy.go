package ingress

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/socks5"
	"github.com/quictun/quictun/pkg/udpflow"
)

// Proxy is a local entry point where the application names each
// connection's destination (SOCKS5, HTTP CONNECT). The destination is sent
// to the server as the token, so the server's rules decide, and the
// application learns the outcome from Reply before any byte flows.
type Proxy interface {
	// Request reads the application's request and returns the destination
	// token and any bytes the application sent after its request. A
	// malformed or unsupported request has been answered when it returns an
	// error.
	Request(nc net.Conn) (token string, early []byte, err error)
	// Reply answers the request: err nil means connected; otherwise it is
	// the server's refusal (a *proto.RemoteError) or a local failure.
	Reply(nc net.Conn, err error) error
}

// ErrProxyRequest wraps errors about a request a Proxy could not serve.
var ErrProxyRequest = errors.New("proxy request")

// ProxyAuthError is a request turned away for its credentials (it has been
// answered): Proxy and Reason are the labels of
// proxy_auth_failures_total (ProxySOCKS5, ProxyAuthMissing, ...).
type ProxyAuthError struct {
	Proxy, Reason string
}

func (e *ProxyAuthError) Error() string {
	return e.Proxy + ": proxy authentication failed (" + e.Reason + ")"
}

// ProxyCredentials holds the usernames and passwords the proxy entry points
// require; nil (or holding nil) requires none. Set replaces them for the
// requests read from then on (a reload of --proxy-credentials-file). Safe
// for concurrent use.
type ProxyCredentials struct {
	creds atomic.Pointer[socks5.Credentials]
}

// NewProxyCredentials returns a ProxyCredentials holding c.
func NewProxyCredentials(c socks5.Credentials) *ProxyCredentials {
	p := &ProxyCredentials{}
	p.Set(c)
	return p
}

// Set replaces the credentials (nil: none required).
func (p *ProxyCredentials) Set(c socks5.Credentials) { p.creds.Store(&c) }

// Load returns the credentials in force; nil when none are required.
func (p *ProxyCredentials) Load() socks5.Credentials {
	if p == nil {
		return nil
	}
	if c := p.creds.Load(); c != nil {
		return *c
	}
	return nil
}

// errNoSession: the client had no connection to the server in time.
var errNoSession = errors.New("no connection to the server")

// codeOf is the code behind a failure: the server's, or what a local one
// counts as.
func codeOf(err error) proto.Code {
	if c, ok := proto.FromError(err); ok {
		return c
	}
	if errors.Is(err, errStreamCredit) || errors.Is(err, errTooManyConnections) {
		return proto.CodeOverloaded
	}
	return proto.CodeInternal
}

// ErrUDPAssociate is what SOCKS5.Request returns for a UDP ASSOCIATE
// request (as a *UDPAssociateError): the handler answers it with a UDP
// relay (serveAssociate).
var ErrUDPAssociate = errors.New("socks5: UDP ASSOCIATE")

// UDPAssociateError is a UDP ASSOCIATE request: Client is the address and
// port the application declared it will send from (RFC 1928 DST.ADDR and
// DST.PORT; zeros when it does not know them). It matches ErrUDPAssociate.
type UDPAssociateError struct {
	Client socks5.Addr
}

func (e *UDPAssociateError) Error() string {
	return ErrUDPAssociate.Error() + " from " + e.Client.String()
}

// Is reports whether target is ErrUDPAssociate.
func (e *UDPAssociateError) Is(target error) bool { return target == ErrUDPAssociate }

// SOCKS5 is a SOCKS version 5 entry point (RFC 1928): CONNECT and UDP
// ASSOCIATE, with username/password authentication (RFC 1929) while
// Credentials holds any.
type SOCKS5 struct {
	Credentials *ProxyCredentials
}

// Request negotiates and reads a CONNECT request. A client that offers no
// username/password, or a wrong one, while credentials are required gets a
// *ProxyAuthError.
func (s SOCKS5) Request(nc net.Conn) (string, []byte, error) {
	creds := s.Credentials.Load()
	if err := socks5.Negotiate(nc, creds); err != nil {
		switch {
		case errors.Is(err, socks5.ErrAuth):
			err = fmt.Errorf("%w: %w", err, &ProxyAuthError{Proxy: ProxySOCKS5, Reason: ProxyAuthWrong})
		case errors.Is(err, socks5.ErrNoAcceptableMethod) && creds != nil:
			err = fmt.Errorf("%w: %w", err, &ProxyAuthError{Proxy: ProxySOCKS5, Reason: ProxyAuthMissing})
		}
		return "", nil, fmt.Errorf("%w: socks5: %w", ErrProxyRequest, err)
	}
	req, err := socks5.ReadRequest(nc)
	if err != nil {
		if errors.Is(err, socks5.ErrAddressType) {
			_ = socks5.WriteReply(nc, socks5.ReplyAddressNotSupported, socks5.Addr{})
		}
		return "", nil, fmt.Errorf("%w: socks5: %w", ErrProxyRequest, err)
	}
	if req.Command == socks5.CmdUDPAssociate {
		return "", nil, &UDPAssociateError{Client: req.Addr}
	}
	if req.Command != socks5.CmdConnect {
		_ = socks5.WriteReply(nc, socks5.ReplyCommandNotSupported, socks5.Addr{})
		return "", nil, fmt.Errorf("%w: socks5: command %d not supported (CONNECT and UDP ASSOCIATE only)", ErrProxyRequest, req.Command)
	}
	return "tcp:" + req.Addr.String(), nil, nil
}

// Reply writes the SOCKS reply for err: a refusal by the server's rules is
// "connection not allowed by ruleset".
func (SOCKS5) Reply(nc net.Conn, err error) error {
	rep := socks5.ReplySucceeded
	if err != nil {
		switch codeOf(err) {
		case proto.CodeRefused:
			rep = socks5.ReplyNotAllowed
		case proto.CodeDialFailed:
			rep = socks5.ReplyConnectionRefused
		case proto.CodeTimeout:
			rep = socks5.ReplyHostUnreachable
		case proto.CodeBadToken:
			rep = socks5.ReplyAddressNotSupported
		default:
			rep = socks5.ReplyGeneralFailure
		}
		if errors.Is(err, errNoSession) {
			rep = socks5.ReplyNetworkUnreachable
		}
	}
	return socks5.WriteReply(nc, rep, socks5.Addr{})
}

// maxConnectRequest bounds an HTTP CONNECT request's line and headers.
const maxConnectRequest = 16 << 10

// HTTPConnect is an HTTP proxy entry point that serves CONNECT only (what
// curl -x, git and browsers use for HTTPS, and curl -p for anything), with
// Proxy-Authorization: Basic (RFC 7617) while Credentials holds any.
type HTTPConnect struct {
	Credentials *ProxyCredentials
}

// proxyAuthenticate is the challenge of a 407 answer.
const proxyAuthenticate = `Proxy-Authenticate: Basic realm="quictun"` + "\r\n"

// Request reads a CONNECT request. While credentials are required, a
// request without a valid Proxy-Authorization: Basic header is answered
// 407 with a Basic challenge and returns a *ProxyAuthError.
func (c HTTPConnect) Request(nc net.Conn) (string, []byte, error) {
	br := bufio.NewReader(&io.LimitedReader{R: nc, N: maxConnectRequest})
	req, err := http.ReadRequest(br)
	if err != nil {
		writeStatus(nc, http.StatusBadRequest, "")
		return "", nil, fmt.Errorf("%w: http: %w", ErrProxyRequest, err)
	}
	if creds := c.Credentials.Load(); creds != nil {
		if reason := checkBasic(creds, req.Header.Get("Proxy-Authorization")); reason != "" {
			writeStatus(nc, http.StatusProxyAuthRequired, proxyAuthenticate)
			return "", nil, fmt.Errorf("%w: http: %w", ErrProxyRequest, &ProxyAuthError{Proxy: ProxyHTTPConnect, Reason: reason})
		}
	}
	if req.Method != http.MethodConnect {
		writeStatus(nc, http.StatusMethodNotAllowed, "Allow: CONNECT\r\n")
		return "", nil, fmt.Errorf("%w: http: method %s (CONNECT only)", ErrProxyRequest, req.Method)
	}
	if _, port, err := net.SplitHostPort(req.Host); err != nil || port == "" {
		writeStatus(nc, http.StatusBadRequest, "")
		return "", nil, fmt.Errorf("%w: http: CONNECT %q: want host:port", ErrProxyRequest, req.Host)
	}
	var early []byte
	if n := br.Buffered(); n > 0 {
		early, _ = br.Peek(n) // sent before our answer: forwarded after the header
	}
	return "tcp:" + req.Host, early, nil
}

// checkBasic checks a Proxy-Authorization header value against creds: ""
// when it holds a valid pair, else the reason (ProxyAuthMissing for
// no Basic credentials, ProxyAuthWrong for a pair creds does not hold).
func checkBasic(creds socks5.Credentials, header string) string {
	scheme, value, _ := strings.Cut(strings.TrimSpace(header), " ")
	if !strings.EqualFold(scheme, "Basic") {
		return ProxyAuthMissing
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(value))
	if err != nil {
		return ProxyAuthWrong
	}
	user, pass, ok := strings.Cut(string(b), ":")
	if !ok || !creds.Valid(user, pass) {
		return ProxyAuthWrong
	}
	return ""
}

// Reply writes the HTTP status for err: 200, or 403 for a destination the
// server's rules refuse, 502/504 when its dial failed or timed out, 503
// when the tunnel is unavailable.
func (HTTPConnect) Reply(nc net.Conn, err error) error {
	if err == nil {
		_, werr := io.WriteString(nc, "HTTP/1.1 200 Connection established\r\n\r\n")
		return werr
	}
	status := http.StatusBadGateway
	switch codeOf(err) {
	case proto.CodeRefused:
		status = http.StatusForbidden
	case proto.CodeTimeout:
		status = http.StatusGatewayTimeout
	case proto.CodeOverloaded, proto.CodeShutdown:
		status = http.StatusServiceUnavailable
	case proto.CodeBadToken:
		status = http.StatusBadRequest
	}
	if errors.Is(err, errNoSession) {
		status = http.StatusServiceUnavailable
	}
	writeStatus(nc, status, "")
	return nil
}

// writeStatus answers with status and no body, closing the connection.
func writeStatus(w io.Writer, status int, headers string) {
	_, _ = io.WriteString(w, "HTTP/1.1 "+strconv.Itoa(status)+" "+http.StatusText(status)+"\r\n"+
		headers+"Connection: close\r\nContent-Length: 0\r\n\r\n")
}

// associateSource decides which application socket an association
// relays: the one the ASSOCIATE request declared (RFC 1928: DST.ADDR and
// DST.PORT name the address and port the client will send from), with an
// unspecified address meaning the control connection's and port 0 the
// first port that sends. Without a declared port, the first packet from
// the address pins the association to its port. Packets from any other
// source are dropped (udp_drops_total{reason="foreign_source"}), so another
// local process cannot use an association it did not open. Not safe for
// concurrent use: the socket's read loop alone calls accept.
type associateSource struct {
	addr netip.Addr
	port uint16 // 0: not pinned yet
}

// newAssociateSource returns the source of an association declared as
// declared on a control connection from control.
func newAssociateSource(declared socks5.Addr, control netip.Addr) *associateSource {
	a := &associateSource{addr: control.Unmap(), port: declared.Port}
	if declared.IP.IsValid() && !declared.IP.IsUnspecified() {
		a.addr = declared.IP.Unmap()
	}
	return a
}

// accept reports whether src is the association's socket, pinning the
// port to src's when none is pinned yet.
func (a *associateSource) accept(src netip.AddrPort) bool {
	if src.Addr().Unmap() != a.addr {
		return false
	}
	if a.port == 0 {
		a.port = src.Port()
	}
	return src.Port() == a.port
}

// serveAssociate serves a SOCKS5 UDP ASSOCIATE on its control connection nc:
// a UDP relay socket on nc's local address, answered to the application;
// each (application address, destination) of the packets it receives is a
// UDP flow to "udp:" + destination (checked by the server's rules), and the
// answers go back with the SOCKS5 UDP header naming their source. Only
// packets from the application socket the request declared (or the first
// one to send, see associateSource) are relayed. The association, and its
// flows, end when nc closes (RFC 1928 section 6).
func (h *Handler) serveAssociate(ctx context.Context, nc net.Conn, declared socks5.Addr) {
	logger := klog.FromContext(ctx)
	local, _ := netip.ParseAddrPort(nc.LocalAddr().String())
	remote, _ := netip.ParseAddrPort(nc.RemoteAddr().String())
	pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(local.Addr(), 0)))
	if err != nil {
		h.cfg.Events.UDPFlowFailed(proto.CodeInternal.String())
		_ = socks5.WriteReply(nc, socks5.ReplyGeneralFailure, socks5.Addr{})
		_ = nc.Close()
		logger.Error(err, "SOCKS5 UDP ASSOCIATE: could not open a relay socket")
		return
	}
	bound, _ := netip.ParseAddrPort(pc.LocalAddr().String())
	if err := socks5.WriteReply(nc, socks5.ReplySucceeded, socks5.Addr{IP: bound.Addr(), Port: bound.Port()}); err != nil {
		_ = pc.Close()
		_ = nc.Close()
		return
	}
	source := newAssociateSource(declared, remote.Addr())
	logger.V(4).Info("SOCKS5 UDP ASSOCIATE", "remoteAddress", remote.String(), "relay", bound.String(), "declared", declared.String())
	// The association lives as long as its control connection (or ctx).
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	defer stop()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_, _ = io.Copy(io.Discard, nc)
		_ = pc.Close()
	}()
	var flows sync.WaitGroup
	h.serveUDP(ctx, pc, udpSource{parse: func(src netip.AddrPort, b []byte) (string, []byte, []byte, string, bool) {
		if !source.accept(src) {
			return "", nil, nil, udpflow.DropForeignSource, false
		}
		a, payload, err := socks5.ParseUDP(b)
		if err != nil {
			return "", nil, nil, udpflow.DropMalformed, false
		}
		return a.String(), b[:len(b)-len(payload)], payload, "", true
	}}, &flows)
	_ = nc.Close()
	<-closed
	flows.Wait()
}
