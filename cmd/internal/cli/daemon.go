package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/admin"
	"github.com/quictun/quictun/pkg/fec"
	"github.com/quictun/quictun/pkg/transport"
)

// DaemonFlags are the settings both daemons have with the same meaning: the
// admin server, qlog, forward error correction, and the QUIC connection's
// timeouts. Each daemon embeds them beside its own.
type DaemonFlags struct {
	CongestionFlags

	HTTPDListenOn  string
	HTTPDTokenFile string
	EnablePprof    bool
	QlogDir        string
	FEC            string

	IdleTimeout      time.Duration
	KeepAlivePeriod  time.Duration
	HandshakeTimeout time.Duration
	DrainTimeout     time.Duration
	TailProbes       int
	UDPIdleTimeout   time.Duration

	// ResumeWindow keeps tunnels resumable (pkg/resume; 0: off);
	// ResumeBufferMiB bounds what all of them hold for resending.
	ResumeWindow    time.Duration
	ResumeBufferMiB int64
}

// DefaultResumeBufferMiB is the default --resume-buffer-mib.
const DefaultResumeBufferMiB = 256

// maxResumeWindow bounds --resume-window: a parked tunnel holds its
// application's socket and its buffer for that long.
const maxResumeWindow = 24 * time.Hour

// DaemonDefaults are the defaults of DaemonFlags that belong to each daemon:
// its admin address, and what its own DefaultConfig holds.
type DaemonDefaults struct {
	HTTPDListenOn  string
	DrainTimeout   time.Duration
	TailProbes     int
	UDPIdleTimeout time.Duration
}

// NewDaemonFlags returns the defaults: the QUIC timeouts of
// transport.DefaultQUICOptions, the rest from def.
func NewDaemonFlags(def DaemonDefaults) DaemonFlags {
	q := transport.DefaultQUICOptions()
	return DaemonFlags{
		CongestionFlags:  NewCongestionFlags(),
		HTTPDListenOn:    def.HTTPDListenOn,
		IdleTimeout:      q.IdleTimeout,
		KeepAlivePeriod:  q.KeepAlivePeriod,
		HandshakeTimeout: q.HandshakeTimeout,
		DrainTimeout:     def.DrainTimeout,
		TailProbes:       def.TailProbes,
		UDPIdleTimeout:   def.UDPIdleTimeout,
		ResumeBufferMiB:  DefaultResumeBufferMiB,
	}
}

// DaemonHelp holds the help texts that differ between the daemons.
type DaemonHelp struct {
	FEC        string // --fec
	TailProbes string // --tail-probes: which direction's data they follow
}

// Flag groups of DaemonFlags, for the daemons' --help sections (each daemon
// adds its own flags to them; udp-idle-timeout and the congestion flags,
// CongestionFlagNames, are placed by each daemon).
var (
	AdminFlagNames    = []string{"httpd-listen-on", "httpd-token-file", "enable-pprof", "qlog-dir"}
	TimeoutFlagNames  = []string{"idle-timeout", "keepalive-period", "handshake-timeout", "drain-timeout"}
	RecoveryFlagNames = []string{"tail-probes", "fec", "resume-window", "resume-buffer-mib"}
)

