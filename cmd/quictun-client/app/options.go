// Package app wires quictun-client: flags, config, signals, admin server.
package app

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/pkg/admin"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/transport"
)

// Options are every setting of quictun-client. NewOptions holds the defaults.
type Options struct {
	cli.ConfigFlags
	cli.DaemonFlags

	// Client is the client's Config, filled once: the flags bind into its
	// limits and timeouts (NewOptions holds client.DefaultConfig), Run adds
	// the sockets, credentials and entry points.
	Client client.Config

	ListenOn          []string
	ListenNonLoopback bool
	ServerEndpoint    []string
	ServerMode        string
	TokenSourcePlugin string
	TokenSource       string
	Forward           []string
	RemoteForward     []string
	Proxy             []string
	ProxyCredentials  string

	ServerFingerprint  []string
	CAFile             string
	ServerName         string
	InsecureSkipVerify bool
	CertFile           string
	KeyFile            string
	SecretFile         string
	InsecureNoAuth     bool
	SessionFile        string

	// ReconnectMax is Client.Backoff's Max.
	ReconnectMax time.Duration

	// entries are the local entry points and token source as Validate
	// parsed them, for Run: each value is parsed once.
	entries *entries

	reloader *cli.Reloader
	// resume: the resumable tunnels, made by Run (their window reloadable).
	resume *cli.Resume
}

// entries are the parsed --forward and --token-source.
type entries struct {
	// tokens is the --token-source of the --listen-on listeners (nil
	// without one, and for the File plugin, whose file Run reads).
	tokens   token.Source
	forwards []forwardSpec
	// remote are the --remote-forward entries, in order (the index is the
	// binding's ID).
	remote []client.RemoteForward
}

// forwardSpec is one parsed --forward LISTEN=DESTINATION.
type forwardSpec struct {
	spec   string // as given
	listen endpoint.Endpoint
	dest   string
	tokens token.Source // Fixed, dest
}

// Fresh returns Options with the defaults, for a reload to load into.
func (o *Options) Fresh() cli.Daemon { return NewOptions() }

// SetReloader gives Run the Reloader it watches for SIGHUP.
func (o *Options) SetReloader(r *cli.Reloader) { o.reloader = r }

// NewOptions returns the defaults.
func NewOptions() *Options {
	def := client.DefaultConfig()
	return &Options{
		DaemonFlags: cli.NewDaemonFlags(cli.DaemonDefaults{HTTPDListenOn: "127.0.0.1:8087",
			DrainTimeout: def.DrainTimeout, TailProbes: def.TailProbes, UDPIdleTimeout: def.UDPIdleTimeout}),
		Client:            def,
		ListenOn:          []string{"tcp:127.0.0.1:6500"},
		TokenSourcePlugin: token.PluginFixed,
		ReconnectMax:      client.DefaultBackoff().Max,
		ServerMode:        string(def.Mode),
	}
}

// Flag groups, shown as sections in --help (cli.NewRootCommand adds
// congestion control, configuration and logging).
var flagGroups = []cli.FlagGroup{
	{Title: "Tunnel", Names: []string{"listen-on", "listen-non-loopback", "server-endpoint", "server-mode", "connections", "server-failback-after", "transport", "tcp-server-endpoint", "token-source-plugin", "token-source", "forward", "remote-forward", "proxy", "proxy-credentials-file"}},
	{Title: "Server verification and client authentication", Names: []string{"server-fingerprint", "ca-file", "server-name", "insecure-skip-verify", "secret-file", "cert-file", "key-file", "insecure-no-auth", "session-file"}},
	{Title: "Admin HTTP server", Names: cli.AdminFlagNames},
	{Title: "Timeouts and limits", Names: slices.Concat(cli.TimeoutFlagNames, []string{"session-wait-timeout", "stream-open-timeout", "max-connections", "max-proxy-handshakes", "udp-idle-timeout", "reconnect-max-delay"})},
	{Title: "Loss and blackout recovery", Names: slices.Concat([]string{"heartbeat-interval", "rescue-after", "route-watch"}, cli.RecoveryFlagNames)},
}

