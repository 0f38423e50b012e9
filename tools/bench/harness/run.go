package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/tools/linkem/emu"
	"github.com/quictun/quictun/tools/linkem/netns"
)

// Options configure a run.
type Options struct {
	Profile    Profile
	BinDir     string   // latency-client and quictun binaries
	BinDirB    string   // another build of the daemons, run as variant quictun-b (before/after in one run)
	ResultsDir string   // parent of the <date> directory
	Prefix     string   // namespace prefix
	Variants   []string // empty: every available one
	Scenarios  []string // empty: the profile's
	Reps       int      // 0: the profile's
	ServerArgs []string // extra quictun-server flags
	ClientArgs []string // extra quictun-client flags
	SkipChecks bool     // skip the link validation
	TCPCC      string   // net.ipv4.tcp_congestion_control in both namespaces ("": keep the kernel default)
	// Congestion: quictun --congestion values, one variant quictun-<cc>
	// each (nil: the profile's; empty, not nil: one "quictun" without the flag).
	Congestion []string
	// DirectCC: TCP congestion controls of direct TCP, one variant
	// direct-<cc> each (nil: the profile's; empty, not nil: one "direct").
	DirectCC []string
	Spin     time.Duration
	// RuntimeEnv, when set, adds a tuned variant of each quictun build:
	// the same daemons with these NAME=VALUE settings added to their
	// environment, named after them (runtimeEnvName). The plain variants
	// run with the harness's own environment (Go's defaults unless set).
	RuntimeEnv []string
	// NoPin leaves every process unpinned (see cpuPin).
	NoPin bool
	Now   func() time.Time
}

// Runner holds a run's state.
type Runner struct {
	opts    Options
	prof    Profile
	env     Env
	ctl     *emu.Control
	topo    *netns.Topology
	echo    *Proc
	vars    []Variant
	cur     string // the scenario running (see ordered)
	res     *Results
	outDir  string
	lcLog   io.Writer
	started time.Time
}

