package loadgen

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/quictun/quictun/internal/procstat"
	"github.com/quictun/quictun/tools/bench/harness"
)

// server is the quictun-server under test: its files, its command line and
// the running process (replaced at each restart).
type server struct {
	bin      string
	stateDir string
	secret   []byte
	udp      string // UDP address it listens on
	admin    string // admin listener (/metrics)
	args     []string
	env      []string
	logDir   string
	starts   int
	proc     *harness.Proc
	started  time.Time // when proc was started
	fp       string    // certificate fingerprint (pinned by the clients)
}

// newServer prepares the state directory, secret and addresses, and reads
// the certificate fingerprint the clients pin.
func newServer(ctx context.Context, o Options, work, logDir, echoAddr string) (*server, error) {
	s := &server{bin: filepath.Join(o.BinDir, "quictun-server"), stateDir: filepath.Join(work, "state"), logDir: logDir,
		env: harness.DaemonEnv(o.ServerEnv)}
	if err := os.MkdirAll(s.stateDir, 0o700); err != nil {
		return nil, err
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	s.secret = []byte(base64.StdEncoding.EncodeToString(raw))
	secretFile := filepath.Join(work, "secret")
	if err := os.WriteFile(secretFile, append(s.secret, '\n'), 0o600); err != nil {
		return nil, err
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(fctx, s.bin, "fingerprint", "--state-dir", s.stateDir).Output()
	if err != nil {
		return nil, fmt.Errorf("quictun-server fingerprint: %w", err)
	}
	s.fp = strings.TrimSpace(string(out))
	if s.udp, err = freePort("udp"); err != nil {
		return nil, err
	}
	if s.admin, err = freePort("tcp"); err != nil {
		return nil, err
	}
	s.args = []string{"--listen-on", s.udp, "--state-dir", s.stateDir, "--secret-file", secretFile,
		"--allow", "tcp:" + echoAddr, "--httpd-listen-on", s.admin, "--audit-log=false",
		// /debug/pprof/heap?gc=1 runs a collection: the live heap (collect).
		"--enable-pprof"}
	if o.Clients > defaultMaxConnections && !hasFlag(o.ServerArgs, "max-connections") {
		// The default limit would refuse the clients past it; an operator
		// expecting this many clients raises it.
		s.args = append(s.args, "--max-connections="+strconv.Itoa(o.Clients+o.Clients/10))
	}
	s.args = append(s.args, o.ServerArgs...)
	return s, nil
}

// defaultMaxConnections is quictun-server's --max-connections default.
const defaultMaxConnections = 4096

// hasFlag tells whether args set --name.
func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == "--"+name || strings.HasPrefix(a, "--"+name+"=") {
			return true
		}
	}
	return false
}

// commandLine is the server's command, for the report.
func (s *server) commandLine() string {
	return strings.Join(append(append(append([]string{}, s.env...), s.bin), s.args...), " ")
}

// start starts the server and waits until its admin listener answers.
func (s *server) start(ctx context.Context) error {
	s.starts++
	p, err := harness.StartProcEnv("quictun-server", "", filepath.Join(s.logDir, fmt.Sprintf("server-%d.log", s.starts)), s.env, s.bin, s.args...)
	if err != nil {
		return err
	}
	s.proc, s.started = p, time.Now()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := s.scrape(ctx); err == nil {
			return nil
		}
		if done, werr := p.Exited(); done {
			return fmt.Errorf("quictun-server exited at start (log %s): %v", filepath.Join(s.logDir, fmt.Sprintf("server-%d.log", s.starts)), werr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("quictun-server's admin listener %s did not answer within 20s", s.admin)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop ends the server with SIGTERM (a drain), SIGKILL after grace.
func (s *server) stop(grace time.Duration) {
	if s.proc != nil {
		s.proc.Stop(grace)
		s.proc = nil
	}
}

// cpu is the server's CPU seconds so far.
func (s *server) cpu() float64 {
	v, _ := procstat.CPUSeconds(s.proc.PID())
	return v
}

// rss is the server's resident set size in bytes.
func (s *server) rss() int64 {
	v, _ := procstat.RSSBytes(s.proc.PID())
	return v
}

// scrape reads the server's /metrics: every sample without labels by name,
// labelled samples as name{labels} as the exposition writes them.
func (s *server) scrape(ctx context.Context) (metricSet, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.admin+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// collect makes the server run a garbage collection (the heap profile
// handler's gc=1) and returns its metrics right after: heap_alloc is then
// the live heap. With save set, the heap profile is written there (go tool
// pprof reads it).
func (s *server) collect(ctx context.Context, save string) (metricSet, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.admin+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		return nil, err
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return nil, err
	}
	prof, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /debug/pprof/heap?gc=1: %s", resp.Status)
	}
	if save != "" {
		if err := os.WriteFile(save, prof, 0o644); err != nil {
			return nil, err
		}
	}
	return s.scrape(ctx)
}

// scrapeClient reads /metrics without keeping connections open: the
// server restarts, and nothing outlives Run.
var scrapeClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// metricSet is a scrape: sample name (with its labels) -> value.
type metricSet map[string]float64

// sum adds the samples of metric name, whatever their labels.
func (m metricSet) sum(name string) float64 {
	var t float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			t += v
		}
	}
	return t
}

// parseMetrics reads the Prometheus text exposition (no timestamps, as
// client_golang writes it).
func parseMetrics(r io.Reader) (metricSet, error) {
	m := metricSet{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("parse metrics: %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("parse metrics: %q: %w", line, err)
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

// freePort returns 127.0.0.1:PORT with a port that was free a moment ago.
func freePort(network string) (string, error) {
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		defer c.Close()
		return c.LocalAddr().String(), nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
