package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/handover"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/socks5"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/tunnel"
)

// Run runs the command with args and returns the exit code.
func Run(args []string) int {
	return cli.Main(NewCommand(), args)
}

// NewCommand returns the quictun-client command.
func NewCommand() *cobra.Command {
	o := NewOptions()
	cmd := cli.NewRootCommand("quictun-client", o, flagGroups)
	cmd.Short = "Local end of a quictun TCP-over-QUIC tunnel"
	cmd.Long = `quictun-client accepts local TCP, UDP and UNIX connections (--forward LISTEN=DESTINATION, as ssh -L,
or --proxy entry points) and carries each one as a stream over one long-lived QUIC connection (TCP
where UDP is blocked) to quictun-server, which connects it to the destination its --allow admits.`
	cmd.Example = `  # forward local port 2222 to the server host's SSH daemon
  quictun-client --server-endpoint server.example.com:7500 --server-fingerprint sha256:3f1c... \
      --secret-file /etc/quictun/secret --forward tcp:127.0.0.1:2222=tcp:127.0.0.1:22
  # the legacy single-forward form (quic-tun's flags) still works
  quictun-client --listen-on tcp:127.0.0.1:2222 --token-source tcp:127.0.0.1:22 ...`
	checkOpts := NewOptions()
	cmd.AddCommand(cli.NewCheckCommand(checkOpts, func() string {
		if len(checkOpts.ServerEndpoint) == 0 {
			return ""
		}
		return checkOpts.ServerEndpoint[0]
	}))
	return cmd
}

// Run starts the client and blocks until ctx is cancelled and the drain is
// over. It builds in steps: TLS and credentials, then the admin listener,
// the local entry points and the UDP socket (each pushed on one Cleanup),
// the client, then serves it (cli.DaemonFlags.Serve).
//
//nolint:funlen // the build steps in order with one cleanup path; split, the order would be spread over helpers
func (o *Options) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	for _, ep := range o.ServerEndpoint {
		cli.LogHostCheck(ep)
	}
	if o.entries == nil { // Run without Validate (a test): parse them here
		if err := o.Validate(); err != nil {
			return err
		}
	}
	var cleanup cli.Cleanup
	defer cleanup.Run()

	cache, err := o.sessionCache(logger)
	if err != nil {
		return err
	}
	tlsConf, serverTLS, err := o.tlsConfig(logger, cache)
	if err != nil {
		return err
	}
	secret, err := clientSecret(o.SecretFile)
	if err != nil {
		return err
	}
	tokens, err := o.tokens()
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
	users, err := proxyCredentials(o.ProxyCredentials)
	if err != nil {
		return err
	}
	proxyCreds := ingress.NewProxyCredentials(credentialsOf(users))
	listeners, forwards, named, err := o.localEntries(inh, &cleanup, proxyCreds)
	if err != nil {
		return err
	}
	o.logProxies(logger, users)
	q := o.QUICOptions()
	q.FullReceiveWindows = true // the client trusts the server it verified
	sock, err := o.OpenSocket(":0", q, true, &cleanup, logger)
	if err != nil {
		return err
	}

	reg := cli.NewRegistry()
	registry := tunnel.NewRegistry()
	bo := client.DefaultBackoff()
	bo.Max = o.ReconnectMax
	var c *client.Client
	qstat := metrics.NewQUICCollector("client", true, cli.QUICConns(func() []transport.ConnStats { return c.ConnStats() }))
	mode, err := client.ParseMode(o.ServerMode)
	if err != nil {
		return err
	}
	cfg := o.Client
	cfg.Servers, cfg.Mode, cfg.TLS, cfg.ServerTLS, cfg.QUIC, cfg.WrapConn = o.ServerEndpoint, mode, tlsConf, serverTLS, sock.QUIC, sock.Wrap
	cfg.Secret, cfg.Tokens, cfg.Listeners, cfg.Forwards = secret, tokens, listeners, forwards
	cfg.Check = o.checkDestinations()
	if len(o.entries.remote) > 0 {
		cfg.RemoteForwards = o.entries.remote
		cfg.Reverse.Events = client.NewReverseMetrics(reg)
		cfg.Reverse.UDPIdleTimeout = o.UDPIdleTimeout
		cfg.Reverse.AuditLog = true // a reverse forward exposes a local service: one line per tunnel
	}
	cfg.Backoff = bo
	cfg.UDPIdleTimeout, cfg.DrainTimeout, cfg.TailProbes = o.UDPIdleTimeout, o.DrainTimeout, o.TailProbes
	cfg.Metrics, cfg.QUICStat, cfg.Registry = client.NewMetrics(reg), qstat, registry
	o.resume = o.NewResume()
	cfg.Resume = &ingress.Resume{Table: o.resume.Table, Window: o.resume.Window, Budget: o.resume.Budget,
		Events: client.NewResumeMetrics(reg, o.resume.Budget.Used)}
	c, err = client.New(cfg, sock.Conn)
	if err != nil {
		return err
	}
	if len(o.ServerEndpoint) > 1 || o.Client.ConnectionsPerServer > 1 {
		reg.MustRegister(metrics.NewServerCollector(c.ServerStats, c.Switches))
	}
	logger.Info("Tunnel configured", o.entriesLog()...)
	return o.ServeUpgradable(ctx, cli.Serving{
		Side: "client", Service: c, Socket: sock, Metrics: reg, QUICStat: qstat, Tunnels: registry,
		Admin: adm, Reloader: o.reloader, Apply: o.applier(c, secret, cache, proxyCreds),
	}, cli.Upgrade{Inherited: inh, Service: c,
		Sockets: func() ([]handover.Listener, error) {
			return cli.DupSockets(append(slices.Clone(named), cli.NamedSocket{Name: cli.SockAdmin, Socket: adm.Listener()}))
		},
		Connected: func(ctx context.Context) { c.Connected(ctx, upgradeConnectWait) },
	})
}

