package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io/fs"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/pkg/admin"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/socks5"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/tunnel"
)

// Run runs the command with args and returns the exit code.
func Run(args []string) int { return cli.Main(NewCommand(), args) }

// NewCommand returns the quictun-client command.
func NewCommand() *cobra.Command {
	o := NewOptions()
	cmd := cli.NewRootCommand("quictun-client", o, flagGroups)
	cmd.Short = "Local end of a quictun TCP-over-QUIC tunnel"
	cmd.Long = `quictun-client accepts local TCP and UNIX connections and carries each one as a stream over one
long-lived QUIC connection to quictun-server, which connects it to the destination named by the token.`
	cmd.Example = `  # forward local port 2222 to the server host's SSH daemon
  quictun-client --listen-on tcp:127.0.0.1:2222 --server-endpoint server.example.com:7500 \
      --server-fingerprint sha256:3f1c... --secret-file /etc/quictun/secret \
      --token-source tcp:127.0.0.1:22`
	checkOpts := NewOptions()
	cmd.AddCommand(cli.NewCheckCommand(checkOpts, func() string { return checkOpts.ServerEndpoint }))
	return cmd
}

// Run starts the client and blocks until ctx is cancelled and the drain is
// over. It builds in steps: TLS and credentials, then the admin listener,
// local listeners and UDP socket (each pushed on one Cleanup), the client,
// then runs.
func (o *Options) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	cli.LogHostCheck(o.ServerEndpoint)
	var cleanup cli.Cleanup
	defer cleanup.Run()

	tlsConf, err := o.tlsConfig(logger)
	if err != nil {
		return err
	}
	secret, err := clientSecret(o.SecretFile)
	if err != nil {
		return err
	}
	var tokens client.TokenSource
	listenOn := o.ListenOn
	if o.TokenSource != "" {
		if tokens, err = token.NewSource(o.TokenSourcePlugin, o.TokenSource, nil); err != nil {
			return fmt.Errorf("--token-source: %w", err)
		}
	} else {
		listenOn = nil // --forward alone: no destination for --listen-on
	}
	adm, err := cli.OpenAdminServer(o.HTTPDListenOn, o.HTTPDTokenFile)
	if err != nil {
		return err
	}
	cleanup.Push(adm.Close)
	listeners := make([]net.Listener, 0, len(listenOn))
	for _, spec := range listenOn {
		ln, err := listen("listen-on", spec)
		if err != nil {
			return err
		}
		cleanup.Push(func() { _ = ln.Close() }) // the client closes them too when it stops
		listeners = append(listeners, ln)
	}
	forwards := make([]client.Forward, 0, len(o.Forward))
	for _, f := range o.Forward {
		spec, dest, err := splitForward(f)
		if err != nil {
			return err
		}
		ts, err := token.NewSource(token.PluginFixed, dest, nil)
		if err != nil {
			return fmt.Errorf("--forward %s: %w", f, err)
		}
		if ep, _ := endpoint.Parse(spec); ep.Network == endpoint.NetworkUDP {
			uc, err := listenUDP(spec, ep.Address)
			if err != nil {
				return err
			}
			cleanup.Push(func() { _ = uc.Close() })
			forwards = append(forwards, client.Forward{Packet: uc, Tokens: ts})
			continue
		}
		ln, err := listen("forward", spec)
		if err != nil {
			return err
		}
		cleanup.Push(func() { _ = ln.Close() })
		forwards = append(forwards, client.Forward{Listener: ln, Tokens: ts})
	}
	for _, p := range o.Proxy {
		kind, addr, _ := strings.Cut(p, ":")
		var proxy ingress.Proxy = ingress.HTTPConnect{}
		if kind == ProxySOCKS5 {
			creds, err := proxyCredentials(o.ProxyCredentials)
			if err != nil {
				return err
			}
			proxy = ingress.SOCKS5{Credentials: creds}
		}
		ln, err := listen("proxy", "tcp:"+addr)
		if err != nil {
			return err
		}
		cleanup.Push(func() { _ = ln.Close() })
		forwards = append(forwards, client.Forward{Listener: ln, Proxy: proxy})
	}
	pc, err := transport.ListenUDP(":0")
	if err != nil {
		return err
	}
	cleanup.Push(func() { _ = pc.Close() })
	qopts := o.QUICOptions()
	fecLayer, err := o.FECLayer(true)
	if err != nil {
		return err
	}
	var packetConn net.PacketConn = pc
	var wrap func(net.PacketConn) net.PacketConn
	if fecLayer != nil {
		// Path rescue's extra sockets are wrapped the same way, into the same stats.
		wrap = func(u net.PacketConn) net.PacketConn {
			if uc, ok := u.(*net.UDPConn); ok {
				transport.ForceSocketBuffers(uc, 7<<20)
			}
			return fecLayer.Wrap(u)
		}
		packetConn = wrap(pc)
		qopts.DisablePathMTUDiscovery = true // leave room for the FEC header
		logger.Info("Forward error correction on", "fec", o.FEC)
	}
	qconf := transport.QUICConfig(qopts)
	if err := cli.EnableQlog(qconf, o.QlogDir, logger); err != nil {
		return err
	}

	reg := cli.NewRegistry()
	m := metrics.NewClient(reg)
	registry := tunnel.NewRegistry()
	bo := client.DefaultBackoff()
	bo.Max = o.ReconnectMax
	var c *client.Client
	qstat := metrics.NewQUICCollector("client", true, func() []metrics.ConnStats { return c.ConnStats() })
	c, err = client.New(client.Config{
		ServerAddr:        o.ServerEndpoint,
		TLS:               tlsConf,
		QUIC:              qconf,
		Secret:            secret,
		Tokens:            tokens,
		Listeners:         listeners,
		Forwards:          forwards,
		SessionWait:       o.SessionWait,
		StreamOpenTimeout: o.StreamOpenTimeout,
		MaxConnections:    o.MaxConnections,
		UDPIdleTimeout:    o.UDPIdleTimeout,
		DrainTimeout:      o.DrainTimeout,
		Backoff:           bo,
		HeartbeatInterval: o.HeartbeatInterval,
		RescueAfter:       o.RescueAfter,
		TailProbes:        o.TailProbes,
		Metrics:           m,
		QUICStat:          qstat,
		Registry:          registry,
		WrapConn:          wrap,
	}, packetConn)
	if err != nil {
		return err
	}
	reg.MustRegister(qstat, metrics.NewLivenessCollector("client", c.LivenessStats()))
	if fecLayer != nil {
		reg.MustRegister(metrics.NewFECCollector("client", fecLayer.Stats()))
	}
	logger.Info("Tunnel configured", "serverEndpoint", o.ServerEndpoint, "listeners", strings.Join(listenOn, ","), "forwards", strings.Join(o.Forward, ","), "proxies", strings.Join(o.Proxy, ","))

	adm.Start(ctx, admin.Options{Gatherer: reg, Ready: c.Ready, Registry: registry, Conns: c.ConnStats, EnablePprof: o.EnablePprof})
	var rg errgroup.Group
	rctx, stopReload := context.WithCancel(ctx)
	if o.reloader != nil {
		reloads := metrics.NewReload(reg, "client")
		rg.Go(func() error {
			o.reloader.Watch(rctx, o.applier(c, secret), reloads)
			return nil
		})
	}
	err = c.Run(ctx)
	stopReload()
	_ = rg.Wait()
	return cli.RunErr(err, adm.Stop())
}