// Run performs a benchmark run and returns its output directory. It tears
// everything down before returning, also on error or when ctx is cancelled.
func Run(ctx context.Context, opts Options) (dir string, err error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	r := &Runner{opts: opts, prof: opts.Profile, started: opts.Now()}
	if opts.Reps > 0 {
		r.prof.Reps = opts.Reps
		r.prof.BlackoutReps = min(r.prof.BlackoutReps, opts.Reps)
	}
	if len(opts.Scenarios) > 0 {
		r.prof.Scenarios = opts.Scenarios
	}
	if len(r.opts.Variants) == 0 {
		r.opts.Variants = r.prof.Variants
	}
	if opts.Congestion != nil {
		r.prof.Congestion = opts.Congestion
	}
	if opts.DirectCC != nil {
		r.prof.DirectCC = opts.DirectCC
	}
	if err := r.preflight(); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, r.prof.MaxDuration)
	defer cancel()

	r.outDir = filepath.Join(opts.ResultsDir, r.started.UTC().Format("2006-01-02T150405Z"))
	raw := filepath.Join(r.outDir, "raw")
	if err := os.MkdirAll(raw, 0o755); err != nil {
		return "", fmt.Errorf("create output dir: %w", err)
	}
	lcLog, err := os.Create(filepath.Join(raw, "latency-client.log"))
	if err != nil {
		return "", fmt.Errorf("create log: %w", err)
	}
	defer lcLog.Close()
	r.lcLog = lcLog
	work, err := os.MkdirTemp("", "quictun-bench-")
	if err != nil {
		return "", fmt.Errorf("create work dir: %w", err)
	}
	defer os.RemoveAll(work)

	r.res = &Results{Version: 1, Profile: r.prof.Name, Started: r.started.UTC(), Machine: machineInfo(),
		Tools: toolVersions(ctx, opts.BinDir), Reps: r.prof.Reps}
	var pinDesc string
	r.env.Pin, pinDesc = hostPinPlan(!opts.NoPin, runtime.NumCPU())
	r.res.Runtime = runtimeInfo(os.Environ(), opts.RuntimeEnv, pinDesc+"; the harness (emulator and download readers) is not pinned")
	defer func() {
		r.res.Finished = opts.Now().UTC()
		if err != nil {
			r.res.Notes = append(r.res.Notes, "run ended early: "+err.Error())
		}
		if serr := r.res.Save(filepath.Join(r.outDir, "results.json")); serr != nil {
			err = errors.Join(err, serr)
		}
		if rerr := WriteReport(r.outDir, r.res); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()

	// Topology and emulator. Existing namespaces of the prefix are not
	// touched (another run may own them): Setup refuses them.
	topo, err := netns.Setup(ctx, opts.Prefix)
	if err != nil {
		return r.outDir, fmt.Errorf("set up namespaces: %w", err)
	}
	r.topo = topo
	r.env = Env{ClientNS: topo.Client.NS, ServerNS: topo.Server.NS, ServerIP: netns.ServerIP,
		BinDir: opts.BinDir, WorkDir: work, LogDir: raw, Pin: r.env.Pin}
	c2s, s2c := emu.NewLink(emu.DefaultParams(), 1), emu.NewLink(emu.DefaultParams(), 2)
	r.ctl = emu.NewControl(c2s, s2c, emu.RealClock())
	fwd := emu.NewForwarder(topo.Client.TUN, topo.Server.TUN, c2s, s2c)
	if opts.Spin >= 0 {
		fwd.Spin = opts.Spin
	}
	fctx, stopFwd := context.WithCancel(context.WithoutCancel(ctx))
	fwdDone := make(chan error, 1)
	go func() { fwdDone <- fwd.Run(fctx, topo.Close) }()
	defer func() {
		for _, v := range r.vars {
			v.Stop()
		}
		if r.echo != nil {
			r.echo.Stop(5 * time.Second)
		}
		stopFwd()
		if ferr := <-fwdDone; ferr != nil {
			err = errors.Join(err, ferr)
		}
		if terr := netns.Teardown(context.Background(), opts.Prefix); terr != nil {
			err = errors.Join(err, terr)
		}
		cns, sns := netns.Names(opts.Prefix)
		if netns.Exists(cns) || netns.Exists(sns) {
			err = errors.Join(err, fmt.Errorf("namespaces %s/%s still exist after teardown", cns, sns))
		}
		klog.InfoS("Tore down the testbed", "prefix", opts.Prefix)
	}()
	cc, err := setTCPCC([]string{topo.Client.NS, topo.Server.NS}, opts.TCPCC)
	if err != nil {
		return r.outDir, err
	}
	r.res.Machine.TCPCongestion = cc

	if !opts.SkipChecks {
		r.validate(ctx)
		_ = r.res.Save(filepath.Join(r.outDir, "results.json"))
	}
	if err := r.startEndpoints(ctx); err != nil {
		return r.outDir, err
	}
	for _, sc := range r.prof.Scenarios {
		if ctx.Err() != nil {
			break
		}
		klog.InfoS("Started scenario", "scenario", sc)
		if err := r.scenario(ctx, sc); err != nil {
			return r.outDir, fmt.Errorf("scenario %s: %w", sc, err)
		}
		_ = r.res.Save(filepath.Join(r.outDir, "results.json"))
	}
	if ctx.Err() != nil {
		return r.outDir, fmt.Errorf("run stopped: %w", context.Cause(ctx))
	}
	return r.outDir, nil
}

func (r *Runner) preflight() error {
	var errs []error
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("the benchmark needs root (namespaces, TUN)"))
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		errs = append(errs, fmt.Errorf("/dev/net/tun: %w", err))
	}
	if _, err := exec.LookPath("ip"); err != nil {
		errs = append(errs, fmt.Errorf("iproute2: %w", err))
	}
	if _, err := os.Stat(filepath.Join(r.opts.BinDir, "latency-client")); err != nil {
		errs = append(errs, fmt.Errorf("latency-client not built (make build): %w", err))
	}
	if err := netns.ValidatePrefix(r.opts.Prefix); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// echoIdleTimeout is the echo and sink server's --idle-timeout: its
// default, 5 min, or longer than the resume scenario's blackout and
// recovery (its connections sit idle through the blackout, and a
// destination that gave up would end the tunnel the scenario measures).
func echoIdleTimeout(p Profile) time.Duration {
	return max(5*time.Minute, p.Resume.Blackout+p.Resume.Recovery+time.Minute)
}