// AddFlags binds the flags to fs.
func (d *DaemonFlags) AddFlags(fs *pflag.FlagSet, help DaemonHelp) {
	d.CongestionFlags.AddFlags(fs)
	fs.StringVar(&d.HTTPDListenOn, "httpd-listen-on", d.HTTPDListenOn, "admin HTTP address for /metrics, /healthz, /readyz, /tunnels, /connections; empty disables it")
	fs.StringVar(&d.HTTPDTokenFile, "httpd-token-file", d.HTTPDTokenFile, "bearer token file required by the admin API (mandatory when --httpd-listen-on is not loopback)")
	fs.BoolVar(&d.EnablePprof, "enable-pprof", d.EnablePprof, "serve /debug/pprof on the admin server")
	fs.StringVar(&d.QlogDir, "qlog-dir", d.QlogDir, "write a qlog file per QUIC connection into this directory (open them in qvis: https://qvis.quictools.info); costs throughput, off by default")
	fs.StringVar(&d.FEC, "fec", d.FEC, help.FEC)
	fs.DurationVar(&d.IdleTimeout, "idle-timeout", d.IdleTimeout, "close a QUIC connection after this long without packets; the longest blackout a tunnel survives (the smaller of both ends wins)")
	fs.DurationVar(&d.KeepAlivePeriod, "keepalive-period", d.KeepAlivePeriod, "send a keep-alive after this long without traffic (at most half of --idle-timeout); an idle connection sends nothing else, so keep it under the UDP timeout of NATs and firewalls on the path (often 30 s)")
	fs.DurationVar(&d.HandshakeTimeout, "handshake-timeout", d.HandshakeTimeout, "QUIC handshake idle timeout")
	fs.DurationVar(&d.DrainTimeout, "drain-timeout", d.DrainTimeout, "on SIGTERM, how long open tunnels may finish before they are closed")
	fs.IntVar(&d.TailProbes, "tail-probes", d.TailProbes, help.TailProbes)
	fs.DurationVar(&d.ResumeWindow, "resume-window", d.ResumeWindow, "keep a tunnel this long when the connection under it is lost (a blackout past --idle-timeout, a path change the rescue did not save), the application's socket open, so that the client re-attaches it on its next connection and no byte is lost or repeated; set it on both ends (the server holds a tunnel only for the identity that opened it); 0 turns resumable tunnels off; a reload (SIGHUP) applies it to tunnels opened afterwards")
	fs.Int64Var(&d.ResumeBufferMiB, "resume-buffer-mib", d.ResumeBufferMiB, "with --resume-window: the memory all resumable tunnels may hold for resending bytes the other end has not confirmed yet (each direction of a tunnel holds at most 4 MiB); a tunnel at either bound stops reading its application until bytes are confirmed, it never drops any")
	fs.DurationVar(&d.UDPIdleTimeout, "udp-idle-timeout", d.UDPIdleTimeout, "a UDP flow (on the client one application address of a udp: --forward or one destination of a SOCKS5 UDP association; on the server its socket to the destination) without a packet either way for this long is closed; the next packet opens a new one")
}

// Validate returns the problems with the flags.
func (d *DaemonFlags) Validate() []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if err := ValidateAdmin(d.HTTPDListenOn, d.HTTPDTokenFile); err != nil {
		errs = append(errs, err)
	}
	for _, v := range []struct {
		name string
		v    time.Duration
	}{{"idle-timeout", d.IdleTimeout}, {"handshake-timeout", d.HandshakeTimeout}, {"udp-idle-timeout", d.UDPIdleTimeout}} {
		if v.v <= 0 {
			add("--%s must be positive", v.name)
		}
	}
	if d.KeepAlivePeriod < 0 || d.DrainTimeout < 0 {
		add("--keepalive-period and --drain-timeout must not be negative")
	}
	// The default keep-alive is longer than a short --idle-timeout; quic-go
	// sends keep-alives at half the idle timeout then, so only a period the
	// user chose is checked.
	if d.KeepAlivePeriod >= d.IdleTimeout && d.IdleTimeout > 0 && d.KeepAlivePeriod != transport.DefaultQUICOptions().KeepAlivePeriod {
		add("--keepalive-period (%s) must be shorter than --idle-timeout (%s)", d.KeepAlivePeriod, d.IdleTimeout)
	}
	if d.ResumeWindow < 0 || d.ResumeWindow > maxResumeWindow {
		add("--resume-window must be 0 (off) .. %s", maxResumeWindow)
	}
	if d.ResumeBufferMiB < 1 || d.ResumeBufferMiB > 1<<20 {
		add("--resume-buffer-mib must be 1..1048576")
	}
	if d.TailProbes < 0 || d.TailProbes > 4 {
		add("--tail-probes must be 0..4")
	}
	if d.FEC != "" {
		if _, err := fec.ParseSpec(d.FEC); err != nil {
			add("--fec: %w", err)
		}
	}
	return append(errs, d.CongestionFlags.Validate()...)
}

