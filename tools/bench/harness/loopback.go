package harness

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/internal/procstat"
)

// Loopback cases: the efficiency measurements of issue 13 that need no
// emulated link (both hosts on one machine's loopback).
const (
	LbPingPong = "pingpong"    // 1000 round trips of 1000 B, one connection
	LbQPS      = "qps-128"     // round trips/s of 128 B, one connection
	LbEcho     = "echo-1KB-x8" // round trips/s of 1 KB on 8 connections
	LbReq16M   = "req-16MiB"   // echo of 16 MiB messages, throughput
	LbConnrate = "connrate"    // new connections/s (100 B echo, 8 in flight)
	LbRedis    = "redis"       // redis-benchmark -t set,get -c 50
	LbBulk     = "bulk"        // one-way bulk for a few seconds, CPU per GB
	// LbBulkDown is bulk the other way, from the server's side to the
	// client's (a download): the direction in which the client's
	// controller only sends ACKs and window updates (issue 32's slow
	// pairs showed there in every pair of the build before the fix).
	LbBulkDown = "bulk-down"
)

// LoopbackCases lists every loopback case in run order.
func LoopbackCases() []string {
	return []string{LbPingPong, LbQPS, LbEcho, LbReq16M, LbConnrate, LbRedis, LbBulk, LbBulkDown}
}

// LoopbackOptions configure RunLoopback.
type LoopbackOptions struct {
	BinDir string // latency-client, quictun-server, quictun-client
	// BinDirB, if set, adds the variant "quictun-b": the daemons of another
	// build, interleaved with the first in the same run (before/after).
	BinDirB    string
	ResultsDir string
	Reps       int
	Cases      []string
	// ServerArgs and ClientArgs are extra daemon flags; Env extra
	// environment of the daemons (e.g. GOMAXPROCS=2). They apply to every
	// quictun variant. Nothing else is added: the daemons run with the
	// harness's environment (Go's defaults unless set).
	ServerArgs, ClientArgs, Env []string
	// RuntimeEnv, when set, adds a tuned variant of each build, named
	// after it (runtimeEnvName), with these settings after Env.
	RuntimeEnv []string
	// NoPin leaves every process unpinned (see cpuPin).
	NoPin bool
	// EnvB is extra environment of quictun-b's daemons only (after Env).
	EnvB []string
	// ServerArgsB are extra flags of quictun-b's server only (after
	// ServerArgs): the same build with another configuration, e.g. caps.
	ServerArgsB []string
	// Smoke divides every case's work by 20 (the harness's own tests).
	Smoke bool
	Now   func() time.Time
}

// lbTunnel is one quictun-server and quictun-client pair on loopback with a
// forward per service.
type lbTunnel struct {
	name           string
	server, client *Proc
	fwd            map[string]string // service -> local address of its forward
}

// lbRun holds a loopback run's state.
type lbRun struct {
	opts    LoopbackOptions
	res     *Results
	logDir  string
	lcLog   io.Writer
	dst     map[string]string // service -> address of the real server
	echo    *Proc
	redis   *Proc
	tunnels []*lbTunnel
	pin     cpuPin
}

// Loopback services (destinations behind the tunnel).
const (
	svcEcho  = "echo"
	svcSink  = "sink"
	svcRedis = "redis"
)

