package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/proxy"

	"github.com/quictun/quictun/internal/testutil"
)

// installServer copies the built server binary to a directory of the
// test's own (so that the test can replace the file, as a package upgrade
// does) and returns its path.
func installServer(t *testing.T) string { return install(t, bins.server) }

// install copies the built binary at built to a directory of the test's
// own and returns its path.
func install(t *testing.T, built string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), filepath.Base(built))
	replaceBinary(t, path, readAll(t, built))
	return path
}

func readAll(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// replaceBinary writes content to path by renaming a new file over it, as
// package managers replace binaries (the running process keeps its own).
func replaceBinary(t *testing.T, path string, content []byte) {
	t.Helper()
	tmp := path + ".new"
	require.NoError(t, os.WriteFile(tmp, content, 0o755)) //nolint:gosec // an executable
	require.NoError(t, os.Rename(tmp, path))
}

// halfConn is a connection that half-closes: *net.TCPConn, *net.UnixConn.
type halfConn interface {
	net.Conn
	CloseWrite() error
}

// pingPonger moves data both ways through one tunnel to an echo: rounds of
// 8 KiB written and read back, until stop; it records the longest round.
type pingPonger struct {
	c           halfConn
	sentH, gotH [32]byte
	sent, got   int64
	err         error
	// longest is the longest round so far, in nanoseconds.
	longest atomic.Int64
	// rounds and failed are read while it runs.
	rounds atomic.Int64
	failed atomic.Bool
}

func (p *pingPonger) run(stop <-chan struct{}) {
	defer func() { p.failed.Store(p.err != nil) }()
	sh, gh := sha256.New(), sha256.New()
	buf, back := make([]byte, 8<<10), make([]byte, 8<<10)
	for p.err == nil {
		select {
		case <-stop:
			p.finish(sh, gh)
			return
		default:
		}
		_, _ = rand.Read(buf)
		start := time.Now()
		_ = p.c.SetDeadline(start.Add(ioTimeout))
		if _, p.err = p.c.Write(buf); p.err != nil {
			break
		}
		sh.Write(buf)
		if _, p.err = io.ReadFull(p.c, back); p.err != nil {
			break
		}
		gh.Write(back)
		if d := int64(time.Since(start)); d > p.longest.Load() {
			p.longest.Store(d)
		}
		p.sent += int64(len(buf))
		p.got += int64(len(back))
		p.rounds.Add(1)
	}
}

// finish half-closes and reads to the echo's EOF (nothing more is due).
func (p *pingPonger) finish(sh, gh io.Writer) {
	if p.err = p.c.CloseWrite(); p.err != nil {
		return
	}
	n, err := io.Copy(gh, p.c)
	p.got += n
	p.err = err
	copy(p.sentH[:], sh.(interface{ Sum([]byte) []byte }).Sum(nil))
	copy(p.gotH[:], gh.(interface{ Sum([]byte) []byte }).Sum(nil))
}

var newPIDRe = regexp.MustCompile(`the new process is ready; handing the (?:server|client) over" pid=(\d+)`)

// upgradedPID reads the new process's PID from the old one's log, and has
// the test's cleanup stop it (it is not the test's child).
func upgradedPID(t *testing.T, log string) int {
	t.Helper()
	m := newPIDRe.FindStringSubmatch(log)
	require.NotNil(t, m, "the old process logged the new one's pid")
	pid, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for deadline := time.Now().Add(exitTimeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
				return
			}
		}
		t.Errorf("upgraded process (pid %d) did not exit", pid)
	})
	return pid
}

// upgradeLoad is the load of an upgrade test: tunnels moving data both ways
// through addr (a client's listener in front of an echo), one pingPonger
// each, and through the extra connections given. QUICTUN_E2E_UPGRADE_TUNNELS=N
// runs N tunnels through addr (default 20).
type upgradeLoad struct {
	ps   []*pingPonger
	stop chan struct{}
	wg   sync.WaitGroup
}

func startUpgradeLoad(t *testing.T, addr string, extra ...halfConn) *upgradeLoad {
	t.Helper()
	tunnels := 20
	if n, err := strconv.Atoi(os.Getenv("QUICTUN_E2E_UPGRADE_TUNNELS")); err == nil && n > 0 {
		tunnels = n // a measurement with more (the target is 1,000)
	}
	l := &upgradeLoad{ps: make([]*pingPonger, tunnels, tunnels+len(extra)), stop: make(chan struct{})}
	for i := range tunnels {
		l.ps[i] = &pingPonger{c: dialApp(t, addr)}
	}
	for _, c := range extra {
		l.ps = append(l.ps, &pingPonger{c: c})
	}
	for _, p := range l.ps {
		l.wg.Go(func() { p.run(l.stop) })
	}
	t.Cleanup(l.end)
	l.waitMoving(t, "every tunnel moving data")
	return l
}

