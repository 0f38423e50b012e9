package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/quictun/quictun/tools/linkem/netns"
)

// The resume scenario (issue 34): tunnels that outlive the connection under
// them (--resume-window on both daemons), through the built binaries on the
// emulated link: the server and the client upgraded (SIGUSR2) under the
// load of many interactive tunnels, a blackout longer than the idle
// timeout, and a client address change with the old address gone, each
// with an interactive session and a transfer each way running. Direct TCP
// and kcptun cannot keep a connection across any of these (a TCP
// connection dies with its endpoint process, and with its path past the
// retransmission limit), so only the quictun variants run it, with daemons
// of the scenario's own.

// Resume case IDs (ResumeSpec.Cases, bench run --resume-cases).
const (
	ResumeServerUpgrade = "server-upgrade"
	ResumeClientUpgrade = "client-upgrade"
	// ResumeUpgradeTransfer is a server upgrade during the session and the
	// transfer of the outage cases.
	ResumeUpgradeTransfer = "server-upgrade-transfer"
	ResumeBlackout        = "blackout"
	ResumeAddrChange      = "address-change"
)

// ResumeCases lists the resume case IDs in their order.
func ResumeCases() []string {
	return []string{ResumeServerUpgrade, ResumeClientUpgrade, ResumeUpgradeTransfer, ResumeBlackout, ResumeAddrChange}
}

// withTransfer reports whether case c runs a session and a transfer
// (resumeSurviveOne) rather than the upgrade load.
func withTransfer(c string) bool {
	return c == ResumeUpgradeTransfer || c == ResumeBlackout || c == ResumeAddrChange
}

// ResumeSpec sizes the resume scenario.
type ResumeSpec struct {
	// Cases run in this order (ResumeCases); Reps times each (0: the
	// profile's repetitions).
	Cases []string
	Reps  int
	// Window is both daemons' --resume-window.
	Window time.Duration
	// The upgrade cases, on Link: Tunnels tunnels, each a round trip of
	// Size bytes through the echo then a pause drawn from [PauseMin,
	// PauseMax]; the signal after Warmup of load, the load going on for
	// After from it.
	Link               LinkSpec
	Tunnels, Size      int
	PauseMin, PauseMax time.Duration
	Warmup, After      time.Duration
	// The blackout, address-change and upgrade-with-transfer cases, on
	// TransferLink: one interactive session (Size, pauses as above) and one
	// transfer of Transfer bytes each way through the echo; after
	// TransferWarmup the link is cut for Blackout (both daemons with
	// --idle-timeout IdleTimeout; 0: their default, 90 s), the client's
	// address changes, or the server is upgraded. Recovery bounds the wait for both to move again, from the
	// link's return; TransferLimit the transfer, from its start.
	TransferLink LinkSpec
	Transfer     int64
	// TransferDown downloads Transfer bytes from the sink instead of
	// sending them each way through the echo.
	TransferDown   bool
	TransferWarmup time.Duration
	Blackout       time.Duration
	IdleTimeout    time.Duration
	Recovery       time.Duration
	TransferLimit  time.Duration
}

// Validate checks the spec (a profile's, or one changed by flags).
func (s ResumeSpec) Validate() error {
	var errs []error
	for _, c := range s.Cases {
		if !slices.Contains(ResumeCases(), c) {
			errs = append(errs, fmt.Errorf("resume case %q: want one of %s", c, strings.Join(ResumeCases(), ", ")))
		}
	}
	if s.Tunnels < 1 || s.Size < 1 || s.PauseMin < 0 || s.PauseMax < s.PauseMin {
		errs = append(errs, fmt.Errorf("resume load: want at least 1 tunnel of at least 1 B and 0 <= pause min <= pause max (got %d, %d B, %v-%v)",
			s.Tunnels, s.Size, s.PauseMin, s.PauseMax))
	}
	if slices.Contains(s.Cases, ResumeBlackout) {
		if s.Blackout <= 0 {
			errs = append(errs, errors.New("resume blackout: want a positive duration"))
		}
		if s.Window < s.Blackout+s.Recovery {
			errs = append(errs, fmt.Errorf("resume window %v: shorter than the blackout %v plus the recovery %v", s.Window, s.Blackout, s.Recovery))
		}
	}
	if s.Transfer < 1 && slices.ContainsFunc(s.Cases, withTransfer) {
		errs = append(errs, errors.New("resume transfer: want at least 1 byte"))
	}
	return errors.Join(errs...)
}