// Config returns the config-file flags.
func (o *Options) Config() *cli.ConfigFlags { return &o.ConfigFlags }

// AddFlags binds every option to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.DaemonFlags.AddFlags(fs, cli.DaemonHelp{
		FEC:        "forward error correction K/M, e.g. 10/3: after every K datagrams (or 1 ms), M Reed-Solomon parity datagrams let the server rebuild up to M lost ones before QUIC sees a loss; keeps throughput under random loss at M/K more bandwidth; costs GSO; the server needs --fec too; empty = off",
		TailProbes: "tiny datagrams sent 1 ms after each burst of upstream data (two RTTs + 2 ms on paths under 4 ms, RTT/8 up to 5 ms on longer ones; skipped if the answer came first), so a lost packet is detected in ~1.1 RTT instead of a probe timeout; 0 disables (saves ~40 B per burst)",
	})
	fs.StringSliceVar(&o.ListenOn, "listen-on", o.ListenOn, "local listeners for applications, e.g. tcp:127.0.0.1:6500,unix:/run/quictun/app.sock")
	fs.BoolVar(&o.ListenNonLoopback, "listen-non-loopback", o.ListenNonLoopback, "allow --listen-on TCP addresses beyond loopback: anyone who can reach them uses this client's credentials and reaches what the server allows")
	fs.StringSliceVar(&o.ServerEndpoint, "server-endpoint", o.ServerEndpoint, "quictun-server UDP address, e.g. server.example.com:7500; several (comma-separated, repeated, or a YAML list) in order of preference, each kept connected (a warm standby); a name resolving to several addresses of one family counts as one server per address")
	fs.StringVar(&o.ServerMode, "server-mode", o.ServerMode, "with several servers, where new tunnels go: failover (the first healthy server in --server-endpoint order; when it stops answering heartbeats, the next one at once) or spread (the healthy connection with the fewest active streams, over all servers)")
	fs.IntVar(&o.Client.ConnectionsPerServer, "connections", o.Client.ConnectionsPerServer, "QUIC connections to each server, each reconnecting on its own; new tunnels go to the one with the fewest active streams")
	fs.DurationVar(&o.Client.FailbackAfter, "server-failback-after", o.Client.FailbackAfter, "failover mode: how long a server earlier in --server-endpoint must have answered again before new tunnels move back to it (hysteresis against flapping)")
	fs.StringVar(&o.Client.Transport, "transport", o.Client.Transport, "what carries tunnels: auto (QUIC; while QUIC does not get through, UDP blocked, new tunnels go over TCP, TLS 1.3 to the server's --tcp-listen-on, and back to QUIC as soon as it works), quic, or tcp")
	fs.StringVar(&o.Client.TCPServerAddr, "tcp-server-endpoint", o.Client.TCPServerAddr, "quictun-server TCP address for --transport auto or tcp (its --tcp-listen-on); with several --server-endpoint, the first server's (the others are reached on TCP at their --server-endpoint host:port); empty = --server-endpoint")
	fs.StringVar(&o.TokenSourcePlugin, "token-source-plugin", o.TokenSourcePlugin, "how the destination token is chosen: Fixed (--token-source is the token), File (--token-source is a file of 'IP-or-CIDR token' lines), Http (--token-source is a URL, GET ?addr=<client IP> returns {\"token\": ...})")
	fs.StringSliceVar(&o.Proxy, "proxy", o.Proxy, "a local entry point where each application names its destination, repeatable: socks5:127.0.0.1:1080 (SOCKS5 CONNECT and UDP ASSOCIATE; curl --socks5-hostname, ssh -o ProxyCommand='nc -X 5 -x ...') or http-connect:127.0.0.1:8080 (HTTP CONNECT; curl -x, git, https_proxy); each destination is checked by the server's --allow rules, and a refusal is answered as SOCKS 'not allowed by ruleset' or HTTP 403")
	fs.StringVar(&o.ProxyCredentials, "proxy-credentials-file", o.ProxyCredentials, "file (mode 0600) of USER:PASSWORD lines that every --proxy client must present: SOCKS5 username/password (RFC 1929), HTTP CONNECT Proxy-Authorization: Basic (407 otherwise); re-read on SIGHUP; empty: none, any local process may use the proxies")
	fs.StringSliceVar(&o.Forward, "forward", o.Forward, "LISTEN=DESTINATION, repeatable: one more local listener whose connections all go to DESTINATION, e.g. tcp:127.0.0.1:2222=tcp:127.0.0.1:22 (ssh) beside tcp:127.0.0.1:5433=tcp:10.0.0.5:5432; all forwards share one QUIC connection. --listen-on with --token-source is the single-forward form; with --forward alone, --token-source may be empty and --listen-on is not opened")
	fs.StringArrayVar(&o.RemoteForward, "remote-forward", o.RemoteForward, "LISTEN=DESTINATION, repeatable: a reverse forward. The server listens at LISTEN (if its --allow-remote-listen rules let this client) and each connection it accepts there comes back through the tunnel to DESTINATION, which this client dials: e.g. tcp:0.0.0.0:8022=tcp:127.0.0.1:22 exposes this host's ssh on the server's port 8022; udp:0.0.0.0:5353=udp:127.0.0.1:53, unix:/run/quictun/app.sock=tcp:127.0.0.1:8080. The server can only name these entries, never another destination. Asked again on every reconnect")
	fs.StringVar(&o.TokenSource, "token-source", o.TokenSource, "the token source, e.g. tcp:127.0.0.1:22 for Fixed; tokens name tcp:HOST:PORT or unix:/path on the server side")

	fs.StringSliceVar(&o.ServerFingerprint, "server-fingerprint", o.ServerFingerprint, "pin the server certificate: sha256:<hex> as printed by 'quictun-server fingerprint' (accepted from every server without pins of its own), or HOST:PORT=sha256:<hex> for the server at that --server-endpoint only (which then accepts only its own pins, so one server's key cannot impersonate another; a name resolving to several addresses is one endpoint); several (comma-separated or repeated) are each accepted, to rotate a key without downtime; reloaded on SIGHUP (from the config file) for new connections")
	fs.StringVar(&o.CAFile, "ca-file", o.CAFile, "verify the server certificate against these PEM CAs")
	fs.StringVar(&o.ServerName, "server-name", o.ServerName, "name to verify in the server certificate with --ca-file (default: the host of --server-endpoint)")
	fs.BoolVar(&o.InsecureSkipVerify, "insecure-skip-verify", o.InsecureSkipVerify, "do not verify the server (anyone on the path can impersonate it)")
	fs.StringVar(&o.SecretFile, "secret-file", o.SecretFile, "file holding the shared secret the server expects")
	fs.StringVar(&o.CertFile, "cert-file", o.CertFile, "client certificate for mutual TLS (with --key-file)")
	fs.StringVar(&o.KeyFile, "key-file", o.KeyFile, "private key for --cert-file")
	fs.BoolVar(&o.InsecureNoAuth, "insecure-no-auth", o.InsecureNoAuth, "send no credentials (the server must run with --insecure-no-auth)")
	fs.StringVar(&o.SessionFile, "session-file", o.SessionFile, "keep TLS session tickets in this file (mode 0600, holds resumption secrets: protect it like --secret-file) so a restarted client resumes with 0-RTT, its first bytes after one RTT; empty = in memory only")

	fs.DurationVar(&o.Client.SessionWait, "session-wait-timeout", o.Client.SessionWait, "how long a local connection waits for a connection to the server before it is reset")
	fs.DurationVar(&o.Client.StreamOpenTimeout, "stream-open-timeout", o.Client.StreamOpenTimeout, "how long to wait for stream credit when the server's stream limit is reached")
	fs.IntVar(&o.Client.MaxConnections, "max-connections", o.Client.MaxConnections, "concurrent local connections and UDP flows; more are reset (UDP: the packets of a new flow are dropped); a --proxy connection counts once its request is read and authenticated")
	fs.IntVar(&o.Client.MaxProxyHandshakes, "max-proxy-handshakes", o.Client.MaxProxyHandshakes, "concurrent --proxy connections still sending their request (each for at most 5s), apart from --max-connections so that idle ones cannot stop the forwards; more are reset")
	fs.DurationVar(&o.Client.HeartbeatInterval, "heartbeat-interval", o.Client.HeartbeatInterval, "send a heartbeat datagram this often (about 60 B each way) while the connection has work (a tunnel opening, bytes in the last 5 s, a rescue); idle, only --keepalive-period's keep-alives go out; after a blackout the tunnel resumes within about one interval instead of a backed-off probe timeout; 0 disables heartbeats and path rescue")
	fs.DurationVar(&o.Client.RescueAfter, "rescue-after", o.Client.RescueAfter, "without a heartbeat echo for this long, probe a new path (fresh UDP socket) and switch to it as soon as the server answers")
	fs.BoolVar(&o.Client.RouteWatch, "route-watch", o.Client.RouteWatch, "Linux: watch the routing table and addresses, and when the route to the server changes (another source address or interface) move the connection to a path the new way at once (validated first, then switched), not only after --rescue-after without an echo; needs --heartbeat-interval > 0; elsewhere off")
	fs.DurationVar(&o.ReconnectMax, "reconnect-max-delay", o.ReconnectMax, "longest pause between reconnect attempts (exponential backoff with jitter from 100ms)")
}