// tlsConfig builds the client's TLS configuration: how it verifies the
// server, its certificate for mutual TLS, and its session ticket cache.
func (o *Options) tlsConfig(logger klog.Logger) (*tls.Config, error) {
	topts := transport.ClientTLSOptions{
		ServerName:         o.ServerName,
		InsecureSkipVerify: o.InsecureSkipVerify,
		SessionCache:       transport.NewStickySessionCache(16),
	}
	if o.SessionFile != "" {
		if err := transport.CheckPrivate("--session-file", o.SessionFile); err != nil {
			return nil, err
		}
		topts.SessionCache = transport.NewFileSessionCache(o.SessionFile, 16, func(err error) {
			logger.Error(err, "Session tickets", "file", o.SessionFile)
		})
	}
	if topts.ServerName == "" {
		host, _, _ := net.SplitHostPort(o.ServerEndpoint)
		topts.ServerName = host
	}
	for _, f := range o.ServerFingerprint {
		fp, err := transport.ParseFingerprint(f)
		if err != nil {
			return nil, err
		}
		topts.Fingerprints = append(topts.Fingerprints, fp)
	}
	if o.CAFile != "" {
		pool, err := transport.LoadCertPool(o.CAFile)
		if err != nil {
			return nil, err
		}
		topts.RootCAs = pool
	}
	if o.CertFile != "" {
		if err := transport.CheckPrivate("--key-file", o.KeyFile); err != nil {
			return nil, err
		}
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		topts.ClientCert = &cert
	}
	if o.InsecureSkipVerify {
		logger.Info("WARNING: the server certificate is not verified (--insecure-skip-verify)")
	}
	return transport.ClientTLSConfig(topts)
}

// listen opens a local listener for "tcp:HOST:PORT" or "unix:/path". A stale
// UNIX socket file left by a previous run is removed first.
// proxyCredentials reads --proxy-credentials-file (USER:PASSWORD); nil
// without one.
func proxyCredentials(file string) (socks5.Credentials, error) {
	if file == "" {
		return nil, nil
	}
	b, err := cli.ReadSecretFile("proxy-credentials-file", file, 3)
	if err != nil {
		return nil, err
	}
	user, pass, ok := strings.Cut(string(b), ":")
	if !ok || user == "" || pass == "" || len(user) > 255 || len(pass) > 255 {
		return nil, fmt.Errorf("--proxy-credentials-file %s: want one line USER:PASSWORD (each 1-255 bytes)", file)
	}
	return socks5.UserPass{User: user, Password: pass}, nil
}

// listenUDP opens the UDP socket of a udp: forward.
func listenUDP(spec, address string) (*net.UDPConn, error) {
	ua, err := net.ResolveUDPAddr("udp", address)
	if err != nil {
		return nil, fmt.Errorf("--forward %s: %w", spec, err)
	}
	uc, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("--forward %s: %w", spec, err)
	}
	return uc, nil
}

func listen(flag, spec string) (net.Listener, error) {
	ep, err := endpoint.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("--%s %q: %w", flag, spec, err)
	}
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
var reloadableFlags = []string{"token-source", "token-source-plugin", "secret-file"}

// applier returns the cli.Apply of a running client: the token source built
// again (a File source re-reads its file) and the secret file read again.
// Everything is read and checked before anything is applied.
func (o *Options) applier(c *client.Client, secret []byte) cli.Apply {
	return func(d cli.Daemon, changed []string) ([]string, error) {
		next := d.(*Options)
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
		if tokens != nil {
			c.SetTokens(tokens)
		}
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
		klog.InfoS("Applied configuration changes", "tokenSourcePlugin", next.TokenSourcePlugin, "secretChanged", secretChanged,
			"note", "open tunnels keep running; the token source and the secret apply to new local connections")
		return applied, nil
	}
}

// clientSecret reads the secret a client authenticates with (nil without
// --secret-file).
func clientSecret(file string) ([]byte, error) {
	if file == "" {
		return nil, nil
	}
	return cli.ReadSecretFile("secret-file", file, cli.MinSecretLen)
}
