package admin

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// Reasons the admin API refused a request without the bearer token
// (Options.Refused).
const (
	// RefusedHost: the Host header is not a loopback name or address nor
	// the admin listener's address (DNS rebinding, or a wrong name).
	RefusedHost = "host"
	// RefusedOrigin: a web page's request, by its Origin header (any
	// Origin on a method that changes state, another host's on a read).
	RefusedOrigin = "origin"
)

// RefusedReasons lists the reasons of Options.Refused, for pre-creating
// metric labels.
func RefusedReasons() []string { return []string{RefusedHost, RefusedOrigin} }

// refusalLogInterval is the shortest time between two log lines about
// refused requests; the counter has every refusal.
const refusalLogInterval = 10 * time.Second

// guard protects the admin API from web pages (issue 21): a page that makes
// its name resolve to 127.0.0.1 (DNS rebinding) becomes same-origin with the
// admin API and could read /tunnels and DELETE /tunnels/{id}. Browsers send
// the page's name in Host and, on cross-origin and state-changing requests,
// an Origin header; the guard checks both on every request that does not
// carry the valid bearer token. Safe for concurrent use.
type guard struct {
	token      []byte     // "Bearer <token>", nil without a token
	listenIP   netip.Addr // the listener's own IP, invalid when unknown or a wildcard
	listenAddr string     // for the refusal's hint, "" when unknown
	refused    func(reason string)
	nextLog    atomic.Int64 // unix nanoseconds before which refusals are not logged
}

func newGuard(o Options) *guard {
	g := &guard{refused: o.Refused}
	if o.BearerToken != "" {
		g.token = []byte("Bearer " + o.BearerToken)
	}
	if o.ListenAddr != nil {
		g.listenAddr = o.ListenAddr.String()
		if ap, err := netip.ParseAddrPort(o.ListenAddr.String()); err == nil {
			if ip := ap.Addr().WithZone("").Unmap(); !ip.IsUnspecified() {
				g.listenIP = ip
			}
		}
	}
	return g
}

// validToken reports whether r carries the configured bearer token (false
// when none is configured).
func (g *guard) validToken(r *http.Request) bool {
	return g.token != nil && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), g.token) == 1
}

// wrap applies the guard in front of h. /healthz and /readyz are exempt:
// they need no token either (kubelet probes by pod IP), and tell a page no
// more than "ok".
func (g *guard) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || g.validToken(r) {
			h.ServeHTTP(w, r)
			return
		}
		if reason, msg := g.check(r); reason != "" {
			g.refuse(w, r, reason, msg)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// check returns why r is refused (a Refused* reason and the
// response body), or "" to serve it.
func (g *guard) check(r *http.Request) (reason, msg string) {
	host, ok := hostOf(r.Host)
	if !ok || !g.allowedHost(host) {
		fix := "set --httpd-token-file and send \"Authorization: Bearer <token>\" to reach the admin API by another name"
		if g.token != nil {
			fix = "send \"Authorization: Bearer <token>\" (the --httpd-token-file token) to reach the admin API by another name"
		}
		listener, use := "", ""
		if g.listenAddr != "" {
			listener, use = " ("+g.listenAddr+")", "use http://"+g.listenAddr+"/, or "
		}
		return RefusedHost, fmt.Sprintf("admin API: refused Host %q: without the bearer token only a loopback name "+
			"or address (localhost, 127.0.0.0/8, [::1]) or the listener's address%s is answered, "+
			"so that a web page cannot reach it by DNS rebinding; %s%s", r.Host, listener, use, fix)
	}
	origin := r.Header.Values("Origin")
	if len(origin) == 0 {
		return "", ""
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		if len(origin) == 1 && sameHost(origin[0], host) {
			return "", ""
		}
		return RefusedOrigin, fmt.Sprintf("admin API: refused Origin %q: without the bearer token a request from "+
			"a web page of another origin than %s is refused; use curl or a script (no Origin header)", strings.Join(origin, ", "), r.Host)
	default:
		return RefusedOrigin, fmt.Sprintf("admin API: refused %s with Origin %q: without the bearer token a request "+
			"that changes state is refused from any web page; use curl or a script (no Origin header), or send "+
			"\"Authorization: Bearer <token>\" (--httpd-token-file)", r.Method, strings.Join(origin, ", "))
	}
}

// allowedHost reports whether host (no port, no brackets) is a loopback name
// or address or the listener's own IP.
func (g *guard) allowedHost(host string) bool {
	if strings.EqualFold(host, "localhost") || strings.EqualFold(host, "localhost.") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	ip = ip.WithZone("").Unmap()
	return ip.IsLoopback() || (g.listenIP.IsValid() && ip == g.listenIP)
}

// hostOf returns the host of a Host header value: the port stripped and an
// IPv6 address's brackets removed; ok is false for an empty or malformed value.
func hostOf(hostport string) (string, bool) {
	if hostport == "" {
		return "", false
	}
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h, h != ""
	}
	if strings.HasPrefix(hostport, "[") {
		if !strings.HasSuffix(hostport, "]") {
			return "", false
		}
		return hostport[1 : len(hostport)-1], true
	}
	if strings.ContainsAny(hostport, "[]") {
		return "", false
	}
	return hostport, true
}

// sameHost reports whether the Origin value names host (the request's, port
// ignored; names compared without case, addresses by value).
func sameHost(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	oh, ok := hostOf(u.Host)
	if !ok {
		return false
	}
	a, errA := netip.ParseAddr(oh)
	b, errB := netip.ParseAddr(host)
	if errA == nil && errB == nil {
		return a.WithZone("").Unmap() == b.WithZone("").Unmap()
	}
	return errA != nil && errB != nil && strings.EqualFold(strings.TrimSuffix(oh, "."), strings.TrimSuffix(host, "."))
}

// refuse answers 403 with msg, counts the refusal and logs it at most once
// per refusalLogInterval.
func (g *guard) refuse(w http.ResponseWriter, r *http.Request, reason, msg string) {
	if g.refused != nil {
		g.refused(reason)
	}
	now := time.Now().UnixNano()
	if next := g.nextLog.Load(); now >= next && g.nextLog.CompareAndSwap(next, now+int64(refusalLogInterval)) {
		klog.FromContext(r.Context()).V(2).Info("Refused admin request",
			"reason", reason, "method", r.Method, "path", r.URL.Path, "host", r.Host,
			"origin", r.Header.Get("Origin"), "remoteAddress", r.RemoteAddr)
	}
	http.Error(w, msg, http.StatusForbidden)
}