// Validate returns every problem at once.
//
//nolint:funlen // a flat list of independent checks, each naming its flag (errors.Join)
func (o *Options) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(o.ListenOn) == 0 && len(o.Forward) == 0 && len(o.Proxy) == 0 && len(o.RemoteForward) == 0 {
		add("--listen-on needs at least one listener")
	}
	checkListen := func(flag, l string) {
		ep, err := endpoint.Parse(l)
		if err != nil {
			add("--%s %q: %w", flag, l, err)
			return
		}
		// The same test as a non-loopback admin listener (cli.ValidateAdmin).
		if ep.Network == endpoint.NetworkUDP && flag != "forward" {
			add("--%s %q: UDP is forwarded with --forward udp:LISTEN=udp:DESTINATION", flag, l)
			return
		}
		if ep.Network != endpoint.NetworkUnix && !admin.IsLoopback(ep.Address) && !o.ListenNonLoopback {
			add("--%s %s is not loopback: anyone who can reach it uses this client's credentials; add --listen-non-loopback if that is intended, or listen on 127.0.0.1", flag, l)
		}
	}
	if o.TokenSource != "" || len(o.Forward)+len(o.Proxy)+len(o.RemoteForward) == 0 {
		for _, l := range o.ListenOn {
			checkListen("listen-on", l)
		}
	}
	for _, p := range o.Proxy {
		kind, addr, _ := strings.Cut(p, ":")
		if kind != ProxySOCKS5 && kind != ProxyHTTPConnect {
			add("--proxy %q: want socks5:HOST:PORT or http-connect:HOST:PORT", p)
			continue
		}
		checkListen("proxy", "tcp:"+addr)
	}
	parsed := &entries{}
	for _, f := range o.Forward {
		listen, dest, err := splitForward(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		checkListen("forward", listen)
		if _, err := endpoint.Parse(dest); err != nil {
			// Said as a destination: "token source" is the legacy form's word.
			add("--forward %s: destination: %w", f, err)
			continue
		}
		ts, err := token.NewSource(token.PluginFixed, dest, nil)
		if err != nil {
			add("--forward %s: destination: %w", f, err)
		} else if l, d := networkOf(listen), networkOf(dest); (l == endpoint.NetworkUDP) != (d == endpoint.NetworkUDP) {
			add("--forward %s: a udp: listener forwards to a udp: destination, and a stream listener to a tcp: or unix: one", f)
		} else if ep, err := endpoint.Parse(listen); err == nil {
			parsed.forwards = append(parsed.forwards, forwardSpec{spec: f, listen: ep, dest: dest, tokens: ts})
		}
	}
	switch o.Client.Transport {
	case "", client.TransportAuto, client.TransportQUIC, client.TransportTCP:
	default:
		add("--transport must be auto, quic or tcp, not %q", o.Client.Transport)
	}
	if o.Client.TCPServerAddr != "" {
		if err := cli.ValidateHostPort("tcp-server-endpoint", o.Client.TCPServerAddr, true, false); err != nil {
			errs = append(errs, err)
		}
	}
	for i, f := range o.RemoteForward {
		rf, err := parseRemoteForward(f)
		switch {
		case err != nil:
			errs = append(errs, err)
		case i > proto.MaxBindID:
			add("--remote-forward: at most %d", proto.MaxBindID+1)
		default:
			parsed.remote = append(parsed.remote, rf)
		}
	}
	if len(o.ServerEndpoint) == 0 {
		add("--server-endpoint is required")
	}
	for i, ep := range o.ServerEndpoint {
		if err := cli.ValidateHostPort("server-endpoint", ep, true, false); err != nil {
			errs = append(errs, err)
		} else if slices.Contains(o.ServerEndpoint[:i], ep) {
			add("--server-endpoint %s is listed twice", ep)
		}
	}
	if _, err := client.ParseMode(o.ServerMode); err != nil {
		add("--server-mode: %w", err)
	}
	if o.Client.ConnectionsPerServer < 1 || o.Client.ConnectionsPerServer > maxConnectionsPerServer {
		add("--connections must be between 1 and %d", maxConnectionsPerServer)
	}
	if o.Client.FailbackAfter <= 0 {
		add("--server-failback-after must be positive")
	}
	if o.TokenSource == "" {
		if len(o.Forward)+len(o.Proxy)+len(o.RemoteForward) == 0 {
			add("--token-source is required (e.g. tcp:127.0.0.1:22), or give --forward LISTEN=DESTINATION or --proxy")
		}
	} else if !strings.EqualFold(o.TokenSourcePlugin, token.PluginFile) { // a File source's file is read by Run (and CheckFiles)
		ts, err := token.NewSource(o.TokenSourcePlugin, o.TokenSource, nil)
		if err != nil {
			add("--token-source: %w", err)
		}
		parsed.tokens = ts
	}
	verifiers := 0
	for _, set := range []bool{len(o.ServerFingerprint) > 0, o.CAFile != "", o.InsecureSkipVerify} {
		if set {
			verifiers++
		}
	}
	switch {
	case verifiers == 0:
		add("server verification is required: set --server-fingerprint or --ca-file (or --insecure-skip-verify explicitly)")
	case verifiers > 1:
		add("choose one of --server-fingerprint, --ca-file, --insecure-skip-verify")
	}
	if pins, err := transport.ParsePins(o.ServerFingerprint); err != nil {
		errs = append(errs, err)
	} else if err := pins.Check(o.ServerEndpoint); err != nil {
		errs = append(errs, err)
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		add("--cert-file and --key-file go together")
	}
	if o.SecretFile == "" && o.CertFile == "" && !o.InsecureNoAuth {
		add("client authentication is required: set --secret-file or --cert-file/--key-file (or --insecure-no-auth explicitly)")
	}
	if o.InsecureNoAuth && (o.SecretFile != "" || o.CertFile != "") {
		add("--insecure-no-auth contradicts --secret-file/--cert-file")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"session-wait-timeout", o.Client.SessionWait}, {"stream-open-timeout", o.Client.StreamOpenTimeout}, {"reconnect-max-delay", o.ReconnectMax}} {
		if d.v <= 0 {
			add("--%s must be positive", d.name)
		}
	}
	if o.Client.HeartbeatInterval < 0 {
		add("--heartbeat-interval must not be negative")
	}
	if o.Client.HeartbeatInterval > 0 && o.Client.RescueAfter < 2*o.Client.HeartbeatInterval {
		add("--rescue-after (%s) must be at least twice --heartbeat-interval (%s)", o.Client.RescueAfter, o.Client.HeartbeatInterval)
	}
	if o.Client.MaxConnections < 1 {
		add("--max-connections must be at least 1")
	}
	if o.Client.MaxProxyHandshakes < 1 {
		add("--max-proxy-handshakes must be at least 1")
	}
	errs = append(errs, o.DaemonFlags.Validate()...)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	o.entries = parsed
	return nil
}