// startEndpoints starts the echo/sink server and every variant.
func (r *Runner) startEndpoints(ctx context.Context) error {
	var err error
	bin, args := r.env.Pin.wrap(sideServer, r.env.bin("latency-client"), []string{"serve", "--listen", fmt.Sprintf("0.0.0.0:%d", EchoPort),
		"--sink-listen", fmt.Sprintf("0.0.0.0:%d", SinkPort), "--max-connections", "8192", "--idle-timeout", echoIdleTimeout(r.prof).String()})
	r.echo, err = StartProc("latency-client-serve", r.env.ServerNS, filepath.Join(r.env.LogDir, "latency-client-serve.log"), bin, args...)
	if err != nil {
		return err
	}
	r.setLink(ctx, LinkOf("LAN", LANDelay, 0, ""))
	if err := waitEcho(ctx, r.env.ClientNS, net.JoinHostPort(r.env.ServerIP, fmt.Sprint(EchoPort)), 20*time.Second); err != nil {
		return fmt.Errorf("echo server: %w", err)
	}
	cands, err := r.candidates(ctx)
	if err != nil {
		return err
	}
	for _, v := range cands {
		if !variantSelected(v.Name(), r.opts.Variants) {
			continue
		}
		if err := v.Start(ctx, &r.env); err != nil {
			v.Stop()
			if slices.Contains(r.opts.Variants, v.Name()) {
				return fmt.Errorf("start %s: %w", v.Name(), err)
			}
			r.res.Notes = append(r.res.Notes, fmt.Sprintf("%s failed to start, column skipped: %v", v.Name(), err))
			klog.InfoS("Variant failed to start", "variant", v.Name(), "err", err)
			continue
		}
		r.vars = append(r.vars, v)
		r.res.Variants = append(r.res.Variants, v.Name())
		klog.InfoS("Started variant", "variant", v.Name())
	}
	return nil
}

// candidates lists the variants of the run: direct TCP (one per DirectCC),
// kcptun when installed, and quictun (one per Congestion).
func (r *Runner) candidates(ctx context.Context) ([]Variant, error) {
	wanted := func(family string) bool {
		for _, v := range r.opts.Variants {
			if v == family || strings.HasPrefix(v, family+"-") {
				return true
			}
		}
		return false
	}
	var cands []Variant
	if len(r.prof.DirectCC) == 0 {
		cands = append(cands, &direct{})
	}
	for _, cc := range r.prof.DirectCC {
		cands = append(cands, &direct{CC: cc})
	}
	if KcptunAvailable() {
		cands = append(cands, &kcptun{})
	} else if wanted("kcptun") {
		return nil, errors.New("kcptun requested but kcptun-client/kcptun-server are not installed (apt-get install kcptun)")
	} else {
		r.res.Notes = append(r.res.Notes, "kcptun not installed: column skipped")
	}
	if !QuictunAvailable(r.opts.BinDir) {
		if wanted("quictun") {
			return nil, fmt.Errorf("quictun requested but %s/quictun-{server,client} are not built", r.opts.BinDir)
		}
		r.res.Notes = append(r.res.Notes, "quictun binaries not built: column skipped")
		return cands, nil
	}
	ccs := r.prof.Congestion
	if len(ccs) > 0 && !QuictunHasFlag(ctx, r.opts.BinDir, "--congestion") {
		note := fmt.Sprintf("quictun-server/quictun-client in %s have no --congestion flag: ran one variant \"quictun\" with the binaries' built-in congestion control instead of %s",
			r.opts.BinDir, strings.Join(prefixed("quictun-", ccs), ", "))
		r.res.Notes = append(r.res.Notes, note)
		klog.InfoS("No --congestion flag in the quictun binaries: running plain quictun", "bin", r.opts.BinDir)
		ccs = nil
	}
	if len(ccs) == 0 {
		ccs = []string{""}
	}
	for i, cc := range ccs {
		q := &quictun{ServerArgs: r.opts.ServerArgs, ClientArgs: r.opts.ClientArgs, Congestion: cc, Instance: i}
		cands = append(cands, q)
		// Opt-in (named in --variants): the same daemons through a SOCKS5 entry point.
		if s := (&quictunSOCKS{q: q}); slices.Contains(r.opts.Variants, s.Name()) {
			q.SOCKS = true
			cands = append(cands, s)
		}
	}
	// Opt-in (named in --variants): a reverse tunnel, latency only.
	if rv := (&quictunReverse{ServerArgs: r.opts.ServerArgs, ClientArgs: r.opts.ClientArgs}); slices.Contains(r.opts.Variants, rv.Name()) {
		if !QuictunHasFlag(ctx, r.opts.BinDir, "--remote-forward") {
			return nil, fmt.Errorf("%s requested but quictun-client in %s has no --remote-forward", rv.Name(), r.opts.BinDir)
		}
		cands = append(cands, rv)
	}
	if r.opts.BinDirB != "" {
		if !QuictunAvailable(r.opts.BinDirB) {
			return nil, fmt.Errorf("--bin-b: %s/quictun-{server,client} are not built", r.opts.BinDirB)
		}
		// The second build runs with the first congestion controller named.
		cands = append(cands, &quictun{ServerArgs: r.opts.ServerArgs, ClientArgs: r.opts.ClientArgs, Congestion: ccs[0],
			Instance: len(ccs), BinDir: r.opts.BinDirB, Label: "quictun-b"})
	}
	return append(cands, r.tunedVariants(cands)...), nil
}