// end stops the load and waits for it.
func (l *upgradeLoad) end() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// waitMoving waits until every tunnel did 10 more rounds, none failing.
func (l *upgradeLoad) waitMoving(t *testing.T, what string) {
	t.Helper()
	from := make([]int64, len(l.ps))
	for i, p := range l.ps {
		from[i] = p.rounds.Load()
	}
	waitFor(t, ioTimeout, what, func() bool {
		for i, p := range l.ps {
			if p.failed.Load() || p.rounds.Load() < from[i]+10 {
				return false
			}
		}
		return true
	})
}

// longest is the longest round so far.
func (l *upgradeLoad) longest() time.Duration {
	var d time.Duration
	for _, p := range l.ps {
		d = max(d, time.Duration(p.longest.Load()))
	}
	return d
}

// restart returns the longest round so far and starts over: the longest
// round reported at the end is then one that ran from now on (the stall of
// an upgrade started now, or the load's own).
func (l *upgradeLoad) restart() time.Duration {
	d := l.longest()
	for _, p := range l.ps {
		p.longest.Store(0)
	}
	return d
}

// finish stops the load and checks each tunnel: no reset, no error, every
// byte echoed once and in order; it returns the longest round and the
// bytes moved both ways.
func (l *upgradeLoad) finish(t *testing.T) (longest time.Duration, moved int64) {
	t.Helper()
	l.end()
	for i, p := range l.ps {
		require.NoError(t, p.err, "tunnel %d: no reset, no error", i)
		assert.Equal(t, p.sentH, p.gotH, "tunnel %d: every byte echoed once and in order", i)
		assert.Equal(t, p.sent, p.got, "tunnel %d", i)
		moved += p.sent + p.got
	}
	return l.longest(), moved
}

// upgrade replaces the binary at bin (built: the new one) and sends d
// SIGUSR2: the old process exits 0 and the new one, with another PID,
// counts a successful upgrade. It returns the new PID.
func upgrade(t *testing.T, d *daemon, bin, built, side string) int {
	t.Helper()
	oldPID := d.cmd.Process.Pid
	replaceBinary(t, bin, readAll(t, built)) // the "upgraded" binary
	upgradeStart := time.Now()
	d.signal(t, syscall.SIGUSR2)
	code, ok := d.waitExit(exitTimeout)
	require.True(t, ok, "the old process exits after the handover")
	assert.Zero(t, code, "the old process exits 0")
	t.Logf("old process exited %s after SIGUSR2", time.Since(upgradeStart).Round(time.Millisecond))
	newPID := upgradedPID(t, d.log())
	assert.NotEqual(t, oldPID, newPID, "the PID changed")
	waitMetric(t, d, ioTimeout, eq(1), "quictun_"+side+"_upgrades_total", "result", "success")
	return newPID
}

// checkUpgraded checks, after an upgrade of up (srv or cl) under load:
// each tunnel resumed on both ends and moved on, none given up, all
// imported by up's new process, a new tunnel works; and logs the stall.
func checkUpgraded(t *testing.T, l *upgradeLoad, srv, cl, up *daemon, before time.Duration) {
	t.Helper()
	tunnels := float64(len(l.ps))
	waitMetric(t, cl, ioTimeout, eq(tunnels), "quictun_client_tunnels_resumed_total")
	waitMetric(t, srv, ioTimeout, eq(tunnels), "quictun_server_tunnels_resumed_total")
	l.waitMoving(t, "every tunnel moving data after the upgrade")
	longest, moved := l.finish(t)
	p := metricPrefix(up, srv)
	m := scrape(t, up)
	assert.Equal(t, tunnels, m.val(p+"_upgrade_tunnels_total", "result", "imported"))
	assert.Zero(t, m.val(p+"_upgrade_tunnels_total", "result", "refused"))
	for _, d := range []*daemon{srv, cl} {
		p := metricPrefix(d, srv)
		dm := scrape(t, d)
		for _, reason := range []string{"window", "refused", "offset", "shutdown"} {
			assert.Zero(t, dm.val(p+"_tunnels_resume_gaveup_total", "reason", reason), "%s gave up (%s)", p, reason)
		}
	}
	require.NoError(t, echoVia(t, cl.Addr, "a new tunnel after the upgrade"))
	t.Logf("%d tunnels, %d MiB moved both ways; longest 8 KiB round trip from the upgrade on (its stall): %s (before it: %s)",
		len(l.ps), moved>>20, longest.Round(time.Millisecond), before.Round(time.Millisecond))
}

