package harness

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Ports used inside the namespaces.
const (
	EchoPort = 15676
	SinkPort = 15677
)

// Env is what variants need to know about the testbed.
type Env struct {
	ClientNS, ServerNS string
	ServerIP           string
	BinDir             string // quictun binaries and latency-client
	WorkDir            string // scratch: state dirs, secrets
	LogDir             string // process logs
}

func (e *Env) bin(name string) string { return filepath.Join(e.BinDir, name) }

// Variant is one way of carrying TCP from the client host to the echo and
// sink servers on the server host.
type Variant interface {
	Name() string
	// Start starts the endpoints and returns once they carry traffic.
	Start(ctx context.Context, env *Env) error
	// Echo and Sink return the HOST:PORT the client host connects to.
	Echo() string
	Sink() string
	// EndpointPIDs returns the tunnel's client-side and server-side
	// processes for the given service ("echo" or "sink"); none for direct.
	EndpointPIDs(service string) (client, server []int)
	// Reconnects returns a counter of the tunnel's reconnections, or -1 if
	// the variant does not expose one.
	Reconnects(ctx context.Context, env *Env) float64
	Stop()
}

// --- direct TCP ---

type direct struct{ ip string }

func (d *direct) Name() string                               { return "direct" }
func (d *direct) Start(_ context.Context, env *Env) error    { d.ip = env.ServerIP; return nil }
func (d *direct) Echo() string                               { return net.JoinHostPort(d.ip, strconv.Itoa(EchoPort)) }
func (d *direct) Sink() string                               { return net.JoinHostPort(d.ip, strconv.Itoa(SinkPort)) }
func (d *direct) EndpointPIDs(string) (client, server []int) { return nil, nil }
func (d *direct) Reconnects(context.Context, *Env) float64   { return -1 }
func (d *direct) Stop()                                      {}

// --- kcptun (Debian package) ---

type kcptun struct {
	procs map[string][2]*Proc // service -> client, server
}

const (
	kcpEchoUDP, kcpSinkUDP     = 29900, 29901
	kcpEchoLocal, kcpSinkLocal = 16676, 16677
)

// KcptunAvailable tells whether kcptun-client and kcptun-server are installed.
func KcptunAvailable() bool {
	_, e1 := exec.LookPath("kcptun-client")
	_, e2 := exec.LookPath("kcptun-server")
	return e1 == nil && e2 == nil
}

func (k *kcptun) Name() string { return "kcptun" }

func (k *kcptun) Start(ctx context.Context, env *Env) error {
	k.procs = map[string][2]*Proc{}
	for _, svc := range []struct {
		name               string
		udp, local, local2 int
	}{{"echo", kcpEchoUDP, kcpEchoLocal, EchoPort}, {"sink", kcpSinkUDP, kcpSinkLocal, SinkPort}} {
		// Defaults of the Debian build: mode fast, FEC 10/3, aes; no compression
		// (the payload is random anyway).
		srv, err := StartProc("kcptun-server-"+svc.name, env.ServerNS, filepath.Join(env.LogDir, "kcptun-server-"+svc.name+".log"),
			"kcptun-server", "-l", net.JoinHostPort(env.ServerIP, strconv.Itoa(svc.udp)),
			"-t", "127.0.0.1:"+strconv.Itoa(svc.local2), "--mode", "fast", "--nocomp", "--quiet")
		if err != nil {
			return err
		}
		cli, err := StartProc("kcptun-client-"+svc.name, env.ClientNS, filepath.Join(env.LogDir, "kcptun-client-"+svc.name+".log"),
			"kcptun-client", "-l", "127.0.0.1:"+strconv.Itoa(svc.local),
			"-r", net.JoinHostPort(env.ServerIP, strconv.Itoa(svc.udp)), "--mode", "fast", "--nocomp", "--quiet")
		if err != nil {
			srv.Stop(time.Second)
			return err
		}
		k.procs[svc.name] = [2]*Proc{cli, srv}
	}
	return waitEcho(ctx, env.ClientNS, k.Echo(), 20*time.Second)
}