// tunedVariants returns, with --runtime-env, a copy of the first quictun
// variant of each build among cands with the tuned environment and its
// own ports (instance), named after the environment.
func (r *Runner) tunedVariants(cands []Variant) []Variant {
	if len(r.opts.RuntimeEnv) == 0 {
		return nil
	}
	var out []Variant
	next, seen := 0, map[string]bool{}
	for _, c := range cands {
		if q, ok := c.(*quictun); ok {
			next = max(next, q.Instance+1)
		}
	}
	for _, c := range cands {
		q, ok := c.(*quictun)
		if !ok || seen[q.BinDir] {
			continue
		}
		seen[q.BinDir] = true
		out = append(out, &quictun{ServerArgs: q.ServerArgs, ClientArgs: q.ClientArgs, Congestion: q.Congestion,
			Instance: next, BinDir: q.BinDir, Label: q.Label, Env: r.opts.RuntimeEnv})
		next++
	}
	return out
}

func prefixed(p string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = p + n
	}
	return out
}

// variantSelected tells whether variant name is among sel, by name or by
// family (the part before the first '-': "quictun" selects quictun-bbr).
// An empty sel selects everything.
func variantSelected(name string, sel []string) bool {
	if len(sel) == 0 {
		return true
	}
	family, _, _ := strings.Cut(name, "-")
	for _, s := range sel {
		if s == name || s == family {
			return true
		}
	}
	return false
}

// Per-direction link parameters: a LinkSpec parameter named c2sPrefix+NAME
// (client to server, "up") or s2cPrefix+NAME (server to client, "down")
// applies to that direction only and wins over NAME, as linkem's
// --c2s-NAME and --s2c-NAME flags.
const (
	c2sPrefix = "c2s-"
	s2cPrefix = "s2c-"
)

// linkUpdate is the emulator update for spec: every parameter reset to
// its default in both directions, then spec's parameters for both
// directions, then its per-direction ones.
func linkUpdate(spec LinkSpec) emu.ConfigUpdate {
	u := emu.ConfigUpdate{Both: map[string]any{}}
	for k, v := range emu.DefaultParams().ToMap() {
		u.Both[k] = v
	}
	for k, v := range spec.Params {
		if name, ok := strings.CutPrefix(k, c2sPrefix); ok {
			if u.C2S == nil {
				u.C2S = map[string]any{}
			}
			u.C2S[name] = v
		} else if name, ok := strings.CutPrefix(k, s2cPrefix); ok {
			if u.S2C == nil {
				u.S2C = map[string]any{}
			}
			u.S2C[name] = v
		} else {
			u.Both[k] = v
		}
	}
	return u
}

