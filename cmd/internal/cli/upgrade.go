package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/handover"
	"github.com/quictun/quictun/pkg/metrics"
)

// An upgrade (issue 34, parts 2 and 3): on SIGUSR2 a daemon starts the
// binary at its own path again (the upgraded file) with the same
// arguments and environment, and hands it, over an inherited socket pair
// (pkg/handover), its listening sockets; once the new process reports
// ready, the old one hands its service over (Upgradable.HandOver: its
// connections closed, its resumable tunnels sent) and exits. A new
// process that exits or does not report ready within UpgradeReadyTimeout
// is killed and the old one keeps serving.
const (
	UpgradeReadyTimeout = 30 * time.Second
	// handoverTimeout bounds sending the tunnels and the new process's
	// answer.
	handoverTimeout = time.Minute
)

// SockAdmin names the admin listener handed over.
const SockAdmin = "admin"

// Upgradable is a daemon's service an upgrade hands over
// (server.Server, client.Client).
type Upgradable interface {
	// HandOver stops the service (Run returns) and gives its resumable
	// tunnels to send; handover.ErrNotServing if Run had ended.
	HandOver(ctx context.Context, send handover.SendFunc) error
	// HandoverLimits bound what the new process takes.
	HandoverLimits() handover.Limits
	// Import continues the tunnels handed over and returns how many.
	Import(ctx context.Context, tunnels []handover.Tunnel) (int, error)
}

// EarlyUpgradable is an Upgradable whose old process tells the new one as
// soon as it no longer reads its sockets (the server): the new process
// serves them from then on, while it takes the tunnels.
type EarlyUpgradable interface {
	Upgradable
	// HandOverSteps is HandOver with each step told to the new process.
	HandOverSteps(ctx context.Context, steps handover.Steps) error
	// BeginImport makes a re-attachment that comes before its tunnel wait
	// for it until end is called.
	BeginImport() (end func())
	// ImportTunnel continues one tunnel handed over (as each arrives);
	// LoadUsage reads the accounting's totals the old process saved last.
	ImportTunnel(ctx context.Context, t handover.Tunnel) error
	LoadUsage(ctx context.Context)
}

// EachUpgradable is an Upgradable that hands each tunnel over as soon as
// it is exported and takes each as it arrives while it serves (the
// client): the new process re-attaches the first ones while the rest come.
type EachUpgradable interface {
	Upgradable
	// HandOverEach is HandOver with each tunnel sent as soon as it is
	// exported.
	HandOverEach(ctx context.Context, s handover.Sender) error
	// ImportTunnel continues one tunnel handed over (as each arrives).
	ImportTunnel(ctx context.Context, t handover.Tunnel) error
}

// Upgrade is what ServeUpgradable needs besides Serving.
type Upgrade struct {
	// Inherited is what the previous process handed over (nil: a normal
	// start).
	Inherited *Inherited
	Service   Upgradable
	// Sockets duplicates the listening sockets an upgrade hands over.
	Sockets func() ([]handover.Listener, error)
	// Connected, if set, runs in a new process beside Serve before it
	// reports ready and imports the tunnels, which then go to the running
	// service (the client: until its first connection to a server is up,
	// bounded). Without it the tunnels are imported before Serve (the
	// server, before Run).
	Connected func(ctx context.Context)
}

// Inherited are the sockets the previous process handed over (an upgrade);
// nil when the daemon was not started by one.
type Inherited struct {
	conn  *handover.Conn
	files map[string]*os.File
	// ready: the ready message was sent (awaitRelease); released: when
	// the old process released the sockets; endImport ends the service's
	// import (EarlyUpgradable.BeginImport).
	ready     bool
	released  time.Time
	endImport func()
	// gc: the collector's pacing, off from the ready message until the
	// tunnels were taken (sendReady, gcBackLater).
	gc *gcPause
	// memory: what the old process's heap objects and stacks hold
	// (envMemory; 0: not told); warmed: the bytes sendReady wrote for it
	// (warmMemory), in warmDuration.
	memory       int64
	warmed       int64
	warmDuration time.Duration
}