func (k *kcptun) Echo() string { return "127.0.0.1:" + strconv.Itoa(kcpEchoLocal) }
func (k *kcptun) Sink() string { return "127.0.0.1:" + strconv.Itoa(kcpSinkLocal) }
func (k *kcptun) EndpointPIDs(service string) (client, server []int) {
	p, ok := k.procs[service]
	if !ok {
		return nil, nil
	}
	return []int{p[0].PID()}, []int{p[1].PID()}
}
func (k *kcptun) Reconnects(context.Context, *Env) float64 { return -1 }

// RestartClient restarts the echo service's kcptun client.
func (k *kcptun) RestartClient(_ context.Context, env *Env) error {
	p, ok := k.procs["echo"]
	if !ok {
		return fmt.Errorf("kcptun echo client not running")
	}
	cli, err := p[0].Restart(3*time.Second, filepath.Join(env.LogDir, "kcptun-client-echo-restarted.log"))
	if err != nil {
		p[1].Stop(3 * time.Second)
		delete(k.procs, "echo")
		return err
	}
	k.procs["echo"] = [2]*Proc{cli, p[1]}
	return nil
}

func (k *kcptun) Stop() {
	for _, p := range k.procs {
		p[0].Stop(3 * time.Second)
		p[1].Stop(3 * time.Second)
	}
	k.procs = nil
}

// --- quictun ---

// QuictunAvailable tells whether the quictun binaries are built in binDir.
func QuictunAvailable(binDir string) bool {
	for _, b := range []string{"quictun-server", "quictun-client"} {
		if st, err := os.Stat(filepath.Join(binDir, b)); err != nil || st.IsDir() {
			return false
		}
	}
	return true
}

type quictun struct {
	ServerArgs, ClientArgs []string // extra flags
	server                 *Proc
	clients                map[string]*Proc
}

const (
	qtUDPPort                = 7500
	qtEchoLocal, qtSinkLocal = 6500, 6501
	qtServerAdmin            = "127.0.0.1:8086"
	qtEchoAdmin              = "127.0.0.1:8087"
	qtSinkAdmin              = "127.0.0.1:8088"
)

func (q *quictun) Name() string { return "quictun" }