// TestServerUpgradeKeepsTunnels (issue 34 part 2), through the built
// binaries: 20 resumable tunnels move data both ways (8 KiB rounds through
// an echo); the server's binary file is replaced and SIGUSR2 upgrades it:
// the new process takes the sockets and the tunnels, the old one exits 0,
// the PID changes, no tunnel is reset, every byte is echoed once and in
// order (SHA-256), and each tunnel resumed on both ends. The longest round
// (the stall of the upgrade) is reported. QUICTUN_E2E_UPGRADE_TUNNELS=N
// runs it with N tunnels.
func TestServerUpgradeKeepsTunnels(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	bin := installServer(t)
	args := []string{"--resume-window", "1m"}
	listen := testutil.FreeAddr(t, "tcp") // a reverse forward's, handed over too
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: append(slices.Clone(args), "--allow-remote-listen", "tcp:"+listen), Bin: bin})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: append(slices.Clone(args), "--remote-forward", "tcp:"+listen+"=tcp:"+echo)})
	waitFor(t, ioTimeout, "the reverse forward's listener", func() bool { return echoVia(t, listen, "before") == nil })
	l := startUpgradeLoad(t, cl.Addr)
	waitMetric(t, srv, ioTimeout, eq(float64(len(l.ps))), "quictun_server_active_streams")
	before := l.restart() // the longest round before the upgrade: what the machine's load costs
	probe := startReverseProbe(t, listen)
	newPID := upgrade(t, srv, bin, bins.server, "server")
	checkUpgraded(t, l, srv, cl, srv, before)
	probe.check(t)
	_ = syscall.Kill(newPID, syscall.SIGTERM)
}

// reverseProbe connects to a reverse forward's listener every 20 ms, each
// connection an echo round in its own goroutine, until check: during an
// upgrade none may be refused (the listening socket is handed over or kept;
// connections wait in its backlog for the new process). One the old
// process had accepted and was carrying to the client may be reset (a
// reverse forward's connections are not resumable).
type reverseProbe struct {
	stop          chan struct{}
	wg            sync.WaitGroup
	mu            sync.Mutex
	n             int
	refused, errs []error
}

func startReverseProbe(t *testing.T, addr string) *reverseProbe {
	t.Helper()
	p := &reverseProbe{stop: make(chan struct{})}
	p.wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			p.wg.Go(func() {
				err := echoVia(t, addr, "during "+strconv.Itoa(i))
				p.mu.Lock()
				defer p.mu.Unlock()
				p.n++
				switch {
				case errors.Is(err, syscall.ECONNREFUSED):
					p.refused = append(p.refused, err)
				case err != nil:
					p.errs = append(p.errs, err)
				}
			})
		}
	})
	t.Cleanup(func() { p.end() })
	return p
}

func (p *reverseProbe) end() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.wg.Wait()
}

// check stops the probe: no connection was refused.
func (p *reverseProbe) check(t *testing.T) {
	t.Helper()
	p.end()
	assert.Empty(t, p.refused, "connections to the reverse forward's listener refused during the upgrade (of %d)", p.n)
	t.Logf("reverse forward: %d connections during the upgrade, %d refused, %d reset (accepted by the old process: %v)", p.n, len(p.refused), len(p.errs), p.errs)
}