// tokens is the token source of the --listen-on listeners (nil without
// --token-source: --forward alone): the one Validate built, or a File
// source, whose file is read now.
func (o *Options) tokens() (client.TokenSource, error) {
	if o.TokenSource == "" {
		return nil, nil
	}
	if o.entries.tokens != nil {
		return o.entries.tokens, nil
	}
	ts, err := token.NewSource(o.TokenSourcePlugin, o.TokenSource, nil)
	if err != nil {
		return nil, fmt.Errorf("--token-source: %w", err)
	}
	return ts, nil
}

// listenOn is the --listen-on listeners opened: none without --token-source
// (--forward alone leaves them without a destination).
func (o *Options) listenOn() []string {
	if o.TokenSource == "" {
		return nil
	}
	return o.ListenOn
}

// checkDestinations are the fixed destinations the client asks the server
// about when it connects (client.Config.Check): each forward's, and a Fixed
// token source's when listeners use it; each once.
func (o *Options) checkDestinations() []string {
	var out []string
	add := func(d string) {
		if d != "" && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	if strings.EqualFold(o.TokenSourcePlugin, token.PluginFixed) && len(o.listenOn()) > 0 {
		add(o.TokenSource)
	}
	for _, f := range o.entries.forwards {
		add(f.dest)
	}
	return out
}

// entriesLog is the server endpoint and the local entry points for the
// "Tunnel configured" line, leaving out the kinds not configured.
func (o *Options) entriesLog() []any {
	kv := []any{"serverEndpoint", strings.Join(o.ServerEndpoint, ",")}
	if len(o.ServerEndpoint) > 1 {
		kv = append(kv, "serverMode", o.ServerMode)
	}
	if o.Client.ConnectionsPerServer > 1 {
		kv = append(kv, "connections", o.Client.ConnectionsPerServer)
	}
	for _, e := range []struct {
		key   string
		specs []string
	}{{"listeners", o.listenOn()}, {"forwards", o.Forward}, {"remoteForwards", o.RemoteForward}, {"proxies", o.Proxy}} {
		if len(e.specs) > 0 {
			kv = append(kv, e.key, strings.Join(e.specs, ","))
		}
	}
	return kv
}

// logProxies says at -v 0 which --proxy entry points require credentials
// (users from --proxy-credentials-file), and what the others lend.
func (o *Options) logProxies(logger klog.Logger, users socks5.Users) {
	for _, p := range o.Proxy {
		kind, addr, _ := strings.Cut(p, ":")
		if len(users) > 0 {
			logger.Info("Proxy entry point requires credentials", "address", addr, "kind", kind, "users", len(users))
			continue
		}
		logger.Info("Proxy entry point requires no credentials: whoever can connect to it uses this client's credentials and picks the destinations; set --proxy-credentials-file to require a username and password",
			"address", addr, "kind", kind)
	}
}

// upgradeConnectWait bounds how long the new process of an upgrade waits
// for its first connection to a server before it reports ready and takes
// the tunnels over (they then wait to re-attach, as after a lost
// connection).
const upgradeConnectWait = 10 * time.Second

// localEntries opens the local entry points applications connect to, each
// pushed on cleanup, or takes those an upgrade handed over (inh): the
// --listen-on listeners (the client's own Listeners) and each --forward
// (TCP, UNIX or UDP) and --proxy (the client's Forwards), the proxies
// requiring creds. named are the sockets, by the name an upgrade hands
// them over under (the flag and its value).
func (o *Options) localEntries(inh *cli.Inherited, cleanup *cli.Cleanup, creds *ingress.ProxyCredentials) (
	listeners []net.Listener, forwards []client.Forward, named []cli.NamedSocket, err error,
) {
	open := func(name string, ep endpoint.Endpoint) (net.Listener, error) {
		ln, err := inh.Listener(name)
		if ln == nil && err == nil {
			ln, err = listenEndpoint(strings.SplitN(name, ":", 2)[0], ep)
		}
		if err != nil {
			return nil, err
		}
		cleanup.Push(func() { _ = ln.Close() }) // the client closes them too when it stops
		named = append(named, cli.NamedSocket{Name: name, Socket: ln})
		return ln, nil
	}
	for _, spec := range o.listenOn() {
		ep, err := endpoint.Parse(spec)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--listen-on %q: %w", spec, err)
		}
		ln, err := open("listen-on:"+spec, ep)
		if err != nil {
			return nil, nil, nil, err
		}
		listeners = append(listeners, ln)
	}
	for _, f := range o.entries.forwards {
		fw, err := openForward(inh, f, cleanup, open)
		if err != nil {
			return nil, nil, nil, err
		}
		if fw.Packet != nil {
			named = append(named, cli.NamedSocket{Name: "forward:" + f.listen.String(), Socket: fw.Packet})
		}
		forwards = append(forwards, fw)
	}
	for _, p := range o.Proxy {
		kind, addr, _ := strings.Cut(p, ":")
		var proxy ingress.Proxy = ingress.HTTPConnect{Credentials: creds}
		if kind == ProxySOCKS5 {
			proxy = ingress.SOCKS5{Credentials: creds}
		}
		ep, err := endpoint.Parse("tcp:" + addr)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--proxy %q: %w", p, err)
		}
		ln, err := open("proxy:"+p, ep)
		if err != nil {
			return nil, nil, nil, err
		}
		forwards = append(forwards, client.Forward{Listener: ln, Proxy: proxy, Name: kind})
	}
	return listeners, forwards, named, nil
}

