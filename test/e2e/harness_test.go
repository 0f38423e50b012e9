package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quictun/quictun/internal/testutil"
)

// Bounds for every wait in this package: nothing waits forever.
const (
	startTimeout = 30 * time.Second // a daemon (race-built) becomes ready
	exitTimeout  = 30 * time.Second // a daemon exits after a signal
	ioTimeout    = 30 * time.Second // one application read or write
)

// checkLeaks fails the test if goroutines started during it are still running
// when it ends. Register it first so it runs after every other cleanup; it
// polls because goroutines (HTTP, copy loops) exit asynchronously.
func checkLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		var err error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if err = goleak.Find(ignore); err == nil {
				return
			}
		}
		t.Errorf("goroutines leaked: %v", err)
	})
}

// waitFor polls cond every 20 ms until it is true, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// childEnv is the environment of every child: ours without QUICTUN_* (so the
// developer's shell cannot change a test), plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUICTUN_") && !strings.HasPrefix(kv, "GORACE=") {
			env = append(env, kv)
		}
	}
	// Keep running after a race so the whole report lands in the log; exit 66 at the end.
	env = append(env, "GORACE=halt_on_error=0 exitcode=66")
	return append(env, extra...)
}

// result is the outcome of a one-shot command.
type result struct {
	stdout, stderr string
	code           int
}

// run runs bin to completion (bounded) and returns its output and exit code.
func run(t *testing.T, env []string, bin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), exitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = childEnv(env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run %s %v: %v", filepath.Base(bin), args, err)
	}
	require.NoError(t, ctx.Err(), "%s %v did not exit in time", filepath.Base(bin), args)
	checkNoRace(t, filepath.Base(bin), stderr.String())
	return result{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}

func checkNoRace(t *testing.T, name, log string) {
	t.Helper()
	i := strings.Index(log, "WARNING: DATA RACE")
	if i < 0 {
		return
	}
	// The race reports first: CI shows the start of a failure's output, and
	// a daemon's log opens with its whole effective configuration.
	start := strings.LastIndex(log[:i], "==================")
	if start < 0 {
		start = i
	}
	t.Errorf("%s reported a data race:\n%s", name, log[start:])
}

// proc is a running child process whose stdout and stderr go to a log file.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
}

// startProc starts bin; the test's cleanup kills it (if still running) and,
// when the test failed, prints the tail of its log.
func startProc(t *testing.T, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(bin, args...)
	cmd.Env = childEnv(env...)
	cmd.Stdout, cmd.Stderr = f, f // *os.File: no copying goroutines
	err = cmd.Start()
	_ = f.Close() // the child has its own descriptor
	require.NoError(t, err, "start %s", name)
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill(t)
		log := p.log()
		checkNoRace(t, name, log)
		if t.Failed() {
			if len(log) > 8000 {
				log = "...\n" + log[len(log)-8000:]
			}
			t.Logf("---- %s %v log ----\n%s", name, args, log)
		}
	})
	return p
}

func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil && !p.exited() {
		t.Fatalf("signal %s to %s: %v", sig, p.name, err)
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(exitTimeout):
		t.Errorf("%s did not die after SIGKILL", p.name)
	}
}

// waitExit waits up to timeout for the process to exit and returns its exit
// code (-1 for a signal); ok is false on timeout.
func (p *proc) waitExit(timeout time.Duration) (code int, ok bool) {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), true
	case <-time.After(timeout):
		return 0, false
	}
}

// writeFile writes content to a new file in the test's temp dir.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// newSecretFile writes a fresh 32-byte base64 secret, as the README tells operators to.
func newSecretFile(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return writeFile(t, "secret", base64.StdEncoding.EncodeToString(b)+"\n")
}

// httpClient never keeps connections alive, so no goroutine outlives a request.
var httpClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// httpDo performs one request and returns the status and body (status 0 when unreachable).
func httpDo(method, url string) (int, string) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, string(b)
}

// daemon is a running quictun-server or quictun-client.
type daemon struct {
	*proc
	// Addr is the server's UDP host:port, or the client's local TCP listener.
	Addr     string
	AdminURL string
	// Server only.
	StateDir, SecretFile, Fingerprint string
	udpPort, adminPort                int
}

// ready reports whether /readyz answers 200.
func (d *daemon) ready() bool {
	code, _ := httpDo(http.MethodGet, d.AdminURL+"/readyz")
	return code == http.StatusOK
}

// waitReady waits for /readyz 200; it fails the test if the process exits first.
func (d *daemon) waitReady(t *testing.T) {
	t.Helper()
	waitFor(t, startTimeout, d.name+" ready", func() bool {
		if d.exited() {
			t.Fatalf("%s exited before becoming ready:\n%s", d.name, d.log())
		}
		return d.ready()
	})
}