// resumeCaseLabel is the report's case of a resume sample.
func resumeCaseLabel(s ResumeSpec, c string) string {
	switch c {
	case ResumeServerUpgrade:
		return fmt.Sprintf("server upgrade (SIGUSR2), %d tunnels, pauses %v-%v", s.Tunnels, s.PauseMin, s.PauseMax)
	case ResumeClientUpgrade:
		return fmt.Sprintf("client upgrade (SIGUSR2), %d tunnels, pauses %v-%v", s.Tunnels, s.PauseMin, s.PauseMax)
	case ResumeUpgradeTransfer:
		return "server upgrade (SIGUSR2), session + " + transferLabel(s)
	case ResumeBlackout:
		idle := "90s default"
		if s.IdleTimeout > 0 {
			idle = s.IdleTimeout.String()
		}
		return fmt.Sprintf("blackout %v (idle timeout %s), session + %s", s.Blackout, idle, transferLabel(s))
	case ResumeAddrChange:
		return "client address change, old address removed, session + " + transferLabel(s)
	}
	return c
}

// transferLabel names the transfer of the outage cases.
func transferLabel(s ResumeSpec) string {
	if s.TransferDown {
		return sizeLabel(s.Transfer) + " down"
	}
	return sizeLabel(s.Transfer) + " each way"
}

// sizeLabel writes n bytes as GB, MB or B.
func sizeLabel(n int64) string {
	switch {
	case n >= 1e9 && n%1e8 == 0:
		return strconv.FormatFloat(float64(n)/1e9, 'g', -1, 64) + " GB"
	case n >= 1e6 && n%1e5 == 0:
		return strconv.FormatFloat(float64(n)/1e6, 'g', -1, 64) + " MB"
	}
	return strconv.FormatInt(n, 10) + " B"
}

// Ports of the resume scenario's daemons (instance k adds 10*k; its UDP
// port adds k).
const (
	rsUDPPort      = 7700
	rsServerAdmin  = 8290
	rsClientAdmin  = 8291
	rsClientListen = 6700
	rsClientSink   = 6701
)

// resume runs the cases for every quictun variant.
func (r *Runner) resume(ctx context.Context) error {
	s := r.prof.Resume
	reps := s.Reps
	if reps == 0 {
		reps = r.prof.Reps
	}
	for rep := range reps {
		for _, v := range r.ordered(rep) {
			q, ok := v.(*quictun)
			if !ok {
				continue // direct TCP and kcptun cannot resume; SOCKS5 rides on quictun
			}
			for _, c := range s.Cases {
				if ctx.Err() != nil {
					return nil
				}
				switch c {
				case ResumeServerUpgrade, ResumeClientUpgrade:
					r.setLink(ctx, s.Link)
					r.resumeUpgradeOne(ctx, q, rep, c)
				default:
					r.setLink(ctx, s.TransferLink)
					r.resumeSurviveOne(ctx, q, rep, c)
				}
			}
		}
	}
	return nil
}

// rsSetup is one resume sample's daemons.
type rsSetup struct {
	server, client       *Proc
	serverLog, clientLog string
	local, sink          string
	serverAdmin          string
	clientAdmin          string
	// adopted are upgraded processes: not the harness's children, in the
	// process group of the one they replaced.
	adopted []int
}