// openForward opens the listener (or UDP socket) of one --forward
// LISTEN=DESTINATION, or takes the one an upgrade handed over (inh),
// pushing its Close on cleanup; open opens (or takes) a listener.
func openForward(inh *cli.Inherited, f forwardSpec, cleanup *cli.Cleanup, open func(string, endpoint.Endpoint) (net.Listener, error)) (client.Forward, error) {
	name := "forward:" + f.listen.String()
	if f.listen.Network == endpoint.NetworkUDP {
		uc, err := inh.UDP(name)
		if uc == nil && err == nil {
			uc, err = transport.ListenUDP(f.listen.Address)
		}
		if err != nil {
			return client.Forward{}, fmt.Errorf("--forward %s: %w", f.listen, err)
		}
		cleanup.Push(func() { _ = uc.Close() })
		return client.Forward{Packet: uc, Tokens: f.tokens, Name: f.dest}, nil
	}
	ln, err := open(name, f.listen)
	if err != nil {
		return client.Forward{}, err
	}
	return client.Forward{Listener: ln, Tokens: f.tokens, Name: f.dest}, nil
}

// sessionCache returns the client's session ticket cache: in --session-file
// (kept across restarts), or in memory. It lives as long as the client: a
// reload builds a new TLS configuration around the same cache.
func (o *Options) sessionCache(logger klog.Logger) (tls.ClientSessionCache, error) {
	// Room for a ticket of each connection (each keeps its own) and more.
	capacity := max(16, 4*len(o.ServerEndpoint)*o.Client.ConnectionsPerServer)
	if o.SessionFile == "" {
		return transport.NewStickySessionCache(capacity), nil
	}
	if err := transport.CheckPrivate("--session-file", o.SessionFile); err != nil {
		return nil, err
	}
	return transport.NewFileSessionCache(o.SessionFile, capacity, func(err error) {
		logger.Error(err, "Session tickets", "file", o.SessionFile)
	}), nil
}

