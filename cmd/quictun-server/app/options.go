// Package app wires quictun-server: flags, config, signals, admin server.
package app

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/pflag"

	"github.com/quictun/quictun/cmd/internal/cli"

	"github.com/quictun/quictun/pkg/authhook"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/ratecap"
	"github.com/quictun/quictun/pkg/report"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/usage"
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

	// MetricsIdentities are the identities with quictun_server_identity_*
	// series of their own (the others share "other").
	MetricsIdentities []string
	// RateLimits are the --rate-limit caps, IDENTITY=DOWN[/UP];
	// DefaultRateLimit those of every other identity.
	RateLimits       []string
	DefaultRateLimit string
	// LinkRate is --link-rate, DOWN[/UP]: the server link's rate, which
	// the identities without a cap share what the capped ones leave of.
	LinkRate string
	// Quotas are the --quota rules, IDENTITY=BYTES/WINDOW; DefaultQuota
	// that of every other identity.
	Quotas       []string
	DefaultQuota string
	// UsageReportURL receives the usage batches; the rest tune them.
	UsageReportURL       string
	UsageReportInterval  time.Duration
	UsageReportBytes     int64
	UsageReportTokenFile string
	// AuthHook is the --auth-hook URL; the rest tune it.
	AuthHook            string
	AuthHookTokenFile   string
	AuthHookTimeout     time.Duration
	AuthHookMaxInFlight int
	AuthHookTTL         time.Duration
	AuthHookNegativeTTL time.Duration
	// AuthHookCertificates: the hook is asked about every client
	// certificate too (--client-ca-file), not only unknown key IDs.
	AuthHookCertificates bool
	// UsageSaveInterval is how often the accounting is written to
	// --state-dir.
	UsageSaveInterval time.Duration

	// UDPSocketMemoryMiB: 0 means udpflow.MaxSocketMemory
	// (Server.UDPSocketMemory in bytes).
	UDPSocketMemoryMiB int64

	reloader *cli.Reloader
	// resume: the resumable tunnels, made by Run (their window reloadable).
	resume *cli.Resume
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
		UsageSaveInterval: usage.DefaultSaveInterval,

		AuthHookTimeout:      authhook.DefaultTimeout,
		AuthHookMaxInFlight:  authhook.DefaultMaxInFlight,
		AuthHookTTL:          authhook.DefaultTTL,
		AuthHookNegativeTTL:  authhook.DefaultNegativeTTL,
		AuthHookCertificates: true,
		UsageReportInterval:  report.DefaultInterval,
		UsageReportBytes:     report.DefaultThreshold,
	}
}

