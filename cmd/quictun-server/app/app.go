package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/pkg/authhook"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/handover"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/ratecap"
	"github.com/quictun/quictun/pkg/report"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/pkg/usage"
	"github.com/quictun/quictun/server"
)

// Run runs the command with args and returns the exit code.
func Run(args []string) int {
	return cli.Main(NewCommand(), args)
}

// NewCommand returns the quictun-server command.
func NewCommand() *cobra.Command {
	o := NewOptions()
	cmd := cli.NewRootCommand("quictun-server", o, flagGroups)
	cmd.Short = "Remote end of a quictun TCP-over-QUIC tunnel"
	cmd.Long = `quictun-server accepts QUIC connections from quictun-client, and for each stream dials the
destination the client names (if the --allow list permits it) and carries the bytes both ways.`
	cmd.Example = `  # generate a shared secret, start the server, print the fingerprint for clients
  head -c 32 /dev/urandom | base64 > /etc/quictun/secret
  quictun-server --listen-on 0.0.0.0:7500 --state-dir /var/lib/quictun-server \
      --secret-file /etc/quictun/secret --allow tcp:127.0.0.1:22,tcp:10.0.0.0/8:5432
  quictun-server fingerprint --state-dir /var/lib/quictun-server`
	fpOpts := NewOptions()
	fp := &cobra.Command{
		Use:   "fingerprint",
		Short: "Print the SHA-256 fingerprint of the server certificate (creating the state if missing), for clients' --server-fingerprint",
		Long: `Print the SHA-256 fingerprint of the server certificate for clients' --server-fingerprint. It reads
the same --config file, QUICTUN_* environment and flags as the server, so it finds the same
--state-dir (or --cert-file); a missing state is created.`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := cli.LoadConfig(c.Flags(), fpOpts.ConfigFile); err != nil {
				return err
			}
			st, err := transport.LoadOrCreateState(fpOpts.StateDir, fpOpts.CertFile, fpOpts.KeyFile)
			if err != nil {
				return err
			}
			_, _ = fmt.Fprintln(c.OutOrStdout(), st.Fingerprint())
			return nil
		},
	}
	cli.AddDaemonFlags(fp, fpOpts)
	cmd.AddCommand(fp, cli.NewCheckCommand(NewOptions(), nil))
	return cmd
}