func (q *quictun) Start(ctx context.Context, env *Env) error {
	state := filepath.Join(env.WorkDir, "quictun-state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		return fmt.Errorf("quictun state dir: %w", err)
	}
	secret := filepath.Join(env.WorkDir, "quictun-secret")
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	if err := os.WriteFile(secret, []byte(base64.StdEncoding.EncodeToString(raw)+"\n"), 0o600); err != nil {
		return fmt.Errorf("quictun secret: %w", err)
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(fctx, env.bin("quictun-server"), "fingerprint", "--state-dir", state).Output()
	if err != nil {
		return fmt.Errorf("quictun-server fingerprint: %w", err)
	}
	fp := strings.TrimSpace(string(out))
	if !strings.HasPrefix(fp, "sha256:") {
		return fmt.Errorf("quictun-server fingerprint printed %q", fp)
	}
	args := append([]string{
		"--listen-on", net.JoinHostPort(env.ServerIP, strconv.Itoa(qtUDPPort)),
		"--state-dir", state, "--secret-file", secret,
		"--allow", fmt.Sprintf("tcp:127.0.0.1:%d,tcp:127.0.0.1:%d", EchoPort, SinkPort),
		"--httpd-listen-on", qtServerAdmin,
	}, q.ServerArgs...)
	q.server, err = StartProc("quictun-server", env.ServerNS, filepath.Join(env.LogDir, "quictun-server.log"), env.bin("quictun-server"), args...)
	if err != nil {
		return err
	}
	q.clients = map[string]*Proc{}
	for _, svc := range []struct {
		name        string
		local, dest int
		admin       string
	}{{"echo", qtEchoLocal, EchoPort, qtEchoAdmin}, {"sink", qtSinkLocal, SinkPort, qtSinkAdmin}} {
		args := append([]string{
			"--listen-on", "tcp:127.0.0.1:" + strconv.Itoa(svc.local),
			"--server-endpoint", net.JoinHostPort(env.ServerIP, strconv.Itoa(qtUDPPort)),
			"--token-source-plugin", "Fixed", "--token-source", "tcp:127.0.0.1:" + strconv.Itoa(svc.dest),
			"--server-fingerprint", fp, "--secret-file", secret,
			"--httpd-listen-on", svc.admin,
			// As the systemd unit: tickets survive a restart (cold start).
			"--session-file", filepath.Join(env.WorkDir, "quictun-sessions-"+svc.name+".json"),
		}, q.ClientArgs...)
		p, err := StartProc("quictun-client-"+svc.name, env.ClientNS, filepath.Join(env.LogDir, "quictun-client-"+svc.name+".log"), env.bin("quictun-client"), args...)
		if err != nil {
			return err
		}
		q.clients[svc.name] = p
	}
	return waitEcho(ctx, env.ClientNS, q.Echo(), 20*time.Second)
}

func (q *quictun) Echo() string { return "127.0.0.1:" + strconv.Itoa(qtEchoLocal) }
func (q *quictun) Sink() string { return "127.0.0.1:" + strconv.Itoa(qtSinkLocal) }
func (q *quictun) EndpointPIDs(service string) (client, server []int) {
	if q.server == nil {
		return nil, nil
	}
	if c, ok := q.clients[service]; ok {
		return []int{c.PID()}, []int{q.server.PID()}
	}
	return nil, []int{q.server.PID()}
}

// RestartClient restarts the echo service's client and returns when the new
// process has started (not when it is ready).
func (q *quictun) RestartClient(_ context.Context, env *Env) error {
	p, ok := q.clients["echo"]
	if !ok {
		return fmt.Errorf("quictun echo client not running")
	}
	np, err := p.Restart(5*time.Second, filepath.Join(env.LogDir, "quictun-client-echo-restarted.log"))
	if err != nil {
		delete(q.clients, "echo")
		return err
	}
	q.clients["echo"] = np
	return nil
}

// Reconnects sums quictun_client_reconnects_total of the echo client.
func (q *quictun) Reconnects(ctx context.Context, env *Env) float64 {
	v, err := scrapeCounter(ctx, env.ClientNS, "http://"+qtEchoAdmin+"/metrics", "quictun_client_reconnects_total")
	if err != nil {
		return -1
	}
	return v
}

func (q *quictun) Stop() {
	for _, c := range q.clients {
		c.Stop(5 * time.Second)
	}
	if q.server != nil {
		q.server.Stop(5 * time.Second)
	}
	q.clients, q.server = nil, nil
}

// scrapeCounter sums the samples of a metric in a Prometheus exposition.
func scrapeCounter(ctx context.Context, ns, url, name string) (float64, error) {
	req, err := newGet(ctx, url)
	if err != nil {
		return 0, err
	}
	resp, err := httpClientIn(ns).Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	return parseMetric(resp.Body, name)
}

func parseMetric(r io.Reader, name string) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	found := false
	var sum float64
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // a longer metric name
		}
		fs := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(fs) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fs[0], 64)
		if err != nil {
			return 0, fmt.Errorf("parse %q: %w", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("metric %s not found", name)
	}
	return sum, nil
}

// waitEcho retries one echo round trip through addr until it works.
func waitEcho(ctx context.Context, ns, addr string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	for {
		last = echoOnce(ctx, ns, addr, 100)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no echo through %s in %s within %v: %w", addr, ns, limit, errors.Join(last, ctx.Err()))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func echoOnce(ctx context.Context, ns, addr string, size int) error {
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := dialIn(actx, ns, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	defer context.AfterFunc(actx, func() { _ = c.Close() })()
	dl, _ := actx.Deadline()
	_ = c.SetDeadline(dl)
	return roundTrip(c, make([]byte, size))
}