// tlsConfig builds the client's TLS configurations: how it verifies the
// servers and its certificate for mutual TLS, with cache for session
// tickets. all verifies every server without pins of its own (nil when each
// has its own); byServer holds, by endpoint, the configuration of each that
// has (--server-fingerprint ENDPOINT=sha256:HEX).
func (o *Options) tlsConfig(logger klog.Logger, cache tls.ClientSessionCache) (all *tls.Config, byServer map[string]*tls.Config, err error) {
	topts := transport.ClientTLSOptions{
		ServerName:         o.ServerName,
		InsecureSkipVerify: o.InsecureSkipVerify,
		SessionCache:       cache,
	}
	if topts.ServerName == "" && len(o.ServerEndpoint) == 1 {
		// With several, the client verifies each server against its own host.
		host, _, _ := net.SplitHostPort(o.ServerEndpoint[0])
		topts.ServerName = host
	}
	pins, err := transport.ParsePins(o.ServerFingerprint)
	if err != nil {
		return nil, nil, err
	}
	if o.CAFile != "" {
		pool, err := transport.LoadCertPool(o.CAFile)
		if err != nil {
			return nil, nil, err
		}
		topts.RootCAs = pool
	}
	if o.CertFile != "" {
		if err := transport.CheckPrivate("--key-file", o.KeyFile); err != nil {
			return nil, nil, err
		}
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("client certificate: %w", err)
		}
		topts.ClientCert = &cert
	}
	if o.InsecureSkipVerify {
		logger.Info("WARNING: the server certificate is not verified (--insecure-skip-verify)")
	}
	return transport.ClientTLSConfigs(topts, pins)
}

// proxyCredentials reads --proxy-credentials-file (lines USER:PASSWORD);
// nil without one.
func proxyCredentials(file string) (socks5.Users, error) {
	if file == "" {
		return nil, nil
	}
	b, err := cli.ReadSecretFile("proxy-credentials-file", file, 3)
	if err != nil {
		return nil, err
	}
	users, err := socks5.ParseUsers(b)
	if err != nil {
		return nil, fmt.Errorf("--proxy-credentials-file %s: %w; one USER:PASSWORD a line, mode 0600", file, err)
	}
	return users, nil
}

// credentialsOf is users as the credentials the proxies require: nil (none)
// for no users.
func credentialsOf(users socks5.Users) socks5.Credentials {
	if len(users) == 0 {
		return nil
	}
	return users
}

// listenEndpoint opens a local listener on ep (tcp: or unix:). A stale
// UNIX socket file left by a previous run is removed first.
func listenEndpoint(flag string, ep endpoint.Endpoint) (net.Listener, error) {
	spec := ep.String()
	if ep.Network == endpoint.NetworkUnix {
		if fi, err := os.Lstat(ep.Address); err == nil && fi.Mode().Type() == fs.ModeSocket {
			if c, err := net.Dial("unix", ep.Address); err == nil {
				_ = c.Close()
				return nil, fmt.Errorf("--%s %s: another process is listening there", flag, spec)
			}
			_ = os.Remove(ep.Address)
		}
	}
	ln, err := net.Listen(ep.Network, ep.Address)
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flag, spec, err)
	}
	return ln, nil
}

// reloadableFlags are the client flags a reload applies; every other change
// needs a restart.
var reloadableFlags = []string{"token-source", "token-source-plugin", "secret-file",
	"server-fingerprint", "ca-file", "server-name", "insecure-skip-verify", "cert-file", "key-file", "proxy-credentials-file", "resume-window"}