// serverOpts configure startServer; zero values pick fresh temp files and ports.
type serverOpts struct {
	StateDir   string
	SecretFile string
	UDPPort    int
	AdminPort  int
	Allow      []string // default: loopback (the server's default)
	Args       []string
	Env        []string // added to the environment
	NoWait     bool
	Bin        string // the server binary to run (default: the one built)
}

// startServer starts quictun-server with -v 4 on loopback and waits until it is ready.
func startServer(t *testing.T, o serverOpts) *daemon {
	t.Helper()
	if o.StateDir == "" {
		o.StateDir = filepath.Join(t.TempDir(), "state")
	}
	if o.SecretFile == "" {
		o.SecretFile = newSecretFile(t)
	}
	// As an operator would: create the state and read the fingerprint first.
	fp := strings.TrimSpace(run(t, nil, bins.server, "fingerprint", "--state-dir", o.StateDir).stdout)
	fixedPorts := o.UDPPort != 0
	for attempt := 1; ; attempt++ {
		udp, adm := o.UDPPort, o.AdminPort
		if !fixedPorts {
			udp, adm = testutil.FreePort(t, "udp"), testutil.FreePort(t, "tcp")
		}
		args := []string{"--listen-on", "127.0.0.1:" + strconv.Itoa(udp), "--state-dir", o.StateDir,
			"--secret-file", o.SecretFile, "--httpd-listen-on", "127.0.0.1:" + strconv.Itoa(adm), "-v", "4"}
		if o.Allow != nil {
			args = append(args, "--allow", strings.Join(o.Allow, ","))
		}
		args = append(args, o.Args...)
		bin := bins.server
		if o.Bin != "" {
			bin = o.Bin
		}
		p := startProc(t, "quictun-server", o.Env, bin, args...)
		d := &daemon{proc: p, Addr: "127.0.0.1:" + strconv.Itoa(udp), AdminURL: "http://127.0.0.1:" + strconv.Itoa(adm),
			StateDir: o.StateDir, SecretFile: o.SecretFile, Fingerprint: fp, udpPort: udp, adminPort: adm}
		if o.NoWait {
			return d
		}
		if !fixedPorts && attempt < 3 && !startedOrAddrInUse(t, d) {
			continue // another process took a port between testutil.FreePort and bind
		}
		d.waitReady(t)
		return d
	}
}

// startedOrAddrInUse waits for d to be ready or to exit; it returns false when
// it exited because a port was taken.
func startedOrAddrInUse(t *testing.T, d *daemon) bool {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		if d.exited() {
			return !strings.Contains(d.log(), "address already in use")
		}
		if d.ready() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// clientOpts configure startClient.
type clientOpts struct {
	Token       string // --token-source (Fixed unless Args choose another plugin)
	SecretFile  string // default: the server's
	Fingerprint string // default: the server's; "-": none on the command line (a --config file gives it)
	Args        []string
	Env         []string // added to the environment
	NoWait      bool     // do not wait for the QUIC connection (readyz)
	Bin         string   // the client binary to run (default: the one built)
}

// startClient starts quictun-client for srv with -v 4 and, unless NoWait,
// waits until it is connected.
func startClient(t *testing.T, srv *daemon, o clientOpts) *daemon {
	t.Helper()
	if o.SecretFile == "" {
		o.SecretFile = srv.SecretFile
	}
	if o.Fingerprint == "" {
		o.Fingerprint = srv.Fingerprint
	}
	for attempt := 1; ; attempt++ {
		lp, adm := testutil.FreePort(t, "tcp"), testutil.FreePort(t, "tcp")
		args := []string{"--listen-on", "tcp:127.0.0.1:" + strconv.Itoa(lp), "--server-endpoint", srv.Addr,
			"--token-source", o.Token, "--httpd-listen-on", "127.0.0.1:" + strconv.Itoa(adm), "-v", "4"}
		if o.Fingerprint != "-" {
			args = append(args, "--server-fingerprint", o.Fingerprint)
		}
		if o.SecretFile != "-" {
			args = append(args, "--secret-file", o.SecretFile)
		}
		args = append(args, o.Args...)
		bin := bins.client
		if o.Bin != "" {
			bin = o.Bin
		}
		p := startProc(t, "quictun-client", o.Env, bin, args...)
		d := &daemon{proc: p, Addr: "127.0.0.1:" + strconv.Itoa(lp), AdminURL: "http://127.0.0.1:" + strconv.Itoa(adm), adminPort: adm}
		if o.NoWait {
			// Wait for the admin server at least, so the listener is up.
			waitFor(t, startTimeout, "client admin server", func() bool {
				if d.exited() {
					t.Fatalf("client exited:\n%s", d.log())
				}
				code, _ := httpDo(http.MethodGet, d.AdminURL+"/healthz")
				return code == http.StatusOK
			})
			return d
		}
		if attempt < 3 && !startedOrAddrInUse(t, d) {
			continue
		}
		d.waitReady(t)
		return d
	}
}

// metrics is one parsed /metrics scrape.
type metrics struct {
	raw      string
	families map[string]*dto.MetricFamily
}

// scrape fetches and parses /metrics of d.
func scrape(t *testing.T, d *daemon) metrics {
	t.Helper()
	code, body := httpDo(http.MethodGet, d.AdminURL+"/metrics")
	require.Equal(t, http.StatusOK, code, "GET /metrics: %s", body)
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err, "parse /metrics")
	return metrics{raw: body, families: fams}
}