// TakeInherited receives the sockets of the process that started this one
// for an upgrade (nil, nil: a normal start).
func TakeInherited() (*Inherited, error) {
	hc, err := handover.FromEnv()
	if err != nil || hc == nil {
		return nil, err
	}
	_ = hc.SetDeadline(time.Now().Add(UpgradeReadyTimeout))
	ls, err := hc.RecvListeners()
	if err != nil {
		_ = hc.Close()
		return nil, fmt.Errorf("upgrade: receive the listening sockets: %w", err)
	}
	in := &Inherited{conn: hc, files: make(map[string]*os.File, len(ls)), memory: memoryFromEnv()}
	for _, l := range ls {
		if old := in.files[l.Name]; old != nil {
			_ = old.Close()
		}
		in.files[l.Name] = l.File
	}
	return in, nil
}

// Take returns the socket named name (nil: not handed over), which the
// caller then owns.
func (in *Inherited) Take(name string) *os.File {
	if in == nil {
		return nil
	}
	f := in.files[name]
	delete(in.files, name)
	return f
}

// TakePrefix returns the sockets whose names begin with prefix, by the
// rest of their names, which the caller then owns (nil: none).
func (in *Inherited) TakePrefix(prefix string) map[string]*os.File {
	if in == nil {
		return nil
	}
	var out map[string]*os.File
	for name, f := range in.files {
		if rest, ok := strings.CutPrefix(name, prefix); ok {
			if out == nil {
				out = map[string]*os.File{}
			}
			out[rest] = f
			delete(in.files, name)
		}
	}
	return out
}

// UDP is the inherited UDP socket named name (nil: none).
func (in *Inherited) UDP(name string) (*net.UDPConn, error) {
	f := in.Take(name)
	if f == nil {
		return nil, nil
	}
	pc, err := net.FilePacketConn(f)
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("upgrade: %s socket: %w", name, err)
	}
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		_ = pc.Close()
		return nil, fmt.Errorf("upgrade: the %s socket handed over is a %T", name, pc)
	}
	return uc, nil
}

// Listener is the inherited listener named name (nil: none). A UNIX
// listener removes its socket file when it is closed, as one this
// process opened would.
func (in *Inherited) Listener(name string) (net.Listener, error) {
	f := in.Take(name)
	if f == nil {
		return nil, nil
	}
	ln, err := net.FileListener(f)
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("upgrade: %s listener: %w", name, err)
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(true)
	}
	return ln, nil
}

// Close closes what was not taken, and the handover socket.
func (in *Inherited) Close() {
	if in == nil {
		return
	}
	for _, f := range in.files {
		_ = f.Close()
	}
	_ = in.conn.Close()
}

// OpenAdminInherited opens the admin listener on address, or takes the one
// handed over (closed if address is "" now).
func OpenAdminInherited(in *Inherited, address, tokenFile string) (*Admin, error) {
	ln, err := in.Listener(SockAdmin)
	if err != nil {
		return nil, err
	}
	if ln != nil {
		if address == "" {
			_ = ln.Close()
			return nil, nil
		}
		return NewAdminServer(ln, tokenFile)
	}
	return OpenAdminServer(address, tokenFile)
}

// NamedSocket is a socket an upgrade hands over under Name: a
// *net.UDPConn or a net.Listener (nil: left out).
type NamedSocket struct {
	Name   string
	Socket any
}

// DupSockets duplicates the sockets an upgrade hands over (the caller
// closes the files).
func DupSockets(ss []NamedSocket) ([]handover.Listener, error) {
	var ls []handover.Listener
	for _, s := range ss {
		if s.Socket == nil || s.Socket == net.Listener(nil) {
			continue
		}
		fc, ok := s.Socket.(interface{ File() (*os.File, error) })
		var f *os.File
		err := fmt.Errorf("upgrade: cannot hand over a %T", s.Socket)
		if ok {
			f, err = fc.File()
		}
		if err != nil {
			for _, l := range ls {
				_ = l.File.Close()
			}
			return nil, err
		}
		ls = append(ls, handover.Listener{Name: s.Name, File: f})
	}
	return ls, nil
}