// TestClientUpgradeKeepsTunnels (issue 34 part 3), through the built
// binaries: as TestServerUpgradeKeepsTunnels, the client upgraded: the new
// client takes the local entry points (the applications' connections to
// them stay open) and the tunnels, connects to the server and re-attaches
// each; the old one exits 0, no tunnel is reset, every byte is echoed once
// and in order (SHA-256), each tunnel resumed on both ends, a new
// connection to each entry point is served by the new process. Besides the
// --listen-on tunnels, one goes through a UNIX --forward (its socket file
// stays) and one through the SOCKS5 --proxy. The longest round (the stall
// of the upgrade) is reported. QUICTUN_E2E_UPGRADE_TUNNELS=N runs it with
// N tunnels through --listen-on.
func TestClientUpgradeKeepsTunnels(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	bin := install(t, bins.client)
	sock := filepath.Join(t.TempDir(), "app.sock")
	socks := "127.0.0.1:" + strconv.Itoa(testutil.FreePort(t, "tcp"))
	listen := testutil.FreeAddr(t, "tcp") // a reverse forward's, on the server
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: []string{"--resume-window", "1m", "--allow-remote-listen", "tcp:" + listen}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Bin: bin,
		Args: []string{"--resume-window", "1m", "--forward", "unix:" + sock + "=tcp:" + echo, "--proxy", "socks5:" + socks,
			"--remote-forward", "tcp:" + listen + "=tcp:" + echo}})
	waitFor(t, ioTimeout, "the reverse forward's listener", func() bool { return echoVia(t, listen, "before") == nil })
	l := startUpgradeLoad(t, cl.Addr, dialUnix(t, sock), dialSOCKS(t, socks, echo))
	waitMetric(t, srv, ioTimeout, eq(float64(len(l.ps))), "quictun_server_active_streams")
	before := l.restart()
	probe := startReverseProbe(t, listen)
	newPID := upgrade(t, cl, bin, bins.client, "client")
	checkUpgraded(t, l, srv, cl, cl, before)
	probe.check(t)
	require.NoError(t, echoOnce(dialUnix(t, sock), "a new tunnel through the UNIX socket"))
	require.NoError(t, echoOnce(dialSOCKS(t, socks, echo), "a new tunnel through the SOCKS5 proxy"))
	_ = syscall.Kill(newPID, syscall.SIGTERM)
}

// dialUnix connects to the UNIX socket at path.
func dialUnix(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// dialSOCKS connects to target through the SOCKS5 proxy at addr.
func dialSOCKS(t *testing.T, addr, target string) *net.TCPConn {
	t.Helper()
	d, err := proxy.SOCKS5("tcp", addr, nil, proxy.Direct)
	require.NoError(t, err)
	c, err := d.Dial("tcp", target)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn)
}

// TestServerUpgradeFailsKeepsServing: when the file at the server's path
// is a binary that exits 1, SIGUSR2 leaves the old process serving as
// before: same PID, the open tunnel and its connection untouched (no
// reconnect), new tunnels accepted, the failure logged and counted; a
// second SIGUSR2 with a working binary then upgrades.
func TestServerUpgradeFailsKeepsServing(t *testing.T) { testUpgradeFailsKeepsServing(t, "server") }

// TestClientUpgradeFailsKeepsServing: the same for the client: a new
// client binary that exits 1 leaves the old client serving its listener
// and its open tunnel, with its connection to the server untouched.
func TestClientUpgradeFailsKeepsServing(t *testing.T) { testUpgradeFailsKeepsServing(t, "client") }

func testUpgradeFailsKeepsServing(t *testing.T, side string) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	args := []string{"--resume-window", "1m"}
	var srvBin, clBin string
	built := bins.server
	if side == "server" {
		srvBin = installServer(t)
	} else {
		clBin, built = install(t, bins.client), bins.client
	}
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: args, Bin: srvBin})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: args, Bin: clBin})
	up, bin := srv, srvBin
	if side == "client" {
		up, bin = cl, clBin
	}
	c := dialApp(t, cl.Addr)
	require.NoError(t, roundTrip(c, "before"))
	reconnects := scrape(t, cl).val("quictun_client_reconnects_total")

	oldPID := up.cmd.Process.Pid
	replaceBinary(t, bin, []byte("#!/bin/sh\nexit 1\n"))
	up.signal(t, syscall.SIGUSR2)
	waitMetric(t, up, ioTimeout, eq(1), "quictun_"+side+"_upgrades_total", "result", "failed")
	assert.Contains(t, up.log(), "Upgrade failed; still serving")
	assert.False(t, up.exited(), "the old process keeps running")
	assert.Equal(t, oldPID, up.cmd.Process.Pid)
	assert.True(t, up.ready(), "and ready")
	require.NoError(t, roundTrip(c, "the open tunnel still works"))
	require.NoError(t, echoVia(t, cl.Addr, "a new tunnel"))
	assert.Equal(t, reconnects, scrape(t, cl).val("quictun_client_reconnects_total"), "the client's connection was not touched")
	assert.Zero(t, scrape(t, up).val("quictun_"+side+"_upgrades_total", "result", "success"))

	newPID := upgrade(t, up, bin, built, side) // a working binary: the second upgrade goes through
	require.NoError(t, roundTrip(c, "the tunnel survived the upgrade"))
	_ = syscall.Kill(newPID, syscall.SIGTERM)
}