// Run starts the server and blocks until ctx is cancelled and the drain is
// over. It builds in steps: identity and auth, destination rules, sockets
// and the admin listener (each pushed on one Cleanup), the server, then runs.
func (o *Options) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	cli.LogHostCheck("")
	var cleanup cli.Cleanup
	defer cleanup.Run()

	st, id, tlsConf, err := o.identity(logger)
	if err != nil {
		return err
	}
	keys := id.keys
	allow, allowFor, parser, err := o.destinations(logger, keys)
	if err != nil {
		return err
	}
	inh, err := cli.TakeInherited()
	if err != nil {
		return err
	}
	defer inh.Close()
	adm, err := cli.OpenAdminInherited(inh, o.HTTPDListenOn, o.HTTPDTokenFile)
	if err != nil {
		return err
	}
	cleanup.Push(adm.Close)
	sock, udp, tcpLn, err := o.openSockets(inh, &cleanup, logger)
	if err != nil {
		return err
	}

	reg := cli.NewRegistry()
	registry := tunnel.NewRegistry()
	var srv *server.Server
	qstat := metrics.NewQUICCollector("server", false, cli.QUICConns(func() []transport.ConnStats { return srv.ConnStats() }))
	cfg := o.Server
	cfg.TLS, cfg.QUIC, cfg.ResetKey, cfg.TokenKey = tlsConf, sock.QUIC, &st.ResetKey, &st.TokenKey
	cfg.TCP = tcpLn
	cfg.Keys, cfg.Parser, cfg.Allow, cfg.AllowFor = keys, parser, allow, allowFor
	cfg.SelfAddrs = adm.Addrs()
	cfg.Dialer = &net.Dialer{KeepAlive: 30 * time.Second}
	cfg.UDPSocketMemory = o.UDPSocketMemoryMiB << 20
	cfg.DrainTimeout, cfg.TailProbes, cfg.UDPIdleTimeout = o.DrainTimeout, o.TailProbes, o.UDPIdleTimeout
	cfg.Metrics, cfg.QUICStat, cfg.Registry = server.NewMetrics(reg), qstat, registry
	o.resume = o.NewResume()
	cfg.Resume = &egress.Resume{Settings: resume.Settings{Table: o.resume.Table, Window: o.resume.Window, Budget: o.resume.Budget,
		Events: server.NewResumeMetrics(reg, o.resume.Budget.Used)}}
	if cfg.AllowRemoteListen, cfg.AllowRemoteListenFor, err = parseRemoteListen(o.AllowRemoteListen); err != nil {
		return err
	}
	// The reverse forwards' listeners an upgrade handed over: the server
	// takes each over when its client binds it again.
	cfg.InheritedReverse = inh.TakePrefix(server.ReverseSocketPrefix)
	if len(o.AllowRemoteListen) > 0 {
		cfg.Reverse.Events = server.NewReverseMetrics(reg)
		cfg.RemoteListenMetrics = server.NewRemoteListenMetrics(reg)
		cfg.Reverse.UDPIdleTimeout, cfg.Reverse.AuditLog = o.UDPIdleTimeout, o.Server.AuditLog
		logger.Info("Reverse forwards allowed: clients may ask this server to listen", "allowRemoteListen", strings.Join(o.AllowRemoteListen, ","))
	}
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = server.DefaultReplicaID()
	}
	logger.V(1).Info("Replica ID: the session tickets of this server carry it, and it accepts 0-RTT only with its own; servers sharing --state-dir's keys need distinct ones",
		"replicaID", cfg.ReplicaID)
	if err := o.manyUsers(&cfg, reg, &cleanup, inh != nil); err != nil {
		return err
	}
	srv, err = server.New(cfg, sock.Conn)
	if err != nil {
		return err
	}
	logAllowList(logger, o, allow, srv.Addr(), adm.Addrs())
	return o.ServeUpgradable(ctx, cli.Serving{
		Side: "server", Service: srv, Socket: sock, Metrics: reg, QUICStat: qstat, Tunnels: registry,
		Admin: adm, Reloader: o.reloader, Apply: o.applier(srv, id), Identities: srv.Identities(),
	}, cli.Upgrade{Inherited: inh, Service: srv, Sockets: func() ([]handover.Listener, error) {
		ss := []cli.NamedSocket{{Name: sockUDP, Socket: udp}, {Name: sockTCP, Socket: tcpLn}, {Name: cli.SockAdmin, Socket: adm.Listener()}}
		// The reverse forwards' listeners too, as many as the handover
		// carries (the others close, and their clients bind them anew).
		reverse := srv.ReverseSockets(handover.MaxListeners - len(ss))
		for _, name := range slices.Sorted(maps.Keys(reverse)) {
			ss = append(ss, cli.NamedSocket{Name: name, Socket: reverse[name]})
		}
		return cli.DupSockets(ss)
	}})
}

// capSpecs are o's rate caps as one list (a reload compares and logs it):
// the --rate-limit rules, the default and the link rate.
func capSpecs(o *Options) []string {
	return append(slices.Clone(o.RateLimits), "default="+o.DefaultRateLimit, "link="+o.LinkRate)
}

// quotaSpecs are o's quotas as one list, as capSpecs.
func quotaSpecs(o *Options) []string {
	return append(slices.Clone(o.Quotas), "default="+o.DefaultQuota)
}