// RunLoopback measures direct TCP and quictun on this host's loopback, the
// cases interleaved per repetition, and writes results.json and report.md
// into <ResultsDir>/loopback-<date>/. The tunnel's CPU time (both daemons)
// is recorded beside every figure: on a small machine the daemons, the
// load generator and the servers share the cores.
func RunLoopback(ctx context.Context, opts LoopbackOptions) (dir string, err error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Reps <= 0 {
		opts.Reps = 3
	}
	if len(opts.Cases) == 0 {
		opts.Cases = LoopbackCases()
	}
	for _, c := range opts.Cases {
		if !slices.Contains(LoopbackCases(), c) {
			return "", fmt.Errorf("unknown loopback case %q (want %v)", c, LoopbackCases())
		}
	}
	started := opts.Now()
	dir = filepath.Join(opts.ResultsDir, "loopback-"+started.UTC().Format("2006-01-02T150405Z"))
	r := &lbRun{opts: opts, logDir: filepath.Join(dir, "raw"), dst: map[string]string{}}
	if err := os.MkdirAll(r.logDir, 0o755); err != nil {
		return "", fmt.Errorf("create output dir: %w", err)
	}
	lcLog, err := os.Create(filepath.Join(r.logDir, "latency-client.log"))
	if err != nil {
		return "", err
	}
	defer lcLog.Close()
	r.lcLog = lcLog
	work, err := os.MkdirTemp("", "quictun-loopback-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	r.res = &Results{Version: 1, Profile: "loopback", Started: started.UTC(), Machine: machineInfo(),
		Tools: toolVersions(ctx, opts.BinDir), Reps: opts.Reps, Links: []LinkSpec{{Name: "loopback"}}}
	if opts.BinDirB != "" {
		r.res.Tools["quictun-b"] = toolVersions(ctx, opts.BinDirB)["quictun-server"]
	}
	var pinDesc string
	r.pin, pinDesc = hostPinPlan(!opts.NoPin, runtime.NumCPU())
	r.res.Runtime = runtimeInfo(os.Environ(), opts.RuntimeEnv, pinDesc)
	r.res.Notes = append(r.res.Notes, "daemon env: "+strings.Join(opts.Env, " "), "quictun-b env: "+strings.Join(opts.EnvB, " "),
		"server args: "+strings.Join(opts.ServerArgs, " "), "quictun-b server args: "+strings.Join(opts.ServerArgsB, " "), "client args: "+strings.Join(opts.ClientArgs, " "))
	defer func() {
		for _, t := range r.tunnels {
			t.client.Stop(5 * time.Second)
			t.server.Stop(5 * time.Second)
		}
		if r.echo != nil {
			r.echo.Stop(5 * time.Second)
		}
		if r.redis != nil {
			r.redis.Stop(5 * time.Second)
		}
		r.res.Finished = opts.Now().UTC()
		if err != nil {
			r.res.Notes = append(r.res.Notes, "run ended early: "+err.Error())
		}
		err = errors.Join(err, r.res.Save(filepath.Join(dir, "results.json")), writeLoopbackReport(dir, r.res))
	}()

	if err := r.startServers(ctx, work); err != nil {
		return dir, err
	}
	r.res.Variants = []string{"direct"}
	type build struct {
		name, bin   string
		env, sflags []string
	}
	builds := []build{{"quictun", opts.BinDir, benchDaemonEnv(opts.Env), nil}}
	if opts.BinDirB != "" || len(opts.EnvB) > 0 || len(opts.ServerArgsB) > 0 {
		bin := cmp.Or(opts.BinDirB, opts.BinDir)
		builds = append(builds, build{"quictun-b", bin, benchDaemonEnv(append(slices.Clone(opts.Env), opts.EnvB...)), opts.ServerArgsB})
	}
	if len(opts.RuntimeEnv) > 0 {
		for _, b := range slices.Clone(builds) {
			builds = append(builds, build{runtimeEnvName(b.name, opts.RuntimeEnv), b.bin, append(slices.Clone(b.env), opts.RuntimeEnv...), b.sflags})
		}
	}
	for _, b := range builds {
		r.res.Notes = append(r.res.Notes, b.name+" daemons' env added: "+cmp.Or(strings.Join(b.env, " "), "none"))
	}
	for _, b := range builds {
		t, err := r.startTunnel(ctx, work, b.name, b.bin, b.env, b.sflags)
		if t != nil {
			r.tunnels = append(r.tunnels, t)
		}
		if err != nil {
			return dir, err
		}
		r.res.Variants = append(r.res.Variants, b.name)
	}
	for ci, c := range opts.Cases {
		if c == LbRedis && r.redis == nil {
			r.res.Notes = append(r.res.Notes, "redis case skipped: redis-server or redis-benchmark not installed (apt-get install redis-server redis-tools)")
			continue
		}
		klog.InfoS("Started loopback case", "case", c)
		for rep := range opts.Reps {
			variants := r.res.Variants
			k := (ci + rep) % len(variants) // rotate who goes first
			for _, v := range append(slices.Clone(variants[k:]), variants[:k]...) {
				if ctx.Err() != nil {
					return dir, context.Cause(ctx)
				}
				r.res.Samples = append(r.res.Samples, r.sample(ctx, c, v, rep))
			}
		}
		_ = r.res.Save(filepath.Join(dir, "results.json"))
	}
	return dir, nil
}