// CheckFiles reads the files the client reads at start (for --check-config);
// see cli.CheckStartFiles.
func (o *Options) CheckFiles() error {
	errs := cli.CheckStartFiles(cli.StartFiles{SecretFile: o.SecretFile, HTTPDTokenFile: o.HTTPDTokenFile,
		CAFlag: "ca-file", CAFile: o.CAFile, CertFile: o.CertFile, KeyFile: o.KeyFile, SessionFile: o.SessionFile})
	if _, err := proxyCredentials(o.ProxyCredentials); err != nil {
		errs = append(errs, err)
	}
	if strings.EqualFold(o.TokenSourcePlugin, token.PluginFile) {
		if _, err := token.NewSource(o.TokenSourcePlugin, o.TokenSource, nil); err != nil {
			errs = append(errs, fmt.Errorf("--token-source: %w", err))
		}
	}
	return errors.Join(errs...)
}

// maxConnectionsPerServer bounds --connections.
const maxConnectionsPerServer = 16

// --proxy kinds.
const (
	ProxySOCKS5      = "socks5"
	ProxyHTTPConnect = "http-connect"
)

// networkOf returns the network prefix of an endpoint ("tcp", "udp", "unix").
func networkOf(spec string) string {
	n, _, _ := strings.Cut(spec, ":")
	return n
}