// setLink applies spec (see linkUpdate), resetting every other parameter.
func (r *Runner) setLink(ctx context.Context, spec LinkSpec) {
	if err := r.ctl.Apply(linkUpdate(spec)); err != nil {
		// Specs are built by the profile; an invalid one is a bug.
		panic(fmt.Sprintf("invalid link %s: %v", spec.Name, err))
	}
	found := false
	for _, l := range r.res.Links {
		found = found || l.Name == spec.Name
	}
	if !found {
		r.res.Links = append(r.res.Links, spec)
	}
	// Let queues from the previous setting drain.
	select {
	case <-ctx.Done():
	case <-time.After(300 * time.Millisecond):
	}
}

// sweep runs fn for every link, case (0..cases-1), repetition and
// variant, in that nesting. Each link is applied once, before its cases;
// the variant order rotates with every (link, case, repetition), so each
// variant goes first in turn (see ordered). It returns early when ctx
// ends.
func (r *Runner) sweep(ctx context.Context, links []LinkSpec, cases int, fn func(link LinkSpec, cs, rep int, v Variant)) {
	i := 0
	for _, link := range links {
		r.setLink(ctx, link)
		for cs := range cases {
			for rep := range r.prof.Reps {
				i++
				for _, v := range r.ordered(i) {
					if ctx.Err() != nil {
						return
					}
					fn(link, cs, rep, v)
				}
			}
		}
	}
}

// ordered returns the variants rotated by i, so each variant goes first in
// turn (interleaving without a fixed order bias). Variants measured in
// other scenarios only (scenarioVariant) are left out.
func (r *Runner) ordered(i int) []Variant {
	var vars []Variant
	for _, v := range r.vars {
		if inScenario(v, r.cur) {
			vars = append(vars, v)
		}
	}
	n := len(vars)
	out := make([]Variant, 0, n)
	for k := range n {
		out = append(out, vars[(k+i)%n])
	}
	return out
}

// latencyClient runs bin/latency-client in the client namespace and
// decodes its JSON into v. A run that measured an error (exit 1) still
// returns its JSON, with the error.
func (r *Runner) latencyClient(ctx context.Context, timeout time.Duration, v any, args ...string) (json []byte, runErr error, err error) {
	return r.latencyClientIn(ctx, r.env.ClientNS, timeout, v, args...)
}

// latencyClientIn is latencyClient in namespace ns.
func (r *Runner) latencyClientIn(ctx context.Context, ns string, timeout time.Duration, v any, args ...string) (json []byte, runErr error, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, rerr := runInNS(ctx, ns, r.lcLog, r.env.bin("latency-client"), append(args, "--json")...)
	raw, perr := parseJSON(out, v)
	if perr != nil {
		return nil, nil, errors.Join(perr, rerr)
	}
	return raw, rerr, nil
}

// setTCPCC sets (when cc is not empty) and returns the TCP congestion
// control of the namespaces.
func setTCPCC(namespaces []string, cc string) (string, error) {
	const path = "/proc/sys/net/ipv4/tcp_congestion_control"
	var got string
	for _, ns := range namespaces {
		err := netns.Do(ns, func() error {
			if cc != "" {
				if err := os.WriteFile(path, []byte(cc), 0o644); err != nil {
					// Outside the initial namespace only algorithms listed in the
					// global net.ipv4.tcp_allowed_congestion_control may be set;
					// the harness does not change global settings.
					return fmt.Errorf("set tcp_congestion_control %s (must be listed in the global net.ipv4.tcp_allowed_congestion_control): %w", cc, err)
				}
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("read tcp_congestion_control: %w", err)
			}
			got = strings.TrimSpace(string(b))
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("namespace %s: %w", ns, err)
		}
	}
	return got, nil
}

func machineInfo() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.CPUModel = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				m.MemTotal = strings.TrimSpace(v)
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.Load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return m
}

func toolVersions(ctx context.Context, binDir string) map[string]string {
	out := map[string]string{}
	try := func(name string, args ...string) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		b, err := exec.CommandContext(cctx, args[0], args[1:]...).CombinedOutput()
		if err == nil {
			out[name] = strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
		}
	}
	try("latency-client", filepath.Join(binDir, "latency-client"), "version")
	try("quictun-server", filepath.Join(binDir, "quictun-server"), "version")
	try("quictun-client", filepath.Join(binDir, "quictun-client"), "version")
	if KcptunAvailable() {
		try("kcptun", "dpkg-query", "-W", "-f=${Version}", "kcptun")
	}
	return out
}