// ServeUpgradable takes the tunnels an upgrade handed over (u.Inherited) or
// tells systemd the daemon is ready, and serves s with the SIGUSR2 upgrade
// watch beside it.
func (d *DaemonFlags) ServeUpgradable(ctx context.Context, s Serving, u Upgrade) error {
	upm := metrics.NewUpgrade(s.Metrics, s.Side)
	logger := klog.FromContext(ctx)
	up := &upgrader{exe: executable, args: os.Args[1:], side: s.Side, srv: u.Service, metrics: upm, sockets: u.Sockets}
	sigs := notifyUpgrades()
	uctx, stopUpgrades := context.WithCancel(ctx)
	upgraded := make(chan struct{})
	switch {
	case u.Inherited == nil:
		if err := SdNotify("READY=1"); err != nil {
			logger.V(2).Info("Could not tell systemd the daemon is ready", "err", err)
		}
		go func() { defer close(upgraded); up.watch(uctx, sigs) }()
	case u.Connected == nil:
		early, err := u.Inherited.awaitRelease(ctx, u.Service)
		if err == nil && early == nil {
			err = u.Inherited.finish(ctx, u.Service, upm)
		}
		if err != nil {
			signal.Stop(sigs)
			stopUpgrades()
			return err
		}
		go func() {
			defer close(upgraded)
			if early != nil {
				// Serve runs meanwhile: the socket is ours already.
				u.Inherited.finishEarly(uctx, early, upm)
			}
			up.watch(uctx, sigs)
		}()
	default:
		go func() {
			defer close(upgraded)
			u.Connected(uctx)
			if uctx.Err() != nil {
				signal.Stop(sigs)
				return // Serve ended: no ready, the previous process keeps serving
			}
			if err := u.Inherited.finishServing(uctx, u.Service, upm); err != nil {
				// The previous process kills this one when it sees no ready.
				signal.Stop(sigs)
				logger.Error(err, "Upgrade: could not take over from the previous process")
				return
			}
			up.watch(uctx, sigs)
		}()
	}
	err := d.Serve(ctx, s)
	stopUpgrades()
	<-upgraded
	return err
}

// awaitRelease reports ready and, for an EarlyUpgradable service, reads
// whether the old process released its sockets before the tunnels come
// (early: the service, marked as importing; nil: take the tunnels before
// serving, finish).
func (in *Inherited) awaitRelease(ctx context.Context, srv Upgradable) (EarlyUpgradable, error) {
	es, ok := srv.(EarlyUpgradable)
	if !ok {
		return nil, nil
	}
	hc := in.conn
	if err := in.sendReady(); err != nil {
		return nil, err
	}
	_ = hc.SetDeadline(time.Now().Add(handoverTimeout))
	released, err := hc.RecvReleased()
	if err != nil || !released {
		return nil, nil // finish takes it from here (and reports what failed)
	}
	klog.FromContext(ctx).Info("Upgrade: the previous process released the sockets; serving while its tunnels come")
	in.released = time.Now()
	in.endImport = es.BeginImport()
	return es, nil
}

// finishEarly takes the tunnels over while the service runs (after
// awaitRelease): it imports them as they come, ends the import (the
// re-attachments waiting for it go on), reads the accounting's totals
// once the old process saved them, and answers it. A failure is logged:
// the new process serves anyway.
func (in *Inherited) finishEarly(ctx context.Context, srv EarlyUpgradable, m *metrics.Upgrade) {
	logger := klog.FromContext(ctx)
	hc := in.conn
	defer in.endImport()
	stop := context.AfterFunc(ctx, func() { _ = hc.SetDeadline(time.Now()) }) // Serve ended: stop waiting
	defer stop()
	// Each tunnel is imported as it arrives: its client's re-attachment,
	// which may be waiting for it already, goes on while the next come.
	// The loop yields after each: with one P (a daemon pinned to one CPU)
	// its syscalls rarely block, and the goroutines serving the clients'
	// handshakes and re-attachments would wait for preemption (10 ms).
	n, got, ierr, err := in.importEach(ctx, srv.HandoverLimits(), true, srv.ImportTunnel)
	in.endImport()
	imported := time.Since(in.released)
	countImported(logger, m, n, got, ierr)
	if err != nil {
		in.importFailed(logger, m, n, err)
		return
	}
	if err := hc.RecvSaved(); err != nil {
		logger.Error(err, "Upgrade: the previous process did not say it saved the accounting's totals; reading them as they are")
	}
	srv.LoadUsage(ctx)
	in.answer(logger, n, ierr, m, "imported", imported.Round(100*time.Microsecond),
		"usageLoaded", time.Since(in.released).Round(100*time.Microsecond))
}

// importEach receives the tunnels the previous process sends and imports
// each with take as it arrives, yielding after each when yield is set (see
// finishEarly). It returns how many it took of the got it received, their
// import errors joined, and the receipt's error.
func (in *Inherited) importEach(ctx context.Context, limits handover.Limits, yield bool,
	take func(context.Context, handover.Tunnel) error) (n, got int, ierr, err error) {
	var errs []error
	got, err = in.conn.RecvTunnelsEach(limits, func(t handover.Tunnel) {
		if yield {
			defer runtime.Gosched()
		}
		if err := take(ctx, t); err != nil {
			errs = append(errs, err)
			return
		}
		n++
	})
	return n, got, errors.Join(errs...), err
}

