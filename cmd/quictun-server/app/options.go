// Package app wires quictun-server: flags, config, signals, admin server.
package app

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/pflag"

	"github.com/quictun/quictun/cmd/internal/cli"

	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/server"
)

// Options are every setting of quictun-server. NewOptions holds the defaults.
type Options struct {
	cli.ConfigFlags
	cli.DaemonFlags

	// Server is the server's Config, filled once: the flags bind into its
	// limits and timeouts (NewOptions holds server.DefaultConfig), Run adds
	// what is read from files (rules, keys, TLS).
	Server server.Config

	ListenOn string
	// TCPListenOn is the TCP address for clients whose UDP is blocked: ""
	// the address of ListenOn, "off" none.
	TCPListenOn string
	Allow       []string
	Deny        []string
	AllowFor    []string
	// AllowRemoteListen are the --allow-remote-listen rules: LISTEN, or
	// IDENTITY=LISTEN for one client.
	AllowRemoteListen []string

	StateDir       string
	CertFile       string
	KeyFile        string
	ClientCAFile   string
	SecretFile     string
	KeysFile       string
	InsecureNoAuth bool
	// CutRemovedKeys: a reload that removes a key resets its open tunnels.
	CutRemovedKeys bool

	TokenParserPlugin string
	TokenParserKey    string

	MaxStreamsPerConn int64
	Disable0RTT       bool

	// UDPSocketMemoryMiB: 0 means udpflow.MaxSocketMemory
	// (Server.UDPSocketMemory in bytes).
	UDPSocketMemoryMiB int64

	reloader *cli.Reloader
}

// Fresh returns Options with the defaults, for a reload to load into.
func (o *Options) Fresh() cli.Daemon { return NewOptions() }

// SetReloader gives Run the Reloader it watches for SIGHUP.
func (o *Options) SetReloader(r *cli.Reloader) { o.reloader = r }

// NewOptions returns the defaults.
func NewOptions() *Options {
	q := transport.DefaultQUICOptions()
	def := server.DefaultConfig()
	def.AuditLog = true
	def.MaxReplayEntriesPerConn = def.MaxReplayEntries / 64
	return &Options{
		DaemonFlags: cli.NewDaemonFlags(cli.DaemonDefaults{HTTPDListenOn: "127.0.0.1:8086",
			DrainTimeout: def.DrainTimeout, TailProbes: def.TailProbes, UDPIdleTimeout: def.UDPIdleTimeout}),
		Server:            def,
		ListenOn:          "0.0.0.0:7500",
		Allow:             endpoint.DefaultAllowList().Rules(),
		CutRemovedKeys:    true,
		StateDir:          "/var/lib/quictun-server",
		TokenParserPlugin: token.PluginCleartext,
		MaxStreamsPerConn: q.MaxIncomingStreams,
	}
}

// Flag groups, shown as sections in --help (cli.NewRootCommand adds
// congestion control, configuration and logging).
var flagGroups = []cli.FlagGroup{
	{Title: "Listening and destinations", Names: []string{"listen-on", "tcp-listen-on", "allow", "deny", "allow-for", "allow-remote-listen", "token-parser-plugin", "token-parser-key"}},
	{Title: "Identity and authentication", Names: []string{"state-dir", "replica-id", "cert-file", "key-file", "client-ca-file", "secret-file", "keys-file", "cut-removed-keys", "insecure-no-auth"}},
	{Title: "Admin HTTP server and logs", Names: slices.Concat(cli.AdminFlagNames, []string{"audit-log"})},
	{Title: "Timeouts and limits", Names: slices.Concat(cli.TimeoutFlagNames, []string{"header-timeout", "dial-timeout", "max-streams-per-conn", "max-concurrent-dials", "max-dials-per-destination", "handshake-rate", "max-conns-per-source", "max-connections", "max-tcp-handshakes", "disable-0rtt"})},
	{Title: "Loss recovery", Names: cli.RecoveryFlagNames},
	{Title: "UDP flows", Names: []string{"max-udp-flows", "max-udp-flows-per-conn", "max-udp-flows-per-identity", "udp-idle-timeout", "udp-socket-memory-mib"}},
	{Title: "Reverse forwards", Names: []string{"max-remote-listeners", "max-remote-listeners-per-conn", "max-remote-listeners-per-identity"}},
	{Title: "Before authentication (peers that have not proven the shared secret)", Names: []string{"auth-timeout", "idle-auth-timeout", "max-unverified-streams-per-conn", "max-unverified-streams", "max-unverified-streams-per-source", "max-replay-entries-per-conn"}},
}