// get returns the value of the series of name whose labels include the given
// name/value pairs (counter, gauge, untyped; a histogram's sample count). ok
// is false when there is no such series.
func (m metrics) get(name string, labels ...string) (v float64, ok bool) {
	mf := m.families[name]
	if mf == nil {
		return 0, false
	}
	for _, s := range mf.GetMetric() {
		if !hasLabels(s, labels) {
			continue
		}
		switch {
		case s.Counter != nil:
			return s.GetCounter().GetValue(), true
		case s.Gauge != nil:
			return s.GetGauge().GetValue(), true
		case s.Untyped != nil:
			return s.GetUntyped().GetValue(), true
		case s.Histogram != nil:
			return float64(s.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// val is get that treats a missing series as 0.
func (m metrics) val(name string, labels ...string) float64 {
	v, _ := m.get(name, labels...)
	return v
}

func hasLabels(s *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, lp := range s.GetLabel() {
			if lp.GetName() == kv[i] && lp.GetValue() == kv[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// waitMetric polls d's /metrics until cond holds for the value of the series.
func waitMetric(t *testing.T, d *daemon, timeout time.Duration, cond func(float64) bool, name string, labels ...string) float64 {
	t.Helper()
	var v float64
	deadline := time.Now().Add(timeout)
	for {
		v = scrape(t, d).val(name, labels...)
		if cond(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s %s%v: last value %v", timeout, d.name, name, labels, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func eq(want float64) func(float64) bool { return func(v float64) bool { return v == want } }
func ge(want float64) func(float64) bool { return func(v float64) bool { return v >= want } }

// dialApp connects to a tunnel's local listener as an application would.
func dialApp(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn)
}

// transfer writes n random bytes to c and half-closes, while reading c to
// EOF; it returns SHA-256 of what was sent and received and the byte count
// received. Everything is bounded by ioTimeout.
func transfer(c *net.TCPConn, n int64) (sent, got [32]byte, gotN int64, err error) {
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	var wg sync.WaitGroup
	var werr error
	wg.Go(func() {
		h := sha256.New()
		_, werr = io.CopyN(io.MultiWriter(c, h), rand.Reader, n)
		if werr == nil {
			werr = c.CloseWrite()
		}
		copy(sent[:], h.Sum(nil))
	})
	h := sha256.New()
	gotN, err = io.Copy(h, c)
	copy(got[:], h.Sum(nil))
	wg.Wait()
	if err == nil {
		err = werr
	}
	return sent, got, gotN, err
}

// echoVia connects to addr and does echoOnce. A connection the tunnel resets
// at once may fail already in connect (ECONNRESET): that error is returned too.
func echoVia(t *testing.T, addr, msg string) error {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	return echoOnce(c.(*net.TCPConn), msg)
}

// echoOnce does one small round trip through an echo tunnel and closes c cleanly.
func echoOnce(c halfConn, msg string) error {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	if err := c.CloseWrite(); err != nil {
		return err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if string(b) != msg {
		return fmt.Errorf("echo: got %q, want %q", b, msg)
	}
	return nil
}

// startLatencyServe runs `latency-client serve` (the echo server) on a fresh
// loopback port and returns its address.
func startLatencyServe(t *testing.T) string {
	t.Helper()
	for attempt := 1; ; attempt++ {
		addr := testutil.FreeAddr(t, "tcp")
		p := startProc(t, "latency-serve", nil, bins.latency, "serve", "--listen", addr, "--drain-timeout", "1s")
		ok := false
		waitFor(t, startTimeout, "latency-client serve", func() bool {
			if p.exited() {
				return true
			}
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				_ = c.Close()
				ok = true
			}
			return ok
		})
		if ok {
			return addr
		}
		if attempt == 3 {
			t.Fatalf("latency-client serve did not start:\n%s", p.log())
		}
	}
}