// importFailed ends an import whose receipt failed (err) after n tunnels:
// the new process serves with those, and tells the previous one so.
func (in *Inherited) importFailed(logger klog.Logger, m *metrics.Upgrade, n int, err error) {
	logger.Error(err, "Upgrade: could not take all the tunnels of the previous process; serving with those it took", "tunnels", n)
	_ = in.conn.SendDone(n, err.Error())
	m.Upgrades.WithLabelValues(metrics.UpgradeSucceeded).Inc()
	in.gcBackLater(logger)
}

// answer tells systemd this is the main process now (NotifyAccess=all)
// and answers the old process, which exits.
func (in *Inherited) answer(logger klog.Logger, n int, ierr error, m *metrics.Upgrade, kv ...any) {
	if err := SdNotify("MAINPID=" + strconv.Itoa(os.Getpid()) + "\nREADY=1"); err != nil {
		logger.Error(err, "Upgrade: could not tell systemd the new main PID")
	}
	text := ""
	if ierr != nil {
		text = ierr.Error()
	}
	if err := in.conn.SendDone(n, text); err != nil {
		logger.Error(err, "Upgrade: could not answer the previous process")
	}
	m.Upgrades.WithLabelValues(metrics.UpgradeSucceeded).Inc()
	kv = append(kv, "memoryWarmed", in.warmed, "warmDuration", in.warmDuration.Round(100*time.Microsecond))
	logger.Info("Upgrade: serving as the new process", append([]any{"pid", os.Getpid(), "tunnels", n}, kv...)...)
	in.gcBackLater(logger)
}

// gcPauseGrace is how long the collector's pacing stays off once the
// tunnels were taken: their re-attachments, which come meanwhile or in the
// round trips after, are served first.
const gcPauseGrace = time.Second

// sendReady tells the old process this one is ready (it then hands its
// service over); from then on until gcBackLater the collector's pacing is
// off (pauseGC). Before, it writes about the memory the old process holds
// (warmMemory), so that taking the tunnels over does not fault it in.
func (in *Inherited) sendReady() error {
	in.gc = pauseGC()
	start := time.Now()
	in.warmed = in.gc.warm(in.memory)
	in.warmDuration = time.Since(start)
	if err := in.conn.SendReady(os.Getpid()); err != nil {
		in.gc.restore()
		return fmt.Errorf("upgrade: report ready: %w", err)
	}
	in.ready = true
	return nil
}

// gcBackLater gives the collector its pacing back gcPauseGrace from now.
func (in *Inherited) gcBackLater(logger klog.Logger) {
	if g := in.gc; g != nil {
		time.AfterFunc(gcPauseGrace, func() {
			logger.V(2).Info("Upgrade: the garbage collector paces itself again", "cyclesWhileOff", g.restore())
		})
	}
}

// finish takes the tunnels over once the service is built: it reports
// ready (the old process then hands its service over and sends them),
// imports them, tells systemd this is the main process now
// (NotifyAccess=all) and answers the old process, which exits. A failure
// to take the tunnels is logged: the new process serves anyway (the old
// one has let go).
func (in *Inherited) finish(ctx context.Context, srv Upgradable, m *metrics.Upgrade) error {
	logger := klog.FromContext(ctx)
	hc := in.conn
	if !in.ready {
		if err := in.sendReady(); err != nil {
			return err
		}
		_ = hc.SetDeadline(time.Now().Add(handoverTimeout))
	}
	ts, err := hc.RecvTunnels(srv.HandoverLimits())
	if err != nil {
		logger.Error(err, "Upgrade: could not take the tunnels of the previous process; serving without them")
		_ = hc.SendDone(0, err.Error())
		m.Upgrades.WithLabelValues(metrics.UpgradeSucceeded).Inc()
		in.gcBackLater(logger)
		return nil
	}
	n, ierr := srv.Import(ctx, ts)
	countImported(logger, m, n, len(ts), ierr)
	in.answer(logger, n, ierr, m)
	return nil
}