// applier returns the cli.Apply of a running client: the token source built
// again (a File source re-reads its file), the secret file read again, and
// the TLS configuration built again (the pinned fingerprints, the CA file
// and the client certificate files read again) around the same session
// cache, for the connections dialed from then on, and the
// --proxy-credentials-file read again into proxyCreds, for the proxy
// requests read from then on. Everything is read and checked before
// anything is applied.
func (o *Options) applier(c *client.Client, secret []byte, cache tls.ClientSessionCache, proxyCreds *ingress.ProxyCredentials) cli.Apply {
	running, _ := transport.ParsePins(o.ServerFingerprint) // Validate parsed them
	pins, ca := running.Entries(), fileDigest(o.CAFile)
	plugin, source, sourceDigest := o.TokenSourcePlugin, o.TokenSource, tokenFileDigest(o.TokenSourcePlugin, o.TokenSource)
	credsFile, credsDigest := o.ProxyCredentials, fileDigest(o.ProxyCredentials)
	return func(d cli.Daemon, changed []string) ([]string, error) {
		next := d.(*Options)
		tlsConf, serverTLS, err := next.tlsConfig(klog.Background(), cache)
		if err != nil {
			return nil, err
		}
		nextPins, err := transport.ParsePins(next.ServerFingerprint)
		if err != nil {
			return nil, err
		}
		// The pins go to the servers running (a change of --server-endpoint
		// needs a restart): each must still be covered.
		if err := nextPins.Check(o.ServerEndpoint); err != nil {
			return nil, fmt.Errorf("pins for the running --server-endpoint (a change to it needs a restart): %w", err)
		}
		var tokens client.TokenSource
		if next.TokenSource != "" {
			ts, err := token.NewSource(next.TokenSourcePlugin, next.TokenSource, nil)
			if err != nil {
				return nil, fmt.Errorf("--token-source: %w", err)
			}
			tokens = ts
		}
		newSecret, err := clientSecret(next.SecretFile)
		if err != nil {
			return nil, err
		}
		var users socks5.Users
		if len(o.Proxy) > 0 {
			if users, err = proxyCredentials(next.ProxyCredentials); err != nil {
				return nil, err
			}
		}
		// Everything is read and checked: apply (SetTLS refuses only a
		// server left without verification, which Check ruled out).
		if err := c.SetTLS(tlsConf, serverTLS); err != nil {
			return nil, err
		}
		credsChanged := false
		if len(o.Proxy) > 0 {
			nextDigest := fileDigest(next.ProxyCredentials)
			credsChanged = next.ProxyCredentials != credsFile || nextDigest != credsDigest
			credsDigest = nextDigest
			proxyCreds.Set(credentialsOf(users))
			switch {
			case next.ProxyCredentials != "":
				klog.InfoS("Reloaded proxy credentials", "file", next.ProxyCredentials, "users", len(users),
					"note", "they apply to new proxy connections; connections already authenticated keep running")
			case credsFile != "":
				klog.InfoS("Proxy entry points no longer require credentials (--proxy-credentials-file removed): whoever can connect to them uses this client's credentials",
					"proxies", strings.Join(o.Proxy, ","))
			}
			credsFile = next.ProxyCredentials
		}
		if tokens != nil {
			c.SetTokens(tokens)
		}
		pinsAdded, pinsRemoved := cli.Diff(pins, nextPins.Entries())
		nextCA := fileDigest(next.CAFile)
		caChanged := nextCA != ca
		pins, ca = nextPins.Entries(), nextCA
		secretChanged := !bytes.Equal(newSecret, secret)
		if secretChanged {
			c.SetSecret(newSecret)
			secret = newSecret
		}
		var applied []string
		for _, name := range changed {
			if slices.Contains(reloadableFlags, name) {
				applied = append(applied, name)
			}
		}
		nextDigest := tokenFileDigest(next.TokenSourcePlugin, next.TokenSource)
		tokensChanged := next.TokenSourcePlugin != plugin || next.TokenSource != source || nextDigest != sourceDigest
		plugin, source, sourceDigest = next.TokenSourcePlugin, next.TokenSource, nextDigest
		resumeWindow := o.resume.Reload(next.ResumeWindow) // logged when changed
		cli.LogApplied(klog.Background(), "open tunnels keep running; the token source and the secret apply to new local connections, the server verification to new connections to the server",
			"tokenSourceChanged", tokensChanged, "secretChanged", secretChanged,
			"serverFingerprintsAdded", pinsAdded, "serverFingerprintsRemoved", pinsRemoved, "caFileChanged", caChanged,
			"proxyCredentialsChanged", credsChanged, "resumeWindow", resumeWindow)
		return applied, nil
	}
}

// fileDigest is the SHA-256 of file's contents, "" for no file or one that
// cannot be read (to tell whether a reload changed it).
func fileDigest(file string) string {
	if file == "" {
		return ""
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// tokenFileDigest is fileDigest of a File token source's file ("" for other
// sources), to tell whether a reload changed its tokens.
func tokenFileDigest(plugin, source string) string {
	if !strings.EqualFold(plugin, token.PluginFile) {
		return ""
	}
	return fileDigest(source)
}

// clientSecret reads the secret a client authenticates with (nil without
// --secret-file).
func clientSecret(file string) ([]byte, error) {
	if file == "" {
		return nil, nil
	}
	return cli.ReadSecretFile("secret-file", file, cli.MinSecretLen)
}
