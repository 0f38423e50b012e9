package ingress

import (
	"time"

	"github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/pkg/udpflow"
)

// Events are what a Handler reports as it carries local connections and
// UDP flows, named by what happened; the label values are the ones this
// package and those it uses define (ResultNoSession, proto.Code names,
// Proxy* below, udpflow drop reasons). The daemon's metrics implement them
// (metrics.Client: quictun_client_*, and on the server
// quictun_server_reverse_*), NopEvents ignores them.
type Events interface {
	// TunnelOpened and TunnelClosed report a spliced TCP or unix tunnel:
	// the tunnel.Registry reports them as it runs it.
	tunnel.Metrics
	// The UDP flows: their opens and ends (UDPFlowFailed: one that ended
	// before the server's reply), drops, packets, and the bytes their
	// queues hold.
	udpflow.Events
	// Accepted reports a local connection accepted on a listener.
	Accepted()
	// StreamFailed reports a local connection that ended before it was
	// spliced, by result: ResultNoSession, or the name of the proto.Code
	// (the server's answer, or the failure here).
	StreamFailed(result string)
	// ProxyAuthFailed reports a connection to a proxy entry point turned
	// away for its credentials, by proxy (ProxySOCKS5, ProxyHTTPConnect)
	// and reason (ProxyAuthMissing, ProxyAuthWrong).
	ProxyAuthFailed(proxy, reason string)
	// StreamOpened reports how long a tunnel took from the local
	// connection's accept (a flow's first packet) to the server's reply
	// that its destination was dialed.
	StreamOpened(d time.Duration)
}

// ResultNoSession is the StreamFailed (and UDPFlowFailed) result of a local
// connection or flow that found no connection to the server in time.
const ResultNoSession = "no_session"

// Label values of Events.ProxyAuthFailed (ProxyAuthError).
const (
	ProxySOCKS5      = "socks5"
	ProxyHTTPConnect = "http_connect"
	// ProxyAuthMissing: the application offered no username and password.
	ProxyAuthMissing = "missing"
	// ProxyAuthWrong: it offered a pair the credentials file does not hold.
	ProxyAuthWrong = "wrong"
)

// Proxies lists the proxy kinds of Events.ProxyAuthFailed, ProxyAuthReasons
// its reasons, for pre-creating metric labels.
func Proxies() []string { return []string{ProxySOCKS5, ProxyHTTPConnect} }

// ProxyAuthReasons lists the reasons of Events.ProxyAuthFailed.
func ProxyAuthReasons() []string { return []string{ProxyAuthMissing, ProxyAuthWrong} }

// NopEvents is an Events that reports nothing.
type NopEvents struct {
	tunnel.NopMetrics
	udpflow.NopEvents
}

// Accepted implements Events.
func (NopEvents) Accepted() {}

// StreamFailed implements Events.
func (NopEvents) StreamFailed(string) {}

// ProxyAuthFailed implements Events.
func (NopEvents) ProxyAuthFailed(string, string) {}

// StreamOpened implements Events.
func (NopEvents) StreamOpened(time.Duration) {}