// finishServing is finish for a service that serves already (the
// client's, once connected): an EachUpgradable one takes each tunnel as
// it arrives (its re-attachment starts while the next ones come).
func (in *Inherited) finishServing(ctx context.Context, srv Upgradable, m *metrics.Upgrade) error {
	es, ok := srv.(EachUpgradable)
	if !ok {
		return in.finish(ctx, srv, m)
	}
	logger := klog.FromContext(ctx)
	hc := in.conn
	if err := in.sendReady(); err != nil {
		return err
	}
	_ = hc.SetDeadline(time.Now().Add(handoverTimeout))
	n, got, ierr, err := in.importEach(ctx, srv.HandoverLimits(), false, es.ImportTunnel)
	countImported(logger, m, n, got, ierr)
	if err != nil {
		in.importFailed(logger, m, n, err)
		return nil
	}
	in.answer(logger, n, ierr, m)
	return nil
}

// countImported counts the tunnels an upgrade took (n of got) and those it
// refused, and logs why it refused them (ierr: their errors, joined).
func countImported(logger klog.Logger, m *metrics.Upgrade, n, got int, ierr error) {
	m.Tunnels.WithLabelValues(metrics.UpgradeImported).Add(float64(n))
	m.Tunnels.WithLabelValues(metrics.UpgradeRefused).Add(float64(got - n))
	if ierr != nil {
		logger.Error(ierr, "Upgrade: some tunnels of the previous process could not be continued; they were reset", "refused", got-n)
	}
}

// executable is the path this binary was started from, read when the
// process started (before an upgrade replaces the file): an upgrade starts
// the file now at that path.
var executable = func() string {
	p, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return p
}()

// upgrader starts the new process on SIGUSR2 and hands the service over.
type upgrader struct {
	exe     string
	args    []string
	side    string
	srv     Upgradable
	sockets func() ([]handover.Listener, error) // duplicates of the listening sockets
	metrics *metrics.Upgrade
	// childReleases: the new binary reads the released and saved
	// messages (childFeatures), set at each upgrade before it starts.
	childReleases bool
}

// featureReleased is the handover feature of a binary that reads the
// released and saved messages (2026-11-29 on).
const featureReleased = "released"

// handoverFeaturesCommand is the hidden subcommand an upgrading process
// runs the new binary with to learn which handover messages it reads
// (one per line): an older binary, without it, fails, and is handed over
// the way it expects.
const handoverFeaturesCommand = "handover-features"

func newHandoverFeaturesCommand() *cobra.Command {
	return &cobra.Command{
		Use: handoverFeaturesCommand, Short: "Print the upgrade handover messages this binary reads", Args: NoArgs, Hidden: true,
		Run: func(c *cobra.Command, _ []string) { _, _ = fmt.Fprintln(c.OutOrStdout(), featureReleased) },
	}
}

// featuresTimeout bounds childFeatures.
const featuresTimeout = 10 * time.Second

// childFeatures runs exe's handover-features subcommand: the handover
// messages it reads beyond the tunnels (none for a binary without it, or
// one that fails).
func childFeatures(ctx context.Context, exe string) map[string]bool {
	ctx, cancel := context.WithTimeout(ctx, featuresTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, exe, handoverFeaturesCommand).Output() //nolint:gosec // our own binary at the path it was started from
	feats := map[string]bool{}
	if err != nil {
		return feats
	}
	for _, f := range strings.Fields(string(out)) {
		feats[f] = true
	}
	return feats
}

// notifyUpgrades catches the upgrade signal from now on (nil: no upgrades
// on this platform, pkg/handover is Linux only): one that comes while the
// daemon starts, or while it takes over from its predecessor, waits for
// watch instead of ending the process (the signal's default action).
func notifyUpgrades() chan os.Signal {
	if len(upgradeSignals) == 0 {
		return nil
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, upgradeSignals...)
	return sigs
}

// watch upgrades on sigs (notifyUpgrades) until ctx is done or an upgrade
// went through; then it stops catching them.
func (u *upgrader) watch(ctx context.Context, sigs chan os.Signal) {
	logger := klog.FromContext(ctx)
	if sigs == nil {
		return
	}
	defer signal.Stop(sigs)
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		}
		logger.Info("Received SIGUSR2; upgrading: starting the new binary", "path", u.exe)
		committed, err := u.upgrade(ctx, logger)
		switch {
		case committed:
			// Run has ended; a handover that failed after the old process
			// let go is Run's error (logged as the exit reason, exit 1).
			return
		case err != nil:
			u.metrics.Upgrades.WithLabelValues(metrics.UpgradeFailed).Inc()
			logger.Error(err, "Upgrade failed; still serving. Check the new binary (run it with --check-config) and send SIGUSR2 again", "path", u.exe)
		}
	}
}