// stop ends the daemons, the upgraded ones too (Proc.Stop signals the
// process group, which they are in, but waits for its own process only).
func (s *rsSetup) stop() {
	for _, p := range []*Proc{s.client, s.server} {
		if p != nil {
			p.Stop(5 * time.Second)
		}
	}
	for _, pid := range s.adopted {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		if !waitGone(pid, 5*time.Second) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			waitGone(pid, 5*time.Second)
		}
	}
}

// startResume starts a server and a client of the scenario's own, both with
// --resume-window and extra flags; the client forwards its listener to the
// echo server, and a second one (--forward) to the sink.
func (r *Runner) startResume(ctx context.Context, q *quictun, extra []string) (*rsSetup, error) {
	env := &r.env
	cr, err := newQTCreds(ctx, env, q, filepath.Join(env.WorkDir, q.file("resume")))
	if err != nil {
		return nil, err
	}
	s := &rsSetup{local: q.local(rsClientListen), sink: q.local(rsClientSink), serverAdmin: q.local(rsServerAdmin), clientAdmin: q.local(rsClientAdmin),
		serverLog: filepath.Join(env.LogDir, q.file("resume-server.log")), clientLog: filepath.Join(env.LogDir, q.file("resume-client.log"))}
	window := []string{"--resume-window", r.prof.Resume.Window.String()}
	endpoint := net.JoinHostPort(env.ServerIP, strconv.Itoa(rsUDPPort+q.Instance))
	denv := benchDaemonEnv(q.Env)
	args := slices.Concat([]string{"--listen-on", endpoint, "--state-dir", cr.state, "--secret-file", cr.secret,
		"--allow", fmt.Sprintf("tcp:127.0.0.1:%d,tcp:127.0.0.1:%d", EchoPort, SinkPort), "--httpd-listen-on", s.serverAdmin}, window, q.ccArgs(), extra, q.ServerArgs)
	bin, args := env.Pin.wrap(sideServer, q.bin(env, "quictun-server"), args)
	if s.server, err = startProcEnv(q.file("resume-server"), env.ServerNS, s.serverLog, denv, bin, args...); err != nil {
		return nil, err
	}
	args = slices.Concat([]string{"--listen-on", "tcp:" + s.local, "--server-endpoint", endpoint,
		"--token-source", fmt.Sprintf("tcp:127.0.0.1:%d", EchoPort), "--server-fingerprint", cr.fp, "--secret-file", cr.secret,
		"--forward", fmt.Sprintf("tcp:%s=tcp:127.0.0.1:%d", s.sink, SinkPort), "--httpd-listen-on", s.clientAdmin}, window, q.ccArgs(), extra, q.ClientArgs)
	bin, args = env.Pin.wrap(sideClient, q.bin(env, "quictun-client"), args)
	if s.client, err = startProcEnv(q.file("resume-client"), env.ClientNS, s.clientLog, denv, bin, args...); err != nil {
		s.stop()
		return nil, err
	}
	if err := waitEcho(ctx, env.ClientNS, s.local, 20*time.Second); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// upgradedRe finds the new process's PID in the old one's log.
var upgradedRe = regexp.MustCompile(`the new process is ready; handing the (server|client) over" pid=(\d+)`)

// upgradedPID reads the PID of the side's new process from the old
// process's log text (0: not there yet).
func upgradedPID(log, side string) int {
	for _, m := range upgradedRe.FindAllStringSubmatch(log, -1) {
		if m[1] == side {
			pid, _ := strconv.Atoi(m[2])
			return pid
		}
	}
	return 0
}

// upgradeLimit bounds an upgrade: the daemons give the new process 30 s to
// report ready.
const upgradeLimit = 40 * time.Second

// upgrade sends SIGUSR2 to p (side "server" or "client", logging to log)
// and waits until its new process reported ready and the old one exited.
// It returns the new PID and the time from the signal to the old
// process's exit.
func upgrade(ctx context.Context, p *Proc, log, side string) (pid int, exit time.Duration, err error) {
	st, err := os.Stat(log)
	if err != nil {
		return 0, 0, err
	}
	from := st.Size()
	start := time.Now()
	if err := syscall.Kill(p.PID(), syscall.SIGUSR2); err != nil {
		return 0, 0, fmt.Errorf("SIGUSR2 to the %s: %w", side, err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if pid == 0 {
			pid = upgradedPID(readFrom(log, from), side)
		}
		if done, werr := p.Exited(); done {
			if exit == 0 {
				exit = time.Since(start)
			}
			if werr != nil {
				return pid, exit, fmt.Errorf("the old %s exited: %w", side, werr)
			}
			if pid != 0 {
				return pid, exit, nil
			}
		}
		if time.Since(start) > upgradeLimit {
			return pid, exit, fmt.Errorf("%s upgrade not done within %v (new pid %d, old exited %v)", side, upgradeLimit, pid, exit > 0)
		}
		select {
		case <-ctx.Done():
			return pid, exit, ctx.Err()
		case <-tick.C:
		}
	}
}

// readFrom returns the file's text from offset on ("" on an error).
func readFrom(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() <= offset {
		return ""
	}
	b := make([]byte, st.Size()-offset)
	n, _ := f.ReadAt(b, offset)
	return string(b[:n])
}

// waitGone waits until process pid is gone (or a zombie) for at most d.
func waitGone(pid int, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if processGone(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// processGone tells whether pid no longer runs: no such process, or a
// zombie (an upgraded process is not the harness's child to reap).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')'.
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] == 'Z'
	}
	return false
}

// resumeCounters reads the tunnels resumed and given up from a daemon's
// metrics (side "server" or "client") into m, prefixed with the side.
func resumeCounters(ctx context.Context, ns, admin, side string, m map[string]float64) {
	for key, name := range map[string]string{"resumed": "tunnels_resumed_total", "gaveup": "tunnels_resume_gaveup_total",
		"parked": "tunnels_parked_total"} {
		if v, err := scrapeCounter(ctx, ns, "http://"+admin+"/metrics", "quictun_"+side+"_"+name); err == nil {
			m[key+"_"+side] = v
		}
	}
}

// addrMoveCommands move the client host from address from to address to:
// to added, the server host's route to it, the client's route to the
// server (server) taking it as source, and from removed (the QUIC
// client's packets can no longer leave from it, the server's to it go
// nowhere: the old path is dead).
func addrMoveCommands(cns, sns, from, to, server string) [][]string {
	return [][]string{
		{"-n", cns, "addr", "add", to + "/32", "dev", netns.DevName},
		{"-n", sns, "route", "add", to + "/32", "dev", netns.DevName},
		{"-n", cns, "route", "replace", server + "/32", "dev", netns.DevName, "src", to},
		{"-n", cns, "addr", "del", from + "/32", "dev", netns.DevName},
	}
}

// addrRestoreCommands undo addrMoveCommands.
func addrRestoreCommands(cns, sns, from, to, server string) [][]string {
	return [][]string{
		{"-n", cns, "addr", "add", from + "/32", "dev", netns.DevName},
		{"-n", cns, "route", "replace", server + "/32", "dev", netns.DevName},
		{"-n", cns, "addr", "del", to + "/32", "dev", netns.DevName},
		{"-n", sns, "route", "del", to + "/32", "dev", netns.DevName},
	}
}

// rsNewClientIP is the client host's address after the address change.
const rsNewClientIP = "198.18.0.31"

// restoreClientAddr undoes the address change, every step tried; a failure
// is a note of the run.
func (r *Runner) restoreClientAddr(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	for _, c := range addrRestoreCommands(r.env.ClientNS, r.env.ServerNS, netns.ClientIP, rsNewClientIP, r.env.ServerIP) {
		if err := ipCommands(ctx, [][]string{c}); err != nil {
			r.res.Notes = append(r.res.Notes, "resume: restore the client's address: "+err.Error())
		}
	}
}