// openSockets opens the UDP socket and the TCP fallback listener, or takes
// those an upgrade handed over; each Close is pushed on cleanup.
func (o *Options) openSockets(inh *cli.Inherited, cleanup *cli.Cleanup, logger klog.Logger) (*cli.Socket, *net.UDPConn, net.Listener, error) {
	qopts := o.QUICOptions()
	qopts.MaxIncomingStreams, qopts.Allow0RTT = o.MaxStreamsPerConn, !o.Disable0RTT
	udp, err := inh.UDP(sockUDP)
	if udp == nil && err == nil {
		udp, err = transport.ListenUDP(o.ListenOn)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	sock, err := o.SocketOn(udp, qopts, false, cleanup, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	tcpLn, err := o.openTCP(inh, sock.Conn.LocalAddr(), logger)
	if err != nil {
		return nil, nil, nil, err
	}
	if tcpLn != nil {
		cleanup.Push(func() { _ = tcpLn.Close() })
	}
	return sock, udp, tcpLn, nil
}

// openTCP opens the TCP fallback listener, or takes the one handed over
// (unless --tcp-listen-on is off now).
func (o *Options) openTCP(inh *cli.Inherited, udp net.Addr, logger klog.Logger) (net.Listener, error) {
	ln, err := inh.Listener(sockTCP)
	if err != nil {
		return nil, err
	}
	if ln != nil {
		if o.TCPListenOn == TCPListenOff {
			_ = ln.Close()
			return nil, nil
		}
		return ln, nil
	}
	return o.listenTCP(udp, logger)
}

// Names of the sockets an upgrade hands over (cli.SockAdmin besides).
const (
	sockUDP = "udp"
	sockTCP = "tcp"
)

// manyUsers sets up what one server shared by many users needs: the
// accounting per identity (kept in --state-dir), quotas, rate caps, the
// auth hook and the usage reports (docs/many-users.md).
func (o *Options) manyUsers(cfg *server.Config, reg prometheus.Registerer, cleanup *cli.Cleanup, upgraded bool) error {
	var err error
	// Started by an upgrade: the totals are read once the previous process
	// has saved its last (Server.Import), not the older ones now.
	if cfg.Usage, err = usage.New(usage.Config{Path: filepath.Join(o.StateDir, UsageFile), SaveInterval: o.UsageSaveInterval,
		Labeled: o.MetricsIdentities, Deferred: upgraded}); err != nil {
		return err
	}
	reg.MustRegister(server.NewIdentityCollector(cfg.Usage))
	quotas, defQuota, _ := parseQuotas(o.Quotas, o.DefaultQuota)
	cfg.Usage.SetQuotas(quotas, defQuota)
	link, _ := parseLinkRate(o.LinkRate)
	if rules, def, _ := parseRateLimits(o.RateLimits, o.DefaultRateLimit); len(rules) > 0 || def != (ratecap.Rate{}) || link != (ratecap.Rate{}) {
		cfg.RateLimits = ratecap.NewTable(rules, def)
		cfg.RateLimits.SetLink(link)
		caps := cfg.RateLimits
		metrics.NewLinkRest(reg, func() (float64, float64) { r := caps.Rest(); return r.Down, r.Up })
	}
	hook, err := o.authHook(reg)
	if err != nil {
		return err
	}
	if hook != nil {
		cfg.KeyHook = hook
		if o.AuthHookCertificates && o.ClientCAFile != "" {
			cfg.CertAuthHook = hook
		}
		cleanup.Push(hook.Close)
	}
	rep, err := o.usageReporter(reg, cfg.Usage, cfg.ReplicaID)
	if err != nil {
		return err
	}
	if rep != nil { // a nil *Reporter in the interface would not be nil
		cfg.UsageReporter = rep
	}
	return nil
}

// authHook returns the hook of --auth-hook (nil: none).
func (o *Options) authHook(reg prometheus.Registerer) (*authhook.Hook, error) {
	if o.AuthHook == "" {
		return nil, nil
	}
	var token string
	if o.AuthHookTokenFile != "" {
		b, err := cli.ReadSecretFile("auth-hook-token-file", o.AuthHookTokenFile, 1)
		if err != nil {
			return nil, err
		}
		token = string(b)
	}
	h, err := authhook.New(authhook.Config{URL: o.AuthHook, BearerToken: token, Timeout: o.AuthHookTimeout,
		MaxInFlight: o.AuthHookMaxInFlight, TTL: o.AuthHookTTL, NegativeTTL: o.AuthHookNegativeTTL,
		Calls: metrics.NewAuthHookCalls(reg)})
	if err != nil {
		return nil, err
	}
	metrics.NewAuthHookState(reg, h.Len)
	return h, nil
}

// usageReporter returns the reporter of --usage-report-url (nil: none).
func (o *Options) usageReporter(reg prometheus.Registerer, l *usage.Ledger, replicaID string) (*report.Reporter, error) {
	if o.UsageReportURL == "" {
		return nil, nil
	}
	var token string
	if o.UsageReportTokenFile != "" {
		b, err := cli.ReadSecretFile("usage-report-token-file", o.UsageReportTokenFile, 1)
		if err != nil {
			return nil, err
		}
		token = string(b)
	}
	return report.New(report.Config{
		URL: o.UsageReportURL, BearerToken: token, Interval: o.UsageReportInterval, Threshold: o.UsageReportBytes,
		Server: replicaID, Events: metrics.NewUsageReports(reg, report.Results()),
		Source: func() []report.Totals {
			snap := l.Snapshot()
			out := make([]report.Totals, 0, len(snap))
			for _, u := range snap {
				out = append(out, report.Totals{Identity: u.Identity, BytesUpstream: u.BytesUpstream, BytesDownstream: u.BytesDownstream})
			}
			return out
		},
	})
}

// UsageFile is the accounting's state file in --state-dir.
const UsageFile = "usage.json"

// listenTCP opens the TCP listener for clients whose UDP is blocked
// (--tcp-listen-on): by default on the QUIC socket's address, udp; nil for
// "off", or when the default's port is taken (said at -v 0).
func (o *Options) listenTCP(udp net.Addr, logger klog.Logger) (net.Listener, error) {
	switch o.TCPListenOn {
	case TCPListenOff:
		return nil, nil
	case "":
		ln, err := net.Listen("tcp", udp.String())
		if err != nil {
			logger.Info("WARNING: no TCP listener for clients whose UDP is blocked: the QUIC port is taken on TCP; set --tcp-listen-on to another address, or off",
				"address", udp.String(), "err", err)
			return nil, nil
		}
		return ln, nil
	}
	ln, err := net.Listen("tcp", o.TCPListenOn)
	if err != nil {
		return nil, fmt.Errorf("--tcp-listen-on: %w", err)
	}
	return ln, nil
}

// served is what a reload replaces of the server's identity.
type served struct {
	// cert is the certificate presented.
	cert *transport.ServerCertificate
	// clientCAs verify client certificates; nil without --client-ca-file
	// (adding or removing it takes a restart).
	clientCAs *transport.ClientCAs
	// keys are the shared secrets loaded at start.
	keys *proto.Keyring
}

// identity loads the server's certificate and keys (--state-dir or
// --cert-file), the client CAs for mutual TLS and the shared secrets. The
// certificate and the client CAs are used through holders a reload
// replaces the contents of.
func (o *Options) identity(logger klog.Logger) (*transport.State, *served, *tls.Config, error) {
	st, err := transport.LoadOrCreateState(o.StateDir, o.CertFile, o.KeyFile)
	if err != nil {
		return nil, nil, nil, err
	}
	if st.Generated {
		logger.Info("Generated a self-signed server certificate", "stateDir", o.StateDir)
	}
	logger.Info("Server certificate", "fingerprint", st.Fingerprint(), "hint", "give clients --server-fingerprint "+st.Fingerprint())
	id := &served{cert: transport.NewServerCertificate(st.Cert)}
	if o.ClientCAFile != "" {
		pool, err := transport.LoadCertPool(o.ClientCAFile)
		if err != nil {
			return nil, nil, nil, err
		}
		id.clientCAs = transport.NewClientCAs(pool)
	}
	if id.keys, err = loadKeys(o.SecretFile, o.KeysFile); err != nil {
		return nil, nil, nil, err
	}
	if o.InsecureNoAuth {
		logger.Info("WARNING: client authentication is disabled (--insecure-no-auth)")
	}
	return st, id, transport.ServerTLSConfigFor(id.cert, st.TicketKey, id.clientCAs), nil
}

// destinations parses the destination rules and the token parser.
func (o *Options) destinations(logger klog.Logger, keys *proto.Keyring) (*endpoint.AllowList, map[string]*endpoint.AllowList, token.Parser, error) {
	allow, err := endpoint.ParseRules(o.Allow, o.Deny)
	if err != nil {
		return nil, nil, nil, err
	}
	allowFor, err := parseAllowFor(o.AllowFor, o.Deny)
	if err != nil {
		return nil, nil, nil, err
	}
	o.warnUnmatchedIdentities(logger, keys)
	parser, err := token.NewParser(o.TokenParserPlugin, o.TokenParserKey)
	if err != nil {
		return nil, nil, nil, err
	}
	return allow, allowFor, parser, nil
}

// logAllowList logs, at -v 0, what clients may reach, what is always refused,
// and, when the operator named no destinations, how to narrow the default.
func logAllowList(logger klog.Logger, o *Options, allow *endpoint.AllowList, quicAddr net.Addr, adminAddrs []net.Addr) {
	own := []string{"udp:" + quicAddr.String()}
	for _, a := range adminAddrs {
		own = append(own, "tcp:"+a.String())
	}
	kv := []any{"allow", strings.Join(allow.Rules(), ","), "deny", strings.Join(allow.DenyRules(), ","),
		"alwaysRefused", "the server's own listeners (" + strings.Join(own, ",") + ", on every local address when unspecified), 0.0.0.0/8, ::, cloud metadata, multicast and broadcast addresses unless named exactly"}
	if slices.Equal(o.Allow, endpoint.DefaultAllowList().Rules()) {
		logger.Info("Destinations allowed: no --allow given, so clients may reach every TCP and UDP port on this host's loopback addresses; name only what they need",
			append(kv, "hint", "e.g. --allow tcp:127.0.0.1:22 (or allow: [tcp:127.0.0.1:22] in the config file)")...)
		return
	}
	logger.Info("Destinations allowed", kv...)
}

// reloadableFlags are the server flags a reload applies; every other change
// needs a restart.
var reloadableFlags = []string{"allow", "deny", "allow-for", "secret-file", "keys-file", "cut-removed-keys", "cert-file", "key-file", "client-ca-file", "allow-remote-listen", "rate-limit", "default-rate-limit", "link-rate", "quota", "default-quota", "resume-window"}

// applier returns the cli.Apply of a running server: new allow and deny
// rules and the secret files read again (its keys may change under the
// same name), swapped together, the removed keys' tunnels cut
// (--cut-removed-keys); the certificate read again (--cert-file and
// --key-file, or the one in --state-dir: files replaced in place are picked
// up) and the client CAs (--client-ca-file); the --allow-remote-listen
// rules, closing the reverse forward listeners they no longer admit
// (enabling reverse forwards on a server started without them takes a
// restart). Everything is read and checked before anything is applied.
//
//nolint:funlen // read and check everything, then apply: the two halves must stay side by side to keep a reload whole or nothing
func (o *Options) applier(srv *server.Server, id *served) cli.Apply {
	keys, cert := id.keys, id.cert
	rules, deny, allowFor := o.Allow, o.Deny, o.AllowFor
	remote, reverseOn := o.AllowRemoteListen, len(o.AllowRemoteListen) > 0
	stateDir := o.StateDir // a new --state-dir takes a restart (its reset and ticket keys)
	caps, quotas := capSpecs(o), quotaSpecs(o)
	res := o.resume
	return func(d cli.Daemon, changed []string) ([]string, error) {
		next := d.(*Options)
		newCert, err := transport.LoadCertificate(stateDir, next.CertFile, next.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("server certificate: %w", err)
		}
		allow, err := endpoint.ParseRules(next.Allow, next.Deny)
		if err != nil {
			return nil, err
		}
		byIdentity, err := parseAllowFor(next.AllowFor, next.Deny)
		if err != nil {
			return nil, err
		}
		newKeys, err := loadKeys(next.SecretFile, next.KeysFile)
		if err != nil {
			return nil, err
		}
		remoteAll, remoteFor, err := parseRemoteListen(next.AllowRemoteListen)
		if err != nil {
			return nil, err
		}
		capRules, capDefault, err := parseRateLimits(next.RateLimits, next.DefaultRateLimit)
		if err != nil {
			return nil, err
		}
		quotaRules, quotaDefault, err := parseQuotas(next.Quotas, next.DefaultQuota)
		if err != nil {
			return nil, err
		}
		link, err := parseLinkRate(next.LinkRate)
		if err != nil {
			return nil, err
		}
		nextCaps, nextQuotas := capSpecs(next), quotaSpecs(next)
		capsAdded, capsRemoved := cli.Diff(caps, nextCaps)
		capsChanged := len(capsAdded)+len(capsRemoved) > 0
		if capsChanged && srv.RateLimits() == nil {
			return nil, errors.New("--rate-limit/--default-rate-limit/--link-rate: the server started without caps; adding them takes a restart")
		}
		// Reverse forwards off at start stay off until a restart (their
		// metrics and limits are set up at start).
		remoteModeChange := !reverseOn && len(next.AllowRemoteListen) > 0
		// The client CAs are read again, as the certificate is; adding or
		// removing --client-ca-file changes how clients authenticate and
		// takes a restart.
		var newCAs *x509.CertPool
		caModeChange := (next.ClientCAFile != "") != (id.clientCAs != nil)
		if !caModeChange && next.ClientCAFile != "" {
			if newCAs, err = transport.LoadCertPool(next.ClientCAFile); err != nil {
				return nil, fmt.Errorf("--client-ca-file: %w", err)
			}
		}
		// A switch to or from shared-secret authentication needs a restart
		// (ErrAuthModeChange): then the keys are left as they are.
		modeChange := (newKeys.Len() > 0) != (keys.Len() > 0)
		var keysAdded, keysRemoved []string
		if !modeChange {
			keysAdded, keysRemoved = cli.Diff(keyLabels(keys), keyLabels(newKeys))
		}
		keysChanged := len(keysAdded)+len(keysRemoved) > 0
		var applied []string
		for _, name := range changed {
			if slices.Contains(reloadableFlags, name) && !((name == "secret-file" || name == "keys-file") && modeChange) &&
				!(name == "client-ca-file" && caModeChange) && !(name == "allow-remote-listen" && remoteModeChange) {
				applied = append(applied, name)
			}
		}
		certReplaced := false
		if old, fp := cert.Fingerprint(), transport.Fingerprint(newCert.Certificate[0]); fp != old {
			certReplaced = true
			cert.Store(newCert)
			klog.InfoS("Replaced the server certificate; new connections get the new one, open ones keep theirs",
				"fingerprint", fp, "previousFingerprint", old, "hint", "clients must pin "+fp+" (--server-fingerprint) or trust its CA")
		}
		caReplaced := false
		if newCAs != nil && !newCAs.Equal(id.clientCAs.Load()) {
			caReplaced = true
			id.clientCAs.Store(newCAs)
			klog.InfoS("Replaced the client CAs; new connections and resumed sessions need a client certificate they verify, open connections keep running",
				"clientCAFile", next.ClientCAFile, "hint", "restart the server to close the open connections of clients the old CAs verified")
		}
		added, removed := cli.Diff(rules, next.Allow)
		deniedAdded, deniedRemoved := cli.Diff(deny, next.Deny)
		forAdded, forRemoved := cli.Diff(allowFor, next.AllowFor)
		note := "open tunnels keep running; the rules and the keys apply to new streams"
		if len(keysRemoved) > 0 && next.CutRemovedKeys {
			note = "the open tunnels and UDP flows of the removed keys were reset with auth_failed (--cut-removed-keys); the others keep running; the rules and the keys apply to new streams"
		}
		rulesChanged := len(added)+len(removed)+len(deniedAdded)+len(deniedRemoved)+len(forAdded)+len(forRemoved) > 0
		if keysChanged || rulesChanged {
			// Keys and rules in one swap: a stream is checked against the
			// keys and the rules of one configuration (a key renamed along
			// with its --allow-for rules must not meet the other's rules).
			apply := keys
			if keysChanged {
				apply = newKeys
			}
			if err := srv.Reconfigure(server.Policy{Keys: apply, Allow: allow, AllowFor: byIdentity, CutRemovedKeys: next.CutRemovedKeys}); err != nil {
				return nil, fmt.Errorf("--secret-file: %w", err)
			}
			keys = apply
			rules, deny, allowFor = next.Allow, next.Deny, next.AllowFor
		}
		if capsChanged {
			srv.RateLimits().Set(capRules, capDefault)
			srv.RateLimits().SetLink(link)
			caps = nextCaps
		}
		quotasAdded, quotasRemoved := cli.Diff(quotas, nextQuotas)
		if len(quotasAdded)+len(quotasRemoved) > 0 {
			srv.Usage().SetQuotas(quotaRules, quotaDefault)
			quotas = nextQuotas
		}
		remoteAdded, remoteRemoved := cli.Diff(remote, next.AllowRemoteListen)
		var reverseClosed any // logged when the reload closed listeners
		if len(remoteAdded)+len(remoteRemoved) > 0 && !remoteModeChange {
			n, err := srv.SetRemoteListen(remoteAll, remoteFor)
			if err != nil {
				return nil, fmt.Errorf("--allow-remote-listen: %w", err) // unreachable: remoteModeChange
			}
			if n > 0 {
				reverseClosed = n
			}
			remote = next.AllowRemoteListen
		}
		resumeWindow := res.Reload(next.ResumeWindow) // logged when changed
		// cutRemovedKeys only when it cut something: it is on by default,
		// and a reload that changes nothing must say so.
		cli.LogApplied(klog.Background(), note,
			"allowAdded", added, "allowRemoved", removed,
			"denyAdded", deniedAdded, "denyRemoved", deniedRemoved, "allowForAdded", forAdded, "allowForRemoved", forRemoved,
			"keysAdded", capList(keysAdded), "keysRemoved", capList(keysRemoved), "cutRemovedKeys", next.CutRemovedKeys && len(keysRemoved) > 0,
			"certificateReplaced", certReplaced, "clientCAsReplaced", caReplaced,
			"allowRemoteListenAdded", remoteAdded, "allowRemoteListenRemoved", remoteRemoved, "reverseForwardsClosed", reverseClosed,
			"rateLimitsAdded", capsAdded, "rateLimitsRemoved", capsRemoved, "quotasAdded", quotasAdded, "quotasRemoved", quotasRemoved,
			"resumeWindow", resumeWindow)
		return applied, nil
	}
}

// loadKeys reads the keys the server accepts: the unnamed key of
// --secret-file and the named keys of --keys-file (nil: neither given).
func loadKeys(secretFile, keysFile string) (*proto.Keyring, error) {
	var keys []proto.Key
	if secretFile != "" {
		secret, err := cli.ReadSecretFile("secret-file", secretFile, cli.MinSecretLen)
		if err != nil {
			return nil, err
		}
		keys = append(keys, proto.Key{Secret: secret})
	}
	if keysFile != "" {
		ks, err := cli.ReadKeysFile("keys-file", keysFile)
		if err != nil {
			return nil, err
		}
		keys = append(keys, ks...)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	kr, err := proto.NewKeyring(keys...)
	if err != nil {
		return nil, fmt.Errorf("--secret-file/--keys-file: %w", err)
	}
	return kr, nil
}

// warnUnmatchedIdentities logs, at -v 0, --allow-for rules that can never
// match: CN= without --client-ca-file, key= naming no --keys-file key.
func (o *Options) warnUnmatchedIdentities(logger klog.Logger, keys *proto.Keyring) {
	for _, spec := range o.AllowFor {
		id, _, err := splitAllowFor(spec)
		if err != nil {
			continue
		}
		kind, name, _ := strings.Cut(id, "=")
		switch {
		case kind == "CN" && o.ClientCAFile == "":
			logger.Info("An --allow-for rule names a client certificate, but the server does not ask for one: set --client-ca-file, or the rule never applies", "rule", spec)
		case kind == "key" && !slices.ContainsFunc(keys.Keys(), func(k proto.Key) bool { return k.Label() == name }):
			logger.Info("An --allow-for rule names a key the server does not hold: name it in --keys-file, or the rule never applies", "rule", spec)
		}
	}
}

// maxLoggedKeys bounds the keys a reload's log line names one by one.
const maxLoggedKeys = 20

// capList returns vs for a log line: the first maxLoggedKeys, then how many
// more (a --keys-file of thousands of keys must not make a line of them).
func capList(vs []string) []string {
	if len(vs) <= maxLoggedKeys {
		return vs
	}
	return append(slices.Clip(vs[:maxLoggedKeys]), fmt.Sprintf("... and %d more", len(vs)-maxLoggedKeys))
}

// keyLabels names the keys of kr for logs, "NAME (ID)" (the ID alone for
// the unnamed key), so a secret replaced under the same name shows too.
func keyLabels(kr *proto.Keyring) []string { return keyLabelsOf(kr.Keys()) }

// keyLabelsOf is keyLabels of keys.
func keyLabelsOf(keys []proto.Key) []string {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		if k.Name == "" {
			out = append(out, k.ID.String())
			continue
		}
		out = append(out, k.Name+" ("+k.ID.String()+")")
	}
	return out
}

// parseAllowFor parses --allow-for rules, IDENTITY=RULE with IDENTITY
// "CN=NAME" (a client certificate's common name) or "key=NAME" (a
// --keys-file key), into an allow-list per identity carrying the deny rules.
func parseAllowFor(specs, deny []string) (map[string]*endpoint.AllowList, error) {
	rules := map[string][]string{}
	var order []string
	for _, spec := range specs {
		id, rule, err := splitAllowFor(spec)
		if err != nil {
			return nil, err
		}
		if _, seen := rules[id]; !seen {
			order = append(order, id)
		}
		rules[id] = append(rules[id], rule)
	}
	out := make(map[string]*endpoint.AllowList, len(rules))
	for _, id := range order {
		a, err := endpoint.ParseRules(rules[id], deny)
		if err != nil {
			return nil, fmt.Errorf("--allow-for %s: %w", id, err)
		}
		out[id] = a
	}
	return out, nil
}

// parseRemoteListen parses --allow-remote-listen rules, LISTEN for every
// client or IDENTITY=LISTEN (as --allow-for) for one: the rules for all
// (nil: none) and by identity.
func parseRemoteListen(specs []string) (*endpoint.AllowList, map[string]*endpoint.AllowList, error) {
	var all []string
	var forID []string
	for _, spec := range specs {
		if strings.HasPrefix(spec, "CN=") || strings.HasPrefix(spec, "key=") {
			forID = append(forID, spec)
			continue
		}
		all = append(all, spec)
	}
	var allowAll *endpoint.AllowList
	if len(all) > 0 {
		a, err := endpoint.ParseRules(all, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("--allow-remote-listen: %w", err)
		}
		allowAll = a
	}
	byID, err := parseAllowFor(forID, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("--allow-remote-listen: %w", err)
	}
	return allowAll, byID, nil
}

// splitAllowFor splits "CN=NAME=RULE" or "key=NAME=RULE".
func splitAllowFor(spec string) (identity, rule string, err error) {
	kind, rest, ok := strings.Cut(spec, "=")
	name, rule, ok2 := strings.Cut(rest, "=")
	switch {
	case !ok || !ok2 || name == "" || rule == "":
		return "", "", fmt.Errorf("--allow-for %q: want CN=NAME=RULE or key=NAME=RULE, e.g. CN=ci-runner=tcp:10.0.0.5:5432", spec)
	case kind != "CN" && kind != "key":
		return "", "", fmt.Errorf("--allow-for %q: the identity is CN=NAME (client certificate) or key=NAME (--keys-file key), not %s=", spec, kind)
	}
	return kind + "=" + name, rule, nil
}