// Flag groups, shown as sections in --help (cli.NewRootCommand adds
// congestion control, configuration and logging).
var flagGroups = []cli.FlagGroup{
	{Title: "Listening and destinations", Names: []string{"listen-on", "tcp-listen-on", "allow", "deny", "allow-for", "allow-remote-listen", "token-parser-plugin", "token-parser-key"}},
	{Title: "Identity and authentication", Names: []string{"state-dir", "replica-id", "cert-file", "key-file", "client-ca-file", "secret-file", "keys-file", "cut-removed-keys", "insecure-no-auth"}},
	{Title: "Admin HTTP server and logs", Names: slices.Concat(cli.AdminFlagNames, []string{"audit-log"})},
	{Title: "Many users: accounting and caps by identity", Names: []string{"metrics-identity", "usage-save-interval", "rate-limit", "default-rate-limit", "link-rate", "quota", "default-quota", "usage-report-url", "usage-report-interval", "usage-report-bytes", "usage-report-token-file",
		"auth-hook", "auth-hook-token-file", "auth-hook-timeout", "auth-hook-max-in-flight", "auth-hook-ttl", "auth-hook-negative-ttl", "auth-hook-certificates"}},
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
	fs.StringSliceVar(&o.MetricsIdentities, "metrics-identity", o.MetricsIdentities, "identities whose usage gets quictun_server_identity_* series of their own (repeatable, at most 256): key=NAME of a --keys-file key, CN=NAME of a client certificate, or anonymous; every other identity is counted under identity=\"other\" (GET /identities on the admin API lists them all)")
	fs.DurationVar(&o.UsageSaveInterval, "usage-save-interval", o.UsageSaveInterval, "how often the accounting by identity (bytes, tunnels, connections, refused destinations, suspensions) is written to usage.json in --state-dir (atomically); a SIGKILL or crash loses at most this much plus a second, a clean stop none")
	fs.StringSliceVar(&o.RateLimits, "rate-limit", o.RateLimits, "cap one identity's rates, IDENTITY=DOWN[/UP] (repeatable; reloadable with SIGHUP), e.g. key=alice=20Mbit/5Mbit: DOWN is what the server sends it, paced in the server's sender across all its connections (needs --congestion bbr or cubic on the server; the client's --congestion does not matter), UP what it reads from it (flow control holds the client back); units bit, kbit, Mbit, Gbit, B, kB, MB, GB, KiB, MiB, GiB per second; UP defaults to DOWN; 0 = no cap")
	fs.StringVar(&o.LinkRate, "link-rate", o.LinkRate, "the rate of the server's link, DOWN[/UP] (what it sends and what it reads), e.g. 90Mbit for a 100 Mbit/s link: identities without a cap of their own then share what the capped identities leave of it, paced by the server, so that the capped ones hold their caps on a full link instead of losing to the queue the others build; set it 5-10 % below the link's real rate, which also carries IP and UDP headers (reloadable; with no caps at all it caps the server as a whole); empty = not set")
	fs.StringVar(&o.DefaultRateLimit, "default-rate-limit", o.DefaultRateLimit, "the caps, DOWN[/UP], of every identity without a --rate-limit of its own (reloadable); each identity gets the whole rate (it is not split between them); empty = none")
	fs.StringSliceVar(&o.Quotas, "quota", o.Quotas, "cap what one identity moves (up and down together) in a rolling window, IDENTITY=BYTES/WINDOW (repeatable; reloadable), e.g. key=alice=100GiB/30d: the window is the last WINDOW (days d or hours h, 1h to 366d), counted in thirtieths (a day for 30d); once it holds BYTES, the identity's new tunnels are refused with quota (logged once at -v 0) until the window rolls past enough of them; open tunnels run on; kept in --state-dir")
	fs.StringVar(&o.DefaultQuota, "default-quota", o.DefaultQuota, "the quota, BYTES/WINDOW, of every identity without a --quota of its own (each its own; reloadable); empty = none")
	fs.StringVar(&o.UsageReportURL, "usage-report-url", o.UsageReportURL, "post each identity's bytes to this URL (https, or http to a loopback address), as JSON batches {id, server, from, to, identities: [{identity, bytesUpstream, bytesDownstream}]}: every --usage-report-interval, sooner once an identity has moved --usage-report-bytes; retried with backoff (at least once: drop a batch id seen before), at most 64 waiting (the oldest dropped); never holds up tunnels; empty = none")
	fs.DurationVar(&o.UsageReportInterval, "usage-report-interval", o.UsageReportInterval, "the longest an identity's bytes wait before they are posted to --usage-report-url")
	fs.Int64Var(&o.UsageReportBytes, "usage-report-bytes", o.UsageReportBytes, "post to --usage-report-url early once one identity has moved this many bytes unreported")
	fs.StringVar(&o.UsageReportTokenFile, "usage-report-token-file", o.UsageReportTokenFile, "file holding a bearer token sent to --usage-report-url (Authorization: Bearer)")
	fs.StringVar(&o.AuthHook, "auth-hook", o.AuthHook, "ask this URL (https, or http to a loopback address) for the secret of a key ID the server does not hold: POST {\"keyId\": HEX} answered 200 {\"name\": NAME, \"secret\": BASE64} (the client is then key=NAME, with the --allow-for, --rate-limit and --quota of key=NAME; optional \"rateLimit\" and \"quota\" as those flags', and \"allow\": [RULE, ...], at most 64, added as --allow-for key=NAME=RULE would be, --deny still wins) or 404; cached (--auth-hook-ttl, refusals --auth-hook-negative-ttl); the hook down or slow refuses the stream with overloaded within --auth-hook-timeout (fail closed); needs --keys-file or --secret-file, or --client-ca-file (then each client certificate is asked about: --auth-hook-certificates); SECURITY.md")
	fs.StringVar(&o.AuthHookTokenFile, "auth-hook-token-file", o.AuthHookTokenFile, "file holding a bearer token sent to --auth-hook")
	fs.DurationVar(&o.AuthHookTimeout, "auth-hook-timeout", o.AuthHookTimeout, "how long a call to --auth-hook may take; then the stream is refused (overloaded)")
	fs.IntVar(&o.AuthHookMaxInFlight, "auth-hook-max-in-flight", o.AuthHookMaxInFlight, "calls to --auth-hook at once; past it, streams with unknown key IDs are refused at once (overloaded), so a flood of random key IDs cannot make the server flood the hook")
	fs.DurationVar(&o.AuthHookTTL, "auth-hook-ttl", o.AuthHookTTL, "how long a key --auth-hook answered, or a client certificate it admitted, is used without asking again (one revoked at the hook works this long)")
	fs.DurationVar(&o.AuthHookNegativeTTL, "auth-hook-negative-ttl", o.AuthHookNegativeTTL, "how long a key ID --auth-hook did not know (404), or a certificate it refused, is refused without asking again")
	fs.BoolVar(&o.AuthHookCertificates, "auth-hook-certificates", o.AuthHookCertificates, "with --client-ca-file, ask --auth-hook about every client certificate too: POST {\"subject\": \"CN=NAME\", \"sha256\": HEX, \"serial\": HEX} answered 200 (yes; optional \"allow\", \"rateLimit\", \"quota\" for CN=NAME) or 403/404 (no: auth_failed), cached as key answers; false: the CA alone admits certificates")
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
	if _, _, err := parseRateLimits(o.RateLimits, o.DefaultRateLimit); err != nil {
		errs = append(errs, err)
	} else if (len(o.RateLimits) > 0 || o.DefaultRateLimit != "" || o.LinkRate != "") && o.Congestion == "reno" {
		add("--rate-limit, --default-rate-limit and --link-rate pace downloads in the server's congestion controller: use --congestion bbr or cubic (reno is quic-go's own, which has no hook)")
	}
	if _, err := parseLinkRate(o.LinkRate); err != nil {
		errs = append(errs, err)
	}
	if _, _, err := parseQuotas(o.Quotas, o.DefaultQuota); err != nil {
		errs = append(errs, err)
	}
	if err := validateReportURL("usage-report-url", o.UsageReportURL); err != nil {
		errs = append(errs, err)
	}
	if err := validateReportURL("auth-hook", o.AuthHook); err != nil {
		errs = append(errs, err)
	}
	if o.AuthHook != "" {
		if o.SecretFile == "" && o.KeysFile == "" && (o.ClientCAFile == "" || !o.AuthHookCertificates) {
			add("--auth-hook answers the secrets of key IDs and about client certificates: it needs shared-secret authentication (--keys-file or --secret-file) or --client-ca-file with --auth-hook-certificates")
		}
		if o.AuthHookTimeout <= 0 || o.AuthHookMaxInFlight < 1 || o.AuthHookTTL <= 0 || o.AuthHookNegativeTTL <= 0 {
			add("--auth-hook-timeout, --auth-hook-ttl and --auth-hook-negative-ttl must be positive, --auth-hook-max-in-flight at least 1")
		}
	} else {
		if o.AuthHookTokenFile != "" {
			add("--auth-hook-token-file needs --auth-hook")
		}
		if !o.AuthHookCertificates {
			add("--auth-hook-certificates=false needs --auth-hook")
		}
	}
	if o.UsageReportURL != "" && (o.UsageReportInterval < time.Second || o.UsageReportBytes < 1) {
		add("--usage-report-interval must be at least 1s and --usage-report-bytes at least 1")
	}
	if o.UsageReportTokenFile != "" && o.UsageReportURL == "" {
		add("--usage-report-token-file needs --usage-report-url")
	}
	if o.UsageSaveInterval < time.Second || o.UsageSaveInterval > time.Hour {
		add("--usage-save-interval must be between 1s and 1h (it is how much accounting a crash can lose), got %s", o.UsageSaveInterval)
	}
	if len(o.MetricsIdentities) > maxMetricsIdentities {
		add("--metrics-identity names %d identities, at most %d (each one adds 8 series; the others are counted under %q)", len(o.MetricsIdentities), maxMetricsIdentities, usage.Other)
	}
	for _, id := range o.MetricsIdentities {
		if !validIdentity(id) {
			add("--metrics-identity %q: an identity is key=NAME (a --keys-file key), CN=NAME (a client certificate), both comma-separated, or %q", id, usage.Anonymous)
		}
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

// maxMetricsIdentities bounds --metrics-identity: the series of the
// identity metrics.
const maxMetricsIdentities = 256

// validIdentity reports whether id names an identity as the server shows
// them: key=NAME, CN=NAME, both comma-separated, or usage.Anonymous.
func validIdentity(id string) bool {
	if id == usage.Anonymous {
		return true
	}
	parts := strings.Split(id, ",")
	if len(parts) > 2 {
		return false
	}
	for _, p := range parts {
		kind, name, ok := strings.Cut(p, "=")
		if !ok || name == "" || (kind != "key" && kind != "CN") {
			return false
		}
	}
	return true
}

// parseRateLimits parses --rate-limit rules and --default-rate-limit.
func parseRateLimits(specs []string, def string) ([]ratecap.Rule, ratecap.Rate, error) {
	var errs []error
	rules := make([]ratecap.Rule, 0, len(specs))
	seen := map[string]bool{}
	for _, spec := range specs {
		r, err := ratecap.ParseRule(spec)
		switch {
		case err != nil:
			errs = append(errs, err)
		case !validIdentity(r.Identity):
			errs = append(errs, fmt.Errorf("--rate-limit %q: an identity is key=NAME, CN=NAME, both comma-separated, or %q", spec, usage.Anonymous))
		case seen[r.Identity]:
			errs = append(errs, fmt.Errorf("--rate-limit %q: %s has a cap already", spec, r.Identity))
		default:
			seen[r.Identity] = true
			rules = append(rules, r)
		}
	}
	var rate ratecap.Rate
	if def != "" {
		var err error
		if rate, err = ratecap.ParseRate(def); err != nil {
			errs = append(errs, fmt.Errorf("--default-rate-limit: %w", err))
		}
	}
	return rules, rate, errors.Join(errs...)
}

// parseLinkRate parses --link-rate (empty: not set).
func parseLinkRate(spec string) (ratecap.Rate, error) {
	if spec == "" {
		return ratecap.Rate{}, nil
	}
	r, err := ratecap.ParseRate(spec)
	if err != nil {
		return r, fmt.Errorf("--link-rate: %w (e.g. 90Mbit, or 900Mbit/90Mbit for a link faster one way)", err)
	}
	return r, nil
}

// parseQuotas parses --quota rules and --default-quota.
func parseQuotas(specs []string, def string) (map[string]usage.Quota, usage.Quota, error) {
	var errs []error
	rules := make(map[string]usage.Quota, len(specs))
	for _, spec := range specs {
		id, q, err := usage.ParseQuota(spec)
		switch {
		case err != nil:
			errs = append(errs, err)
		case !validIdentity(id):
			errs = append(errs, fmt.Errorf("--quota %q: an identity is key=NAME, CN=NAME, both comma-separated, or %q", spec, usage.Anonymous))
		case rules[id] != (usage.Quota{}):
			errs = append(errs, fmt.Errorf("--quota %q: %s has a quota already", spec, id))
		default:
			rules[id] = q
		}
	}
	var dq usage.Quota
	if def != "" {
		var err error
		if dq, err = usage.ParseQuotaValue(def); err != nil {
			errs = append(errs, fmt.Errorf("--default-quota: %w", err))
		}
	}
	return rules, dq, errors.Join(errs...)
}

// validateReportURL checks the URL of --flag (--usage-report-url,
// --auth-hook): https, or http to a loopback address (a local agent); the
// usage of every identity, or secrets, are not sent in clear across a
// network.
func validateReportURL(flag, s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return fmt.Errorf("--%s %q: not an absolute URL", flag, s)
	}
	switch {
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && (u.Hostname() == "localhost" || net.ParseIP(u.Hostname()) != nil && net.ParseIP(u.Hostname()).IsLoopback()):
		return nil
	}
	return fmt.Errorf("--%s %q: use https (http only to a loopback address)", flag, s)
}