// QUICOptions returns the QUIC options the (validated) flags set.
func (d *DaemonFlags) QUICOptions() transport.QUICOptions {
	q := transport.DefaultQUICOptions()
	q.IdleTimeout, q.KeepAlivePeriod, q.HandshakeTimeout = d.IdleTimeout, d.KeepAlivePeriod, d.HandshakeTimeout
	d.CongestionFlags.Apply(&q)
	return q
}

// FECLayer returns the forward error correction layer --fec asks for (nil
// when off), encoding toward every peer when encodeAll (the client).
func (d *DaemonFlags) FECLayer(encodeAll bool) (*fec.Layer, error) {
	if d.FEC == "" {
		return nil, nil
	}
	cfg, err := fec.ParseSpec(d.FEC)
	if err != nil {
		return nil, fmt.Errorf("--fec: %w", err)
	}
	cfg.EncodeAll = encodeAll
	l, err := fec.NewLayer(cfg)
	if err != nil {
		return nil, fmt.Errorf("--fec: %w", err)
	}
	return l, nil
}

// Cleanup runs cleanup functions in reverse order of Push, once: a daemon's
// Run pushes each resource as it acquires it and defers Run, so every return
// path releases exactly what was acquired.
type Cleanup struct{ fns []func() }

// Push adds f.
func (c *Cleanup) Push(f func()) { c.fns = append(c.fns, f) }

// Run calls the functions, last pushed first, and forgets them.
func (c *Cleanup) Run() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}

// Admin is a daemon's admin server: Start it once the handler's data sources
// exist; Stop shuts it down and returns its error.
type Admin struct {
	ln     net.Listener
	token  string
	cancel context.CancelFunc
	g      errgroup.Group
}

// OpenAdminServer reads the token file and opens the admin listener (nil
// Admin when address is empty). Push its Close on the daemon's Cleanup.
func OpenAdminServer(address, tokenFile string) (*Admin, error) {
	ln, token, err := OpenAdmin(address, tokenFile)
	if err != nil || ln == nil {
		return nil, err
	}
	return &Admin{ln: ln, token: token}, nil
}

// NewAdminServer is OpenAdminServer on a listener already open (an
// upgrade's inherited one).
func NewAdminServer(ln net.Listener, tokenFile string) (*Admin, error) {
	var token string
	if tokenFile != "" {
		b, err := ReadSecretFile("httpd-token-file", tokenFile, 16)
		if err != nil {
			return nil, err
		}
		token = string(b)
	}
	return &Admin{ln: ln, token: token}, nil
}

// Listener is the admin listener (nil for a nil Admin), for an upgrade's
// handover.
func (a *Admin) Listener() net.Listener {
	if a == nil {
		return nil
	}
	return a.ln
}

// Addrs is the admin listener's address (none for a nil Admin), for the
// server's list of its own listeners.
func (a *Admin) Addrs() []net.Addr {
	if a == nil {
		return nil
	}
	return []net.Addr{a.ln.Addr()}
}

// Close closes the listener of an Admin that was never started.
func (a *Admin) Close() {
	if a != nil && a.cancel == nil {
		_ = a.ln.Close()
	}
}

// Start serves o (its BearerToken and ListenAddr are filled in) until Stop;
// the server outlives ctx's cancellation, so /readyz reports the drain.
func (a *Admin) Start(ctx context.Context, o admin.Options) {
	if a == nil {
		return
	}
	o.BearerToken = a.token
	o.ListenAddr = a.ln.Addr()
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancel = cancel
	klog.FromContext(ctx).Info("Admin server listening", "address", a.ln.Addr().String())
	a.g.Go(func() error { return admin.Serve(actx, a.ln, admin.Handler(o)) })
}

// Stop shuts the admin server down and returns its error.
func (a *Admin) Stop() error {
	if a == nil || a.cancel == nil {
		return nil
	}
	a.cancel()
	return a.g.Wait()
}

// RunErr is the error a daemon's Run returns: err, or else the admin
// server's, with a cancellation (the normal stop) not an error.
func RunErr(err, adminErr error) error {
	if err == nil {
		err = adminErr
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