// upgrade starts the new process and, once it reports ready, hands the
// service over (committed: the old process then stops serving).
func (u *upgrader) upgrade(ctx context.Context, logger klog.Logger) (committed bool, err error) {
	ls, err := u.sockets()
	defer func() {
		for _, l := range ls {
			_ = l.File.Close()
		}
	}()
	if err != nil {
		return false, err
	}
	u.childReleases = childFeatures(ctx, u.exe)[featureReleased]
	parent, cmd, exited, err := u.start()
	if err != nil {
		return false, err
	}
	defer func() { _ = parent.Close() }()
	deadline := time.Now().Add(UpgradeReadyTimeout)
	_ = parent.SetDeadline(deadline)
	pid := 0
	if err = parent.SendListeners(ls); err == nil {
		pid, err = parent.WaitReady(deadline)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return false, fmt.Errorf("the new process (pid %d) did not report ready within %s: %w (%s)", cmd.Process.Pid, UpgradeReadyTimeout, err, cmd.ProcessState)
	}
	logger.Info("Upgrade: the new process is ready; handing the "+u.side+" over", "pid", pid)
	err = u.handOver(ctx, logger, parent, pid)
	if errors.Is(err, handover.ErrNotServing) {
		_ = cmd.Process.Kill()
		<-exited
		return false, err
	}
	return true, err
}

// handOver hands the service over to the new process (pid) on parent:
// an EarlyUpgradable one tells it first when it released its sockets,
// and when it saved its accounting's totals after the tunnels, if the new
// binary reads those messages (childFeatures; an older one gets the
// sequence it knows: the tunnels, then it serves).
func (u *upgrader) handOver(ctx context.Context, logger klog.Logger, parent *handover.Conn, pid int) error {
	sent := 0
	wait := func() error {
		n, err := parent.WaitDone(time.Now().Add(handoverTimeout))
		logger.Info("Upgrade: the new process took the tunnels", "pid", pid, "tunnels", n, "sent", sent)
		return err
	}
	_ = parent.SetDeadline(time.Now().Add(handoverTimeout))
	send := func(ts []handover.Tunnel) error {
		sent = len(ts)
		return parent.SendTunnels(ts)
	}
	if eu, ok := u.srv.(EachUpgradable); ok {
		return eu.HandOverEach(ctx, handover.Sender{
			Tunnel: func(t *handover.Tunnel) error { sent++; return parent.SendTunnel(t) },
			End: func(n int) error {
				if err := parent.SendEnd(n); err != nil {
					return err
				}
				return wait()
			},
		})
	}
	es, ok := u.srv.(EarlyUpgradable)
	if ok && !u.childReleases {
		logger.Info("Upgrade: the new binary does not read the released message (an older build); it takes the tunnels before it serves")
	}
	if !ok || !u.childReleases {
		return u.srv.HandOver(ctx, func(ts []handover.Tunnel) error {
			if err := send(ts); err != nil {
				return err
			}
			return wait()
		})
	}
	return es.HandOverSteps(ctx, handover.Steps{
		Released: parent.SendReleased,
		Send:     send,
		Saved: func() error {
			if err := parent.SendSaved(); err != nil {
				return err
			}
			return wait()
		},
	})
}

// start starts the new process with the child's end of a handover pair;
// exited is closed once it exited (after our exit, when it took over).
func (u *upgrader) start() (*handover.Conn, *exec.Cmd, <-chan struct{}, error) {
	parent, child, err := handover.Pair()
	if err != nil {
		return nil, nil, nil, err
	}
	cmd := exec.Command(u.exe, u.args...)               //nolint:gosec // our own binary at the path it was started from, with our own arguments
	cmd.Env = append(os.Environ(), handover.EnvFD+"=3", // ExtraFiles[0] is descriptor 3
		envMemory+"="+strconv.FormatInt(heldMemory(), 10))
	cmd.ExtraFiles = []*os.File{child}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err = cmd.Start()
	_ = child.Close()
	if err != nil {
		_ = parent.Close()
		return nil, nil, nil, fmt.Errorf("start %s: %w", u.exe, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	return parent, cmd, exited, nil
}