// Config returns the config-file flags.
func (o *Options) Config() *cli.ConfigFlags { return &o.ConfigFlags }

// AddFlags binds every option to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.DaemonFlags.AddFlags(fs, cli.DaemonHelp{
		FEC:        "answer clients that use forward error correction with parity of K/M, e.g. 10/3 (see quictun-client --fec); plain clients are still served; costs GSO for all; empty = off",
		TailProbes: "tiny datagrams sent 1 ms after each burst of downstream data (two RTTs + 2 ms on paths under 4 ms, RTT/8 up to 5 ms on longer ones; skipped if the answer came first), so a lost packet is detected in ~1.1 RTT instead of a probe timeout; 0 disables",
	})
	fs.StringVar(&o.ListenOn, "listen-on", o.ListenOn, "UDP address to accept QUIC connections on, e.g. 0.0.0.0:7500 or [::]:7500")
	fs.StringVar(&o.TCPListenOn, "tcp-listen-on", o.TCPListenOn, "TCP address to accept connections on from clients whose UDP is blocked (TLS 1.3, HTTP/2 framing; the same authentication, limits and rules as QUIC), e.g. 0.0.0.0:443; empty = the address of --listen-on (if that TCP port is taken, the server says so and runs without); off = none")
	fs.StringSliceVar(&o.Allow, "allow", o.Allow, "destinations clients may reach (the server is never an open proxy), e.g. tcp:127.0.0.1:22,db=tcp:10.0.0.0/8:5432,tcp:10.1.0.1:8000-8100,unix:/run/app.sock; default: loopback only. Never reachable whatever the rules: the server's own QUIC and admin listeners, 0.0.0.0 and ::, and cloud metadata (169.254.169.254, fd00:ec2::254, ...), multicast (224.0.0.0/4, ff00::/8) and broadcast (255.255.255.255) addresses unless a rule names them exactly")
	fs.StringSliceVar(&o.AllowFor, "allow-for", o.AllowFor, "destinations only some clients may reach, IDENTITY=RULE (repeatable): CN=NAME for a client certificate's common name (needs --client-ca-file), key=NAME for a --keys-file key; e.g. CN=ci-runner=tcp:10.0.0.5:5432. Added to --allow for that client; --deny still wins")
	fs.StringSliceVar(&o.AllowRemoteListen, "allow-remote-listen", o.AllowRemoteListen, "addresses clients may ask this server to listen on for their reverse forwards (quictun-client --remote-forward), repeatable: LISTEN for every client, or IDENTITY=LISTEN for one (CN=NAME or key=NAME, as --allow-for); LISTEN in --allow's forms with IP addresses, matched as written: tcp:0.0.0.0:8022 (every IPv4 address, port 8022), tcp:127.0.0.1:9000-9100, udp:0.0.0.0:5353, unix:/run/quictun/rev/*; e.g. key=laptop=tcp:0.0.0.0:8022. Each connection accepted there goes to the client, which dials only what its --remote-forward declares. Default: none, reverse forwards are refused")
	fs.BoolVar(&o.Server.AuditLog, "audit-log", o.Server.AuditLog, "log one line per tunnel at -v 0 once its client is authenticated: identity, remote address, destination, result, bytes, duration (--audit-log=false turns it off)")
	fs.StringSliceVar(&o.Deny, "deny", o.Deny, "destinations refused even when --allow matches (deny wins); same forms as --allow, e.g. --allow tcp:0.0.0.0/0:443 --deny tcp:169.254.0.0/16:*,tcp:fe80::/10:*,tcp:10.0.0.0/8:*")
	fs.StringVar(&o.TokenParserPlugin, "token-parser-plugin", o.TokenParserPlugin, "how the server reads the destination token the client sends: Cleartext (quic-tun compatible)")
	fs.StringVar(&o.TokenParserKey, "token-parser-key", o.TokenParserKey, "token parser key: empty for plain tokens (tcp:HOST:PORT, unix:/path), or base64 for base64-encoded tokens")

	fs.StringVar(&o.StateDir, "state-dir", o.StateDir, "directory for the generated self-signed certificate and the stateless-reset and session-ticket keys; keep it across restarts")
	fs.StringVar(&o.Server.ReplicaID, "replica-id", o.Server.ReplicaID, "this server's name among the servers that share its --state-dir keys (replicas behind one name, the Helm chart's pods): its session tickets carry it, and it accepts 0-RTT data only with tickets it issued, since only its replay cache records their 0-RTT streams; another replica's ticket still resumes, without 0-RTT (one round trip more, once). Keep it across restarts and distinct per replica; empty = the host name")
	fs.StringVar(&o.CertFile, "cert-file", o.CertFile, "PEM certificate to serve instead of the generated one (with --key-file)")
	fs.StringVar(&o.KeyFile, "key-file", o.KeyFile, "PEM private key for --cert-file")
	fs.StringVar(&o.ClientCAFile, "client-ca-file", o.ClientCAFile, "require client certificates signed by these CAs (mutual TLS); read again on SIGHUP, for new connections and resumed sessions (open ones keep running)")
	fs.StringVar(&o.SecretFile, "secret-file", o.SecretFile, "file holding the shared secret clients must prove (at least 16 bytes), e.g. from: head -c 32 /dev/urandom | base64 > secret")
	fs.StringVar(&o.KeysFile, "keys-file", o.KeysFile, "file of named shared secrets, one 'NAME SECRET' per line, all accepted (with --secret-file's too): rotate keys without downtime (add the new key, reload, move clients, remove the old one, reload); NAME shows in logs and in --allow-for key=NAME rules")
	fs.BoolVar(&o.CutRemovedKeys, "cut-removed-keys", o.CutRemovedKeys, "when a reload (SIGHUP) removes a key from --secret-file/--keys-file (or replaces its secret), reset the open tunnels and UDP flows made with it (auth_failed), so a revoked key keeps no access; --cut-removed-keys=false lets them run until they end (new streams need a key the server holds either way)")
	fs.BoolVar(&o.InsecureNoAuth, "insecure-no-auth", o.InsecureNoAuth, "accept clients without authentication (only with a restrictive --allow on a trusted network)")

	fs.DurationVar(&o.Server.HeaderTimeout, "header-timeout", o.Server.HeaderTimeout, "time a client has to send a stream header")
	fs.DurationVar(&o.Server.DialTimeout, "dial-timeout", o.Server.DialTimeout, "time to connect to a destination")
	fs.Int64Var(&o.MaxStreamsPerConn, "max-streams-per-conn", o.MaxStreamsPerConn, "concurrent tunnels per client connection")
	fs.IntVar(&o.Server.MaxConcurrentDials, "max-concurrent-dials", o.Server.MaxConcurrentDials, "concurrent destination dials; more wait up to --dial-timeout")
	fs.IntVar(&o.Server.MaxDialsPerDestination, "max-dials-per-destination", o.Server.MaxDialsPerDestination, "concurrent dials to one destination address, so a slow or unreachable one cannot take every dial slot (more wait without holding a slot); 0 = a quarter of --max-concurrent-dials")
	fs.Float64Var(&o.Server.HandshakesPerSecond, "handshake-rate", o.Server.HandshakesPerSecond, "new QUIC connections per second per source IP (burst twice that); a source past half its burst must first prove its address (one Retry round trip); 0 = unlimited")
	fs.IntVar(&o.Server.MaxConnsPerSource, "max-conns-per-source", o.Server.MaxConnsPerSource, "open connections per source IP (an IPv6 source counts by its /64), QUIC and TCP (a TCP connection counts from accept, before its TLS handshake); more are closed with overloaded (TCP: at once); 0 = unlimited")
	fs.IntVar(&o.Server.MaxConnections, "max-connections", o.Server.MaxConnections, "open QUIC connections in total; more are refused (quictun_server_refused_connections_total{reason=\"max_connections\"})")
	fs.IntVar(&o.Server.MaxTCPHandshakes, "max-tcp-handshakes", o.Server.MaxTCPHandshakes, "TCP connections (--tcp-listen-on) in their TLS handshake at once; four times as many may wait for their ClientHello (which must arrive within 3 s of accept), and one source (an IPv4 address or an IPv6 /64) holds at most a sixteenth of either, at least 8; more are closed at once (quictun_server_refused_connections_total{reason=\"tcp_handshakes\"}, tcp_handshakes_per_source, tcp_waiting, tcp_waiting_per_source)")
	fs.DurationVar(&o.Server.AuthTimeout, "auth-timeout", o.Server.AuthTimeout, "with --secret-file: a connection must present a verified stream header (a valid MAC, fresh, not a replay) within this long of its first stream, or it is closed with auth_failed (timeout if a header had a valid MAC but was stale, replayed or refused)")
	fs.DurationVar(&o.Server.IdleAuthTimeout, "idle-auth-timeout", o.Server.IdleAuthTimeout, "with --secret-file: a connection must present a verified stream header within this long of its handshake, streams or not, or it is closed (clients send one at once, a hello; a client from before the hello that sits idle is closed with timeout and reconnects); kept above the 30 s after which clients reset their reconnect backoff")
	fs.IntVar(&o.Server.MaxUnverifiedStreamsPerConn, "max-unverified-streams-per-conn", o.Server.MaxUnverifiedStreamsPerConn, "with --secret-file, a connection's stream credit until it presents a verified header (then --max-streams-per-conn); and the streams per connection served before their header is verified")
	fs.IntVar(&o.Server.MaxUnverifiedStreams, "max-unverified-streams", o.Server.MaxUnverifiedStreams, "streams, server-wide, of connections that have not yet presented a verified header; more are reset with overloaded")
	fs.IntVar(&o.Server.MaxUnverifiedStreamsPerSource, "max-unverified-streams-per-source", o.Server.MaxUnverifiedStreamsPerSource, "one source's share of --max-unverified-streams (a source is an IPv4 address or an IPv6 /64), so one source cannot take the whole budget and have new clients' first tunnels reset; more are reset with overloaded; 0 = an eighth of --max-unverified-streams (128), at least --max-unverified-streams-per-conn")
	fs.IntVar(&o.Server.MaxReplayEntriesPerConn, "max-replay-entries-per-conn", o.Server.MaxReplayEntriesPerConn, "stream-header nonces one connection may record in the replay cache (1,048,576 entries) per 2-minute window; beyond it 1-RTT streams go unrecorded and 0-RTT streams are reset with overloaded")
	fs.IntVar(&o.Server.MaxUDPFlows, "max-udp-flows", o.Server.MaxUDPFlows, "UDP flows open on the server (each holds a UDP socket to its destination, whose receive buffer counts against --udp-socket-memory-mib, and queues at most 1 MiB of packets for the client, 64 MiB for all flows); more are refused with overloaded")
	fs.Int64Var(&o.UDPSocketMemoryMiB, "udp-socket-memory-mib", o.UDPSocketMemoryMiB, "MiB of kernel memory the UDP flows' sockets may hold, as the kernel books it: each flow's receive buffer starts at 128 KiB and grows with its rate to at most 8 MiB while this lasts; a flow that would pass it is refused with overloaded. Keep it well under net.ipv4.udp_mem's hard limit, past which the kernel drops UDP on every socket, QUIC included; 0 = a quarter of that limit, at most 256")
	fs.IntVar(&o.Server.MaxUDPFlowsPerConn, "max-udp-flows-per-conn", o.Server.MaxUDPFlowsPerConn, "UDP flows open on one client connection; more are refused with overloaded")
	fs.IntVar(&o.Server.MaxUDPFlowsPerIdentity, "max-udp-flows-per-identity", o.Server.MaxUDPFlowsPerIdentity, "one client's share of --max-udp-flows, so that one client cannot take every flow: the flows of all connections of one client certificate CN or --keys-file key name, or, for clients with neither (the --secret-file key, which they all hold), of one source (an IPv4 address or an IPv6 /64); more are refused with overloaded (quictun_server_udp_drops_total{reason=\"identity_flow_limit\"}); 0 = a quarter of --max-udp-flows (256), at least --max-udp-flows-per-conn")
	fs.IntVar(&o.Server.MaxRemoteListens, "max-remote-listeners", o.Server.MaxRemoteListens, "listeners open on the server for clients' reverse forwards (--allow-remote-listen), each carrying at most 1024 connections and UDP flows; more are refused with overloaded (quictun_server_refused_remote_listens_total{reason=\"server_limit\"}) and the client asks again, with backoff")
	fs.IntVar(&o.Server.MaxRemoteListensPerConn, "max-remote-listeners-per-conn", o.Server.MaxRemoteListensPerConn, "reverse forward listeners of one client connection; more are refused with overloaded (quictun_server_refused_remote_listens_total{reason=\"conn_limit\"})")
	fs.IntVar(&o.Server.MaxRemoteListensPerIdentity, "max-remote-listeners-per-identity", o.Server.MaxRemoteListensPerIdentity, "one client's share of --max-remote-listeners, so that one client cannot take every listener: the listeners of all connections of one client certificate CN or --keys-file key name, or, for clients with neither (the --secret-file key, which they all hold), of one source (an IPv4 address or an IPv6 /64); more are refused with overloaded (quictun_server_refused_remote_listens_total{reason=\"identity_limit\"}); 0 = an eighth of --max-remote-listeners (32), at least --max-remote-listeners-per-conn")
	fs.BoolVar(&o.Disable0RTT, "disable-0rtt", o.Disable0RTT, "refuse 0-RTT resumption (costs reconnecting clients one round trip)")
}