// freeLoopbackPort returns a port of 127.0.0.1 that was free a moment ago.
func freeLoopbackPort(network string) (int, error) {
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func loopbackAddr(network string) (string, error) {
	p, err := freeLoopbackPort(network)
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

// startServers starts the echo/sink server and, when installed, redis.
func (r *lbRun) startServers(ctx context.Context, work string) error {
	var err error
	for _, svc := range []string{svcEcho, svcSink} {
		if r.dst[svc], err = loopbackAddr("tcp"); err != nil {
			return err
		}
	}
	bin, args := r.pin.wrap(sideServer, filepath.Join(r.opts.BinDir, "latency-client"), []string{"serve", "--listen", r.dst[svcEcho], "--sink-listen", r.dst[svcSink]})
	r.echo, err = StartProc("echo", "", filepath.Join(r.logDir, "echo.log"), bin, args...)
	if err != nil {
		return err
	}
	if err := waitTCP(ctx, r.dst[svcEcho], 10*time.Second); err != nil {
		return err
	}
	rs, err1 := exec.LookPath("redis-server")
	_, err2 := exec.LookPath("redis-benchmark")
	if err1 != nil || err2 != nil {
		return nil
	}
	if r.dst[svcRedis], err = loopbackAddr("tcp"); err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(r.dst[svcRedis])
	bin, args = r.pin.wrap(sideServer, rs, []string{"--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", work, "--protected-mode", "yes"})
	r.redis, err = StartProc("redis", "", filepath.Join(r.logDir, "redis.log"), bin, args...)
	if err != nil {
		return err
	}
	return waitTCP(ctx, r.dst[svcRedis], 10*time.Second)
}

// startTunnel starts one server and client pair of the binaries in bin,
// with a forward for each service; sflags are added to the server's flags.
func (r *lbRun) startTunnel(ctx context.Context, work, name, bin string, env, sflags []string) (*lbTunnel, error) {
	state := filepath.Join(work, name+"-state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, err
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	secret := filepath.Join(work, name+"-secret")
	if err := os.WriteFile(secret, []byte(base64.StdEncoding.EncodeToString(raw)+"\n"), 0o600); err != nil {
		return nil, err
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(fctx, filepath.Join(bin, "quictun-server"), "fingerprint", "--state-dir", state).Output()
	if err != nil {
		return nil, fmt.Errorf("%s: quictun-server fingerprint: %w", name, err)
	}
	fp := strings.TrimSpace(string(out))
	udp, err := loopbackAddr("udp")
	if err != nil {
		return nil, err
	}
	t := &lbTunnel{name: name, fwd: map[string]string{}}
	var allow, fwds []string
	for _, svc := range []string{svcEcho, svcSink, svcRedis} {
		if r.dst[svc] == "" {
			continue
		}
		if t.fwd[svc], err = loopbackAddr("tcp"); err != nil {
			return nil, err
		}
		allow = append(allow, "tcp:"+r.dst[svc])
		fwds = append(fwds, "--forward", "tcp:"+t.fwd[svc]+"=tcp:"+r.dst[svc])
	}
	sargs := append([]string{"--listen-on", udp, "--state-dir", state, "--secret-file", secret,
		"--allow", strings.Join(allow, ","), "--httpd-listen-on", ""}, r.opts.ServerArgs...)
	sargs = append(sargs, sflags...)
	sbin, sargs := r.pin.wrap(sideServer, filepath.Join(bin, "quictun-server"), sargs)
	if t.server, err = startProcEnv(name+"-server", "", filepath.Join(r.logDir, name+"-server.log"), env, sbin, sargs...); err != nil {
		return nil, err
	}
	cargs := append(append([]string{"--server-endpoint", udp, "--server-fingerprint", fp, "--secret-file", secret,
		"--httpd-listen-on", ""}, fwds...), r.opts.ClientArgs...)
	cbin, cargs := r.pin.wrap(sideClient, filepath.Join(bin, "quictun-client"), cargs)
	if t.client, err = startProcEnv(name+"-client", "", filepath.Join(r.logDir, name+"-client.log"), env, cbin, cargs...); err != nil {
		t.server.Stop(time.Second)
		return nil, err
	}
	if err := waitTCP(ctx, t.fwd[svcEcho], 20*time.Second); err != nil {
		return t, fmt.Errorf("%s: %w", name, err)
	}
	// A first exchange, so the QUIC connection is up before any sample.
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	defer lcancel()
	host, port, _ := net.SplitHostPort(t.fwd[svcEcho])
	if _, err := runInNS(lctx, "", r.lcLog, filepath.Join(r.opts.BinDir, "latency-client"),
		"--server-host", host, "--server-port", port, "--number", "10", "--json"); err != nil {
		return t, fmt.Errorf("%s: no echo through the tunnel: %w", name, err)
	}
	return t, nil
}

// waitTCP waits until addr accepts connections.
func waitTCP(ctx context.Context, addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not accept connections within %v: %w", addr, limit, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// target returns where variant v reaches service svc, and the PIDs of its
// tunnel daemons (none for direct).
func (r *lbRun) target(v, svc string) (addr string, pids []int) {
	for _, t := range r.tunnels {
		if t.name == v {
			return t.fwd[svc], []int{t.client.PID(), t.server.PID()}
		}
	}
	return r.dst[svc], nil
}

// switchesOf sums the voluntary context switches (a thread went to sleep and
// was woken later) of every thread of pids.
func switchesOf(pids []int) int64 {
	var n int64
	for _, p := range pids {
		if v, _, err := procstat.ContextSwitches(p); err == nil {
			n += v
		}
	}
	return n
}

// sample runs one case for one variant and returns its sample. Every sample
// records wall time, the tunnel daemons' CPU seconds (tunnel_cpu_s) and the
// servers' and load generator's (app_cpu_s).
func (r *lbRun) sample(ctx context.Context, c, v string, rep int) Sample {
	s := Sample{Scenario: "loopback", Link: "loopback", Case: c, Variant: v, Rep: rep, Started: time.Now().UTC(), Metrics: map[string]float64{}}
	svc := svcEcho
	switch c {
	case LbRedis:
		svc = svcRedis
	case LbBulk, LbBulkDown:
		svc = svcSink
	}
	addr, pids := r.target(v, svc)
	servers := []int{r.echo.PID()}
	if r.redis != nil {
		servers = append(servers, r.redis.PID())
	}
	host, port, _ := net.SplitHostPort(addr)
	tun0, srv0, sw0, t0 := cpuOf(pids), cpuOf(servers), switchesOf(pids), time.Now()
	var gen float64 // the load generator's CPU seconds
	var ops float64 // round trips, connections or requests of the sample
	var err error
	lc := func(v any, args ...string) {
		var out []byte
		out, gen, err = r.runTool(ctx, 10*time.Minute, filepath.Join(r.opts.BinDir, "latency-client"),
			append(append([]string{}, args...), "--server-host", host, "--server-port", port, "--json")...)
		if _, perr := parseJSON(out, v); perr != nil {
			err = errors.Join(perr, err)
		}
	}
	scale := 1 // the work of a case, divided by 20 for a smoke run
	if r.opts.Smoke {
		scale = 20
	}
	n := func(v int) string { return strconv.Itoa(max(v/scale, 1)) }
	switch c {
	case LbPingPong, LbQPS, LbEcho, LbReq16M:
		args := map[string][]string{
			LbPingPong: {"--size", "1000", "--number", n(1000)},
			LbQPS:      {"--size", "128", "--number", n(5000)},
			LbEcho:     {"--size", "1KB", "--number", n(1000), "--connections", "8"},
			LbReq16M:   {"--size", "16MiB", "--number", n(8)},
		}[c]
		var p ProbeResult
		lc(&p, args...)
		for k, val := range ProbeMetrics(p) {
			s.Metrics[k] = val
		}
		ops = float64(p.RoundTrips)
		if e := ProbeError(p); e != "" {
			err = errors.Join(err, errors.New(e))
		}
	case LbConnrate:
		var cr ConnrateResult
		lc(&cr, "connrate", "--number", n(3000), "--size", "100", "--concurrency", "8")
		s.Metrics["conns_per_s"] = cr.ConnectionsPerS
		s.Metrics["first_byte_p50_ms"] = cr.FirstByte.P50MS
		ops = float64(cr.Completed)
		if cr.Errors > 0 {
			err = errors.Join(err, fmt.Errorf("%d connection(s) failed: %s", cr.Errors, cr.FirstError))
		}
	case LbBulk, LbBulkDown:
		var b BulkResult
		dir := map[string]string{LbBulk: "up", LbBulkDown: "down"}[c]
		lc(&b, "bulk", "--direction", dir, "--duration", (4 * time.Second / time.Duration(scale)).String())
		s.Metrics["mbit_per_s"] = b.MbitPerS
		s.Metrics["bytes"] = float64(b.Bytes)
		if !b.Verified || b.Errors > 0 {
			err = errors.Join(err, fmt.Errorf("bulk: verified=%v errors=%d", b.Verified, b.Errors))
		}
	case LbRedis:
		var rps map[string]float64
		reqs := redisRequests / scale
		rps, gen, err = r.redisBenchmark(ctx, host, port, reqs)
		for k, val := range rps {
			s.Metrics[k] = val
		}
		ops = float64(2 * reqs)
	}
	wall := time.Since(t0).Seconds()
	s.Metrics["wall_s"] = wall
	s.Metrics["tunnel_cpu_s"] = cpuOf(pids) - tun0
	s.Metrics["tunnel_wakeups"] = float64(switchesOf(pids) - sw0)
	s.Metrics["app_cpu_s"] = cpuOf(servers) - srv0 + gen
	if ops > 0 && len(pids) > 0 {
		s.Metrics["tunnel_cpu_us_per_op"] = s.Metrics["tunnel_cpu_s"] / ops * 1e6
		s.Metrics["tunnel_wakeups_per_op"] = s.Metrics["tunnel_wakeups"] / ops
	}
	if b := s.Metrics["bytes"]; b > 0 && len(pids) > 0 {
		s.Metrics["tunnel_cpu_s_per_gb"] = s.Metrics["tunnel_cpu_s"] / (b / 1e9)
	}
	if err != nil {
		s.Error = err.Error()
		klog.InfoS("Sample had an error", "case", c, "variant", v, "err", err)
	}
	return s
}

// runTool runs a load generator and returns its stdout and CPU seconds.
func (r *lbRun) runTool(ctx context.Context, timeout time.Duration, bin string, args ...string) ([]byte, float64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	fmt.Fprintf(r.lcLog, "# %s %s\n", bin, strings.Join(args, " "))
	bin, args = r.pin.wrap(sideClient, bin, args)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, r.lcLog
	err := cmd.Run()
	var cpu float64
	if cmd.ProcessState != nil {
		cpu = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	}
	return stdout.Bytes(), cpu, err
}

// redisRequests is redis-benchmark's -n: requests of each of its two tests.
const redisRequests = 20000

// redisBenchmark runs redis-benchmark's SET and GET tests with 50 clients,
// requests each, and returns requests per second of each (set_rps, get_rps).
func (r *lbRun) redisBenchmark(ctx context.Context, host, port string, requests int) (map[string]float64, float64, error) {
	out, cpu, err := r.runTool(ctx, 5*time.Minute, "redis-benchmark", "-h", host, "-p", port,
		"-n", strconv.Itoa(requests), "-c", "50", "-t", "set,get", "--csv")
	if err != nil {
		return nil, cpu, fmt.Errorf("redis-benchmark: %w", err)
	}
	rps, perr := parseRedisCSV(out)
	return rps, cpu, perr
}

// parseRedisCSV reads redis-benchmark --csv output: a header line, then
// "test","rps",... per test.
func parseRedisCSV(out []byte) (map[string]float64, error) {
	rd := csv.NewReader(bufio.NewReader(bytes.NewReader(out)))
	rd.FieldsPerRecord = -1
	recs, err := rd.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("parse redis-benchmark output: %w", err)
	}
	m := map[string]float64{}
	for _, rec := range recs {
		if len(rec) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(rec[1], 64)
		if err != nil {
			continue // the header
		}
		m[strings.ToLower(rec[0])+"_rps"] = v
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("no figures in redis-benchmark output %q", out)
	}
	return m, nil
}

// loopbackFigures are the headline metrics of each case, in report order.
var loopbackFigures = map[string][]string{
	LbPingPong: {"total_ms", "p50_ms", "p99_ms"},
	LbQPS:      {"tps", "p50_ms"},
	LbEcho:     {"tps", "p99_ms"},
	LbReq16M:   {"mbit_per_s"},
	LbConnrate: {"conns_per_s", "first_byte_p50_ms"},
	LbRedis:    {"set_rps", "get_rps"},
	LbBulk:     {"mbit_per_s", "tunnel_cpu_s_per_gb"},
	LbBulkDown: {"mbit_per_s", "tunnel_cpu_s_per_gb"},
}

// writeLoopbackReport writes report.md: for each case and metric, the
// median (min-max) of each variant and each tunnel's ratio to direct, then
// the CPU seconds of the tunnel daemons and of the rest beside each case.
func writeLoopbackReport(dir string, res *Results) error {
	agg := Aggregate(res.Samples)
	var b strings.Builder
	fmt.Fprintf(&b, "# quictun loopback benchmark\n\nRun %s to %s UTC. Figures are measurements, not pass/fail criteria.\n\n",
		res.Started.Format("2006-01-02 15:04:05"), res.Finished.Format("15:04:05"))
	fmt.Fprintf(&b, "| | |\n|---|---|\n| host | %s |\n| kernel | %s |\n| CPU | %s × %d |\n| load at start | %s |\n",
		res.Machine.Hostname, res.Machine.Kernel, res.Machine.CPUModel, res.Machine.CPUs, res.Machine.Load)
	if rt := res.Runtime; rt != nil {
		fmt.Fprintf(&b, "| daemons' Go runtime environment (every variant, inherited) | %s |\n", rt.Inherited)
		if rt.Tuned != "" {
			fmt.Fprintf(&b, "| tuned variants (`--runtime-env`, named `…-env(…)`; not the headline) | %s added |\n", rt.Tuned)
		}
		fmt.Fprintf(&b, "| CPU pinning | %s |\n", rt.Pinning)
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range res.Tools {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(&b, "| %s | %s |\n", k, res.Tools[k])
	}
	fmt.Fprintf(&b, "\nMethod: every process on this host's loopback. `direct` connects to the server itself; a quictun variant "+
		"connects to quictun-client's forward, which carries it over one QUIC connection (loopback UDP) to quictun-server, "+
		"which connects to the server; the daemons run with their defaults (the server's audit line per tunnel included, as users get it) "+
		"plus the args listed below. Variants alternate within each repetition (the first rotates); %d repetitions; "+
		"cells are median (min–max). CPU: seconds used during the sample by both quictun daemons (tunnel) and by the servers "+
		"and the load generator (app); per op: per round trip, connection or redis request; wakeups: the daemons' voluntary context switches (a thread slept and was woken). The machine's cores are shared by all of them.\n\n", res.Reps)
	for _, n := range res.Notes {
		if n != "" {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	tunnels := slices.DeleteFunc(slices.Clone(res.Variants), func(v string) bool { return v == "direct" })
	fmt.Fprintf(&b, "\n| case | metric | direct |")
	for _, t := range tunnels {
		fmt.Fprintf(&b, " %s | ratio |", t)
	}
	b.WriteString("\n|---|---|---|")
	for range tunnels {
		b.WriteString("---|---|")
	}
	b.WriteString("\n")
	cell := func(s Summary, ok bool) string {
		if !ok {
			return "–"
		}
		e := ""
		if s.Errors > 0 {
			e = fmt.Sprintf(" ⚠%d", s.Errors)
		}
		return fmt.Sprintf("%s (%s–%s)%s", fmtNum(s.Median), fmtNum(s.Min), fmtNum(s.Max), e)
	}
	cases := map[string]bool{}
	for _, s := range res.Samples {
		cases[s.Case] = true
	}
	for _, c := range LoopbackCases() {
		if !cases[c] {
			continue
		}
		for _, m := range append(slices.Clone(loopbackFigures[c]), "tunnel_cpu_s", "tunnel_cpu_us_per_op", "tunnel_wakeups_per_op", "app_cpu_s", "wall_s") {
			d, dok := agg[Key{"loopback", "loopback", c, "direct", m}]
			fmt.Fprintf(&b, "| %s | %s | %s |", c, m, cell(d, dok))
			for _, t := range tunnels {
				q, qok := agg[Key{"loopback", "loopback", c, t, m}]
				ratio := "–"
				if dok && qok && d.Median != 0 && !strings.HasPrefix(m, "tunnel_") {
					ratio = fmt.Sprintf("%.2f", q.Median/d.Median)
				}
				fmt.Fprintf(&b, " %s | %s |", cell(q, qok), ratio)
			}
			b.WriteString("\n")
		}
	}
	var errs []string
	for _, s := range res.Samples {
		if s.Error != "" {
			errs = append(errs, fmt.Sprintf("- %s %s rep %d: %s", s.Case, s.Variant, s.Rep, s.Error))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(&b, "\n## Errors\n\n%s\n", strings.Join(errs, "\n"))
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(b.String()), 0o644)
}