// parseRemoteForward parses a --remote-forward value LISTEN=DESTINATION:
// two endpoints, both udp: or both stream ones (tcp:, unix:).
func parseRemoteForward(f string) (client.RemoteForward, error) {
	listen, dest, ok := strings.Cut(f, "=")
	if !ok || listen == "" || dest == "" {
		return client.RemoteForward{}, fmt.Errorf("--remote-forward %q: want LISTEN=DESTINATION, e.g. tcp:0.0.0.0:8022=tcp:127.0.0.1:22", f)
	}
	l, err := endpoint.Parse(listen)
	if err != nil {
		return client.RemoteForward{}, fmt.Errorf("--remote-forward %s: listen: %w", f, err)
	}
	d, err := endpoint.Parse(dest)
	if err != nil {
		return client.RemoteForward{}, fmt.Errorf("--remote-forward %s: destination: %w", f, err)
	}
	if (l.Network == endpoint.NetworkUDP) != (d.Network == endpoint.NetworkUDP) {
		return client.RemoteForward{}, fmt.Errorf("--remote-forward %s: a udp: listener forwards to a udp: destination, and a stream listener to a tcp: or unix: one", f)
	}
	return client.RemoteForward{Listen: l, Destination: d}, nil
}

// splitForward splits a --forward value LISTEN=DESTINATION.
func splitForward(f string) (listen, dest string, err error) {
	listen, dest, ok := strings.Cut(f, "=")
	if !ok || listen == "" || dest == "" {
		return "", "", fmt.Errorf("--forward %q: want LISTEN=DESTINATION, e.g. tcp:127.0.0.1:2222=tcp:127.0.0.1:22", f)
	}
	return listen, dest, nil
}