// addShares validates a server-wide limit --max-NAME (total), its
// --max-NAME-per-conn and its per-identity share --max-NAME-per-identity
// (0: the default fraction of the total), reporting each problem with add.
func addShares(add func(string, ...any), name, what, fraction string, total, perConn, perIdentity int) {
	if total < 1 || perConn < 1 {
		add("--max-%s and --max-%s-per-conn must be at least 1", name, name)
	}
	if perIdentity < 0 {
		add("--max-%s-per-identity must not be negative (0 = %s of --max-%s)", name, fraction, name)
	} else if perIdentity > 0 && (perIdentity < perConn || perIdentity > total) {
		add("--max-%s-per-identity (%d) must be between --max-%s-per-conn (%d) and --max-%s (%d): it is one client's share of the server's %s, and one connection's %s must fit in it",
			name, perIdentity, name, perConn, name, total, what, what)
	}
}

// Validate returns every problem at once.
//
//nolint:funlen // a flat list of independent checks, each naming its flag (errors.Join)
func (o *Options) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if o.ListenOn == "" {
		add("--listen-on is required")
	} else if err := cli.ValidateHostPort("listen-on", o.ListenOn, false, true); err != nil {
		errs = append(errs, err)
	}
	if o.TCPListenOn != "" && o.TCPListenOn != TCPListenOff {
		if err := cli.ValidateHostPort("tcp-listen-on", o.TCPListenOn, false, true); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := endpoint.ParseRules(o.Allow, o.Deny); err != nil {
		add("--allow/--deny: %w", err)
	}
	if _, err := parseAllowFor(o.AllowFor, o.Deny); err != nil {
		errs = append(errs, err)
	}
	if _, _, err := parseRemoteListen(o.AllowRemoteListen); err != nil {
		errs = append(errs, err)
	}
	if _, err := token.NewParser(o.TokenParserPlugin, o.TokenParserKey); err != nil {
		add("--token-parser-plugin/--token-parser-key: %w", err)
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		add("--cert-file and --key-file go together")
	}
	if id := o.Server.ReplicaID; len(id) > maxReplicaID || strings.ContainsFunc(id, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) {
		add("--replica-id must be at most %d bytes without spaces or control characters (a host or pod name), got %q", maxReplicaID, id)
	}
	if o.StateDir == "" {
		add("--state-dir is required (it holds the stateless-reset and session-ticket keys, and the certificate unless --cert-file is given)")
	}
	if o.SecretFile == "" && o.KeysFile == "" && o.ClientCAFile == "" && !o.InsecureNoAuth {
		add("client authentication is required: set --secret-file (or --keys-file) or --client-ca-file (or --insecure-no-auth explicitly)")
	}
	if o.InsecureNoAuth && (o.SecretFile != "" || o.KeysFile != "" || o.ClientCAFile != "") {
		add("--insecure-no-auth contradicts --secret-file/--keys-file/--client-ca-file")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"header-timeout", o.Server.HeaderTimeout}, {"dial-timeout", o.Server.DialTimeout}} {
		if d.v <= 0 {
			add("--%s must be positive", d.name)
		}
	}
	if o.MaxStreamsPerConn < 1 {
		add("--max-streams-per-conn must be at least 1")
	}
	if o.Server.HandshakesPerSecond < 0 || o.Server.MaxConnsPerSource < 0 {
		add("--handshake-rate and --max-conns-per-source must not be negative")
	}
	if o.Server.MaxConnections < 1 || o.Server.MaxUnverifiedStreamsPerConn < 1 || o.Server.MaxUnverifiedStreams < 1 || o.Server.MaxReplayEntriesPerConn < 1 {
		add("--max-connections, --max-unverified-streams-per-conn, --max-unverified-streams and --max-replay-entries-per-conn must be at least 1")
	}
	if o.Server.MaxTCPHandshakes < 1 {
		add("--max-tcp-handshakes must be at least 1")
	}
	if n := o.Server.MaxUnverifiedStreamsPerSource; n < 0 {
		add("--max-unverified-streams-per-source must not be negative")
	} else if n > 0 && (n < o.Server.MaxUnverifiedStreamsPerConn || n > o.Server.MaxUnverifiedStreams) {
		add("--max-unverified-streams-per-source (%d) must be between --max-unverified-streams-per-conn (%d) and --max-unverified-streams (%d): it is one source's share of the server-wide budget, and one connection's budget must fit in it",
			n, o.Server.MaxUnverifiedStreamsPerConn, o.Server.MaxUnverifiedStreams)
	}
	if o.Server.AuthTimeout <= 0 || o.Server.IdleAuthTimeout <= 0 {
		add("--auth-timeout and --idle-auth-timeout must be positive")
	}
	addShares(add, "udp-flows", "flows", "a quarter", o.Server.MaxUDPFlows, o.Server.MaxUDPFlowsPerConn, o.Server.MaxUDPFlowsPerIdentity)
	addShares(add, "remote-listeners", "listeners", "an eighth",
		o.Server.MaxRemoteListens, o.Server.MaxRemoteListensPerConn, o.Server.MaxRemoteListensPerIdentity)
	if o.UDPSocketMemoryMiB < 0 {
		add("--udp-socket-memory-mib must not be negative (0 = from net.ipv4.udp_mem)")
	}
	if o.Server.MaxDialsPerDestination < 0 {
		add("--max-dials-per-destination must not be negative")
	}
	if o.Server.MaxConcurrentDials < 1 {
		add("--max-concurrent-dials must be at least 1")
	}
	errs = append(errs, o.DaemonFlags.Validate()...)
	return errors.Join(errs...)
}

// CheckFiles reads the files the server reads at start (for --check-config);
// see cli.CheckStartFiles.
func (o *Options) CheckFiles() error {
	errs := cli.CheckStartFiles(cli.StartFiles{SecretFile: o.SecretFile, KeysFile: o.KeysFile, HTTPDTokenFile: o.HTTPDTokenFile,
		CAFlag: "client-ca-file", CAFile: o.ClientCAFile, CertFile: o.CertFile, KeyFile: o.KeyFile, StateDir: o.StateDir})
	if len(errs) == 0 && o.SecretFile != "" && o.KeysFile != "" {
		// Each file is fine alone; together their keys must not clash.
		if _, err := loadKeys(o.SecretFile, o.KeysFile); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// maxReplicaID bounds --replica-id: a DNS name's length.
const maxReplicaID = 253

// TCPListenOff is the --tcp-listen-on value for no TCP listener.
const TCPListenOff = "off"
