package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/pkg/handover"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/server"
)

// An upgrade (issue 34, part 2): on SIGUSR2 the server starts the binary
// at its own path again (the upgraded file) with the same arguments and
// environment, and hands it, over an inherited socket pair
// (pkg/handover), its listening sockets; once the new process reports
// ready, the old one closes its connections (clients reconnect and
// re-attach at once), hands over its resumable tunnels and exits. A new
// process that exits or does not report ready within upgradeReadyTimeout
// is killed and the old one keeps serving.
const (
	upgradeReadyTimeout = 30 * time.Second
	// handoverTimeout bounds sending the tunnels and the new process's
	// answer.
	handoverTimeout = time.Minute
)

// Names of the sockets handed over.
const (
	sockUDP   = "udp"
	sockTCP   = "tcp"
	sockAdmin = "admin"
)

// inherited are the sockets the previous process handed over (an upgrade);
// nil when the server was not started by one.
type inherited struct {
	conn  *handover.Conn
	files map[string]*os.File
}

// takeInherited receives the sockets of the process that started this one
// for an upgrade (nil, nil: a normal start).
func takeInherited() (*inherited, error) {
	hc, err := handover.FromEnv()
	if err != nil || hc == nil {
		return nil, err
	}
	_ = hc.SetDeadline(time.Now().Add(upgradeReadyTimeout))
	ls, err := hc.RecvListeners()
	if err != nil {
		_ = hc.Close()
		return nil, fmt.Errorf("upgrade: receive the listening sockets: %w", err)
	}
	in := &inherited{conn: hc, files: make(map[string]*os.File, len(ls))}
	for _, l := range ls {
		if old := in.files[l.Name]; old != nil {
			_ = old.Close()
		}
		in.files[l.Name] = l.File
	}
	return in, nil
}

// take returns the socket named name (nil: not handed over), which the
// caller then owns.
func (in *inherited) take(name string) *os.File {
	if in == nil {
		return nil
	}
	f := in.files[name]
	delete(in.files, name)
	return f
}

// udp is the inherited UDP socket (nil: none).
func (in *inherited) udp() (*net.UDPConn, error) {
	f := in.take(sockUDP)
	if f == nil {
		return nil, nil
	}
	pc, err := net.FilePacketConn(f)
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("upgrade: UDP socket: %w", err)
	}
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		_ = pc.Close()
		return nil, fmt.Errorf("upgrade: the UDP socket handed over is a %T", pc)
	}
	return uc, nil
}

// listener is the inherited listener named name (nil: none).
func (in *inherited) listener(name string) (net.Listener, error) {
	f := in.take(name)
	if f == nil {
		return nil, nil
	}
	ln, err := net.FileListener(f)
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("upgrade: %s listener: %w", name, err)
	}
	return ln, nil
}

// close closes what was not taken, and the handover socket.
func (in *inherited) close() {
	if in == nil {
		return
	}
	for _, f := range in.files {
		_ = f.Close()
	}
	_ = in.conn.Close()
}

// finish takes the tunnels over once srv is built: it reports ready (the
// old process then closes its connections and sends them), imports them,
// tells systemd this is the main process now (NotifyAccess=all) and
// answers the old process, which exits. A failure to take the tunnels is
// logged: the new process serves anyway (the old one has let go).
func (in *inherited) finish(ctx context.Context, srv *server.Server, m *metrics.Upgrade) error {
	logger := klog.FromContext(ctx)
	hc := in.conn
	if err := hc.SendReady(os.Getpid()); err != nil {
		return fmt.Errorf("upgrade: report ready: %w", err)
	}
	_ = hc.SetDeadline(time.Now().Add(handoverTimeout))
	ts, err := hc.RecvTunnels(srv.HandoverLimits())
	if err != nil {
		logger.Error(err, "Upgrade: could not take the tunnels of the previous process; serving without them")
		_ = hc.SendDone(0, err.Error())
		m.Upgrades.WithLabelValues(metrics.UpgradeSucceeded).Inc()
		return nil
	}
	n, ierr := srv.Import(ctx, ts)
	m.Tunnels.WithLabelValues(metrics.UpgradeImported).Add(float64(n))
	m.Tunnels.WithLabelValues(metrics.UpgradeRefused).Add(float64(len(ts) - n))
	if ierr != nil {
		logger.Error(ierr, "Upgrade: some tunnels of the previous process could not be continued; they were reset", "refused", len(ts)-n)
	}
	if err := cli.SdNotify("MAINPID=" + strconv.Itoa(os.Getpid()) + "\nREADY=1"); err != nil {
		logger.Error(err, "Upgrade: could not tell systemd the new main PID")
	}
	text := ""
	if ierr != nil {
		text = ierr.Error()
	}
	if err := hc.SendDone(n, text); err != nil {
		logger.Error(err, "Upgrade: could not answer the previous process")
	}
	m.Upgrades.WithLabelValues(metrics.UpgradeSucceeded).Inc()
	logger.Info("Upgrade: serving as the new process", "pid", os.Getpid(), "tunnels", n)
	return nil
}

// upgrader starts the new process on SIGUSR2 and hands the server over.
type upgrader struct {
	exe     string
	args    []string
	srv     *server.Server
	sockets func() ([]handover.Listener, error) // duplicates of the listening sockets
	metrics *metrics.Upgrade
}

// watch upgrades on SIGUSR2 until ctx is done or an upgrade went through.
func (u *upgrader) watch(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if len(upgradeSignals) == 0 {
		return // no upgrades on this platform (pkg/handover is Linux only)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, upgradeSignals...)
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
// server over (committed: the old process then stops serving).
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
	parent, child, err := handover.Pair()
	if err != nil {
		return false, err
	}
	defer func() { _ = parent.Close() }()
	cmd := exec.Command(u.exe, u.args...)               //nolint:gosec // our own binary at the path it was started from, with our own arguments
	cmd.Env = append(os.Environ(), handover.EnvFD+"=3") // ExtraFiles[0] is descriptor 3
	cmd.ExtraFiles = []*os.File{child}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err = cmd.Start()
	_ = child.Close()
	if err != nil {
		return false, fmt.Errorf("start %s: %w", u.exe, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // ends with the child (after our exit, when it took over)
	deadline := time.Now().Add(upgradeReadyTimeout)
	_ = parent.SetDeadline(deadline)
	pid := 0
	if err = parent.SendListeners(ls); err == nil {
		pid, err = parent.WaitReady(deadline)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return false, fmt.Errorf("the new process (pid %d) did not report ready within %s: %w (%s)", cmd.Process.Pid, upgradeReadyTimeout, err, cmd.ProcessState)
	}
	logger.Info("Upgrade: the new process is ready; handing the server over", "pid", pid)
	err = u.srv.HandOver(ctx, func(ts []handover.Tunnel) error {
		_ = parent.SetDeadline(time.Now().Add(handoverTimeout))
		if err := parent.SendTunnels(ts); err != nil {
			return err
		}
		n, err := parent.WaitDone(time.Now().Add(handoverTimeout))
		logger.Info("Upgrade: the new process took the tunnels", "pid", pid, "tunnels", n, "sent", len(ts))
		return err
	})
	if errors.Is(err, server.ErrNotServing) {
		_ = cmd.Process.Kill()
		<-exited
		return false, err
	}
	return true, err
}

// fileOf duplicates the descriptor of a socket (*net.UDPConn,
// *net.TCPListener).
func fileOf(c any) (*os.File, error) {
	f, ok := c.(interface{ File() (*os.File, error) })
	if !ok {
		return nil, fmt.Errorf("upgrade: cannot hand over a %T", c)
	}
	return f.File()
}
