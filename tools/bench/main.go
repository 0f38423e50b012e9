// Command bench runs the quictun benchmark harness (issue 3): direct TCP,
// kcptun and quictun on the same emulated link, and writes
// bench/runs/<date>/{report.md,results.json,*.png} (git-ignored; `bench reference`
// keeps one run per profile in bench/reference/). See bench/README.md.
package main

import (
	goflag "flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/pprof/profile"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/tools/bench/harness"
	"github.com/quictun/quictun/tools/bench/loadgen"
	"github.com/quictun/quictun/tools/bench/reference"
)

func main() {
	os.Exit(run())
}

func run() int {
	if err := newRootCommand().Execute(); err != nil {
		klog.ErrorS(err, "bench failed")
		klog.Flush()
		return 1
	}
	klog.Flush()
	return 0
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{Use: "bench", Short: "quictun benchmark harness", SilenceUsage: true}
	gfs := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(gfs)
	root.PersistentFlags().AddGoFlag(gfs.Lookup("v"))
	root.AddCommand(newRunCommand(), newLoopbackCommand(), newCompareCommand(), newReportCommand(), newFlameCommand(), newLoadgenCommand(), newScaleReportCommand(), newReferenceCommand())
	return root
}

func newRunCommand() *cobra.Command {
	var (
		profile, binDir, binDirB string
		out, prefix              string
		variants, scenarios      []string
		congestion, directCC     []string
		serverArgs, clientArgs   []string
		reps                     int
		skipChecks               bool
		tcpCC                    string
		spin, maxDuration        time.Duration
		fairDelay                time.Duration
		blackoutBulk             []time.Duration
		resumeTunnels            int
		resumeCases              []string
		resumeBlackout           time.Duration
		resumeTransfer           string
		resumeTransferSize       string
		resumeIdle               time.Duration
		resumePause              string
		lossLevels               []float64
		runtimeEnv               string
		pin                      bool
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run a profile (root: creates network namespaces) and write bench/runs/<date>/",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := harness.Profiles(profile)
			if err != nil {
				return err
			}
			if maxDuration > 0 {
				p.MaxDuration = maxDuration
			}
			if cmd.Flags().Changed("fair-delay") {
				if fairDelay < 0 {
					return fmt.Errorf("--fair-delay %v: must be 0 or more", fairDelay)
				}
				p.FairDelay = fairDelay
			}
			if len(blackoutBulk) > 0 {
				p.BlackoutBulkDurations = blackoutBulk
			}
			if err := applyResumeFlags(cmd.Flags(), &p.Resume, resumeFlags{resumeTunnels, resumeCases, resumeBlackout, resumeTransfer, resumeTransferSize, resumeIdle, resumePause}); err != nil {
				return err
			}
			if len(lossLevels) > 0 {
				if p.LossLinks, err = harness.LossLinks(lossLevels...); err != nil {
					return fmt.Errorf("--loss-levels: %w", err)
				}
			}
			renv, err := harness.ParseRuntimeEnv(runtimeEnv)
			if err != nil {
				return fmt.Errorf("--runtime-env: %w", err)
			}
			valid := map[string]bool{}
			for _, s := range harness.AllScenarios() {
				valid[s] = true
			}
			for _, s := range scenarios {
				if !valid[s] {
					return fmt.Errorf("--scenarios: unknown %q (want %v)", s, harness.AllScenarios())
				}
			}
			opts := harness.Options{
				Profile: p, BinDir: binDir, BinDirB: binDirB, ResultsDir: out, Prefix: prefix,
				Variants: variants, Scenarios: scenarios, Reps: reps,
				ServerArgs: serverArgs, ClientArgs: clientArgs, SkipChecks: skipChecks, Spin: spin, TCPCC: tcpCC,
				RuntimeEnv: renv, NoPin: !pin,
			}
			// Set but empty means "no per-controller variants"; unset means the profile's.
			if cmd.Flags().Changed("congestion") {
				opts.Congestion = nonEmpty(congestion)
			}
			if cmd.Flags().Changed("direct-cc") {
				opts.DirectCC = nonEmpty(directCC)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			dir, err := harness.Run(ctx, opts)
			if dir != "" {
				fmt.Printf("Report: %s/report.md\n", dir)
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&profile, "profile", "quick", "quick (a few minutes: latency, small bulk, one blackout, UDP blocked), cc (~17 minutes: bulk under loss, fairness, rate caps per client congestion controller, blackout under load, per congestion controller), loss (~55 minutes, issue 31: 100 Mbit/s, 25 ms RTT, 0-50 % random loss, three successive 10 s downloads per fresh tunnel, direct TCP BBR and Cubic, kcptun, quictun; fairness beside Cubic on a 30 and a 50 ms queue), stn (~20 minutes: seed 000's short connections on 3G, Edge and 30/50 % loss, size sweeps, new connections into 5-35 s blackouts; direct and quictun) resume (~10 minutes, issue 34: quictun's tunnels across a server and a client upgrade under the load of 100 tunnels, a 2 min blackout past a 30 s idle timeout and a client address change, each with a session and 100 MB each way) or full (every scenario)")
	fs.StringVar(&binDir, "bin", "bin", "directory with latency-client, quictun-server and quictun-client")
	fs.StringVar(&binDirB, "bin-b", "", "directory of another build of the daemons, run as variant quictun-b beside quictun (before/after in one run; select it with --variants ...,quictun-b)")
	fs.StringVar(&out, "out", "bench/runs", "results directory; each run writes <out>/<UTC date>/")
	fs.StringVar(&prefix, "prefix", "qb", "network namespace prefix (<prefix>-c, <prefix>-s)")
	fs.StringSliceVar(&variants, "variants", nil, "variants to run, by name (direct-cubic, quictun-bbr) or family (direct, kcptun, quictun); default: the profile's (stn: direct,quictun), else every available one. Opt-in: quictun-socks5 (the quictun daemons probed through a --proxy socks5: entry point), quictun-reverse (a reverse tunnel, --remote-forward, probed from the server host; latency scenario only)")
	fs.StringSliceVar(&scenarios, "scenarios", nil, "scenarios to run (latency,coldstart,after-idle,bulk,loss-bulk,fairness,ratecap,echo-tps,request-size,connrate,blackout,blackout-bulk,udp-blocked,scale,flood,stn-short,stn-sizes,stn-blackout,failover,resume); default: the profile's")
	fs.StringSliceVar(&congestion, "congestion", nil, "quictun --congestion values, one variant quictun-<cc> each, e.g. bbr,cubic,reno (default: the profile's; cc: bbr,cubic,reno, others none); --congestion= runs one quictun without the flag")
	fs.StringSliceVar(&directCC, "direct-cc", nil, "TCP congestion controls of direct TCP, one variant direct-<cc> each (server side set per route in the namespaces), e.g. cubic,bbr (default: the profile's; cc: cubic,bbr, others none: one direct with the namespaces' default)")
	fs.IntVar(&reps, "reps", 0, "repetitions per case (0: the profile's)")
	fs.StringSliceVar(&serverArgs, "quictun-server-arg", nil, "extra quictun-server flag (repeatable), e.g. --quictun-server-arg=--idle-timeout=60s")
	fs.StringSliceVar(&clientArgs, "quictun-client-arg", nil, "extra quictun-client flag (repeatable)")
	fs.BoolVar(&skipChecks, "skip-validation", false, "skip the emulator accuracy checks at the start")
	fs.StringVar(&tcpCC, "tcp-cc", "", "TCP congestion control in both namespaces, e.g. cubic or bbr (default: the kernel's, recorded in the report)")
	fs.DurationVar(&spin, "spin", time.Millisecond, "emulator spin window (see tools/linkem)")
	fs.DurationSliceVar(&blackoutBulk, "blackout-bulk-durations", nil, "blackout-bulk scenario: how long the link goes dark, e.g. 60s (default: the profile's)")
	fs.DurationVar(&fairDelay, "fair-delay", 0, "fairness scenario: start the competing direct TCP flow this long after the variant's (which runs that much longer), e.g. 5s, "+
		"and report how fast the variant's rate falls once it starts (yield_s: its 250 ms rate below half its rate of the second before, lastingly); needs more than 1 s plus the start-up; 0: together (default: the profile's, 0)")
	fs.IntVar(&resumeTunnels, "resume-tunnels", 0, "resume scenario: tunnels under load through each upgrade (default: the profile's: full 1000, resume 100)")
	fs.StringSliceVar(&resumeCases, "resume-cases", nil, "resume scenario: the cases to run, of "+strings.Join(harness.ResumeCases(), ",")+" (default: all)")
	fs.DurationVar(&resumeBlackout, "resume-blackout", 0, "resume scenario: how long the link goes dark in the blackout case; the resume window must cover it and the recovery (default: the profile's: full 5m past the 90s idle timeout, resume 2m past a 30s one)")
	fs.StringVar(&resumeTransfer, "resume-transfer", "each-way", "resume scenario: the outage cases' transfer: each-way (the profile's size written through the tunnel to the echo while its echo is read back, SHA-256 of both compared) or down (downloaded from the sink, count and CRC-32C checked)")
	fs.StringVar(&resumeTransferSize, "resume-transfer-size", "", "resume scenario: the outage cases' transfer size, e.g. 1GB or 100MB (default: the profile's: full 1GB, resume 100MB)")
	fs.StringVar(&resumePause, "resume-pause", "", "resume scenario: the upgrade cases' pause after each tunnel's round trip, drawn from MIN-MAX, e.g. 1s-2s for a lighter load of 1,000 tunnels (default: the profile's, 100ms-200ms)")
	fs.DurationVar(&resumeIdle, "resume-idle-timeout", 0, "resume scenario: both daemons' --idle-timeout in the blackout case; 0 leaves their default, 90s (default: the profile's: full their default, resume 30s)")
	fs.Float64SliceVar(&lossLevels, "loss-levels", nil, "loss scenario: the random loss rates of its links as fractions, e.g. 0,0.01 (default: the profile's: 0-0.5)")
	fs.DurationVar(&maxDuration, "max-duration", 0, "bound on the whole run (0: the profile's: quick 25m, full 4h)")
	addRuntimeFlags(fs, &runtimeEnv, &pin)
	return cmd
}

// addRuntimeFlags adds --runtime-env and --pin (issue 32).
func addRuntimeFlags(fs *pflag.FlagSet, runtimeEnv *string, pin *bool) {
	fs.StringVar(runtimeEnv, "runtime-env", "", "also run a tuned variant of each quictun build with these NAME=VALUE settings added to the daemons' environment, "+
		"named after them (quictun-env(GOMAXPROCS=1,...)), e.g. '"+harness.TunedRuntimeEnv+"' (what every figure before issue 32 silently had); "+
		"the plain variants always run with this process's environment (Go's defaults unless set)")
	fs.BoolVar(pin, "pin", true, "pin the client side (tunnel client daemon, load generator) and the server side (tunnel server daemon, echo/sink server) "+
		"to separate halves of the CPUs with taskset (2 CPUs: 0 and 1); --pin=false leaves placement to the kernel")
}

func newLoopbackCommand() *cobra.Command {
	var (
		o          harness.LoopbackOptions
		runtimeEnv string
		pin        bool
	)
	cmd := &cobra.Command{
		Use:   "loopback",
		Short: "Measure direct TCP and quictun on this host's loopback (no emulated link) and write bench/runs/loopback-<date>/",
		Long: "Runs an echo/sink server (and redis-server when installed), a quictun-server and quictun-client pair per build, " +
			"and the cases of issue 13 that need no emulated link: ping-pong, QPS of 128 B, echo TPS of 1 KB on 8 connections, " +
			"16 MiB echo throughput, new connections/s, redis-benchmark (50 clients) and bulk CPU per GB. Variants alternate " +
			"within each repetition; the daemons' CPU time is recorded beside each figure.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			renv, err := harness.ParseRuntimeEnv(runtimeEnv)
			if err != nil {
				return fmt.Errorf("--runtime-env: %w", err)
			}
			o.RuntimeEnv, o.NoPin = renv, !pin
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			dir, err := harness.RunLoopback(ctx, o)
			if dir != "" {
				fmt.Printf("Report: %s/report.md\n", dir)
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.BinDir, "bin", "bin", "directory with latency-client, quictun-server and quictun-client")
	fs.StringVar(&o.BinDirB, "bin-b", "", "directory of a second build of the daemons, run as variant quictun-b beside the first (before/after in one run)")
	fs.StringVar(&o.ResultsDir, "out", "bench/runs", "results directory; the run writes <out>/loopback-<UTC date>/")
	fs.IntVar(&o.Reps, "reps", 3, "repetitions per case")
	fs.StringSliceVar(&o.Cases, "cases", nil, "cases to run (default: all): "+strings.Join(harness.LoopbackCases(), ","))
	fs.StringSliceVar(&o.ServerArgs, "quictun-server-arg", nil, "extra quictun-server flag (repeatable)")
	fs.StringSliceVar(&o.ServerArgsB, "quictun-server-arg-b", nil, "extra quictun-server flag of quictun-b only (repeatable; with --bin-b, or alone: the same build with another configuration), e.g. --quictun-server-arg-b=--default-rate-limit=100Gbit")
	fs.StringSliceVar(&o.ClientArgs, "quictun-client-arg", nil, "extra quictun-client flag (repeatable)")
	fs.StringSliceVar(&o.Env, "quictun-env", nil, "extra environment of every quictun variant's daemons, e.g. GOMAXPROCS=2 (repeatable); nothing else is added (Go's defaults unless set); for a labelled tuned variant use --runtime-env")
	fs.StringSliceVar(&o.EnvB, "quictun-env-b", nil, "extra environment of quictun-b's daemons only (with --bin-b, or alone: the same build with another environment)")
	addRuntimeFlags(fs, &runtimeEnv, &pin)
	return cmd
}

func newLoadgenCommand() *cobra.Command {
	o := loadgen.DefaultOptions()
	cmd := &cobra.Command{
		Use:   "loadgen",
		Short: "Emulate N clients against a real quictun-server and write bench/runs/loadgen-<date>/ (tools/bench/loadgen/README.md)",
		Long: "Runs quictun-server from --bin and N emulated clients in this process, each the client library on its own " +
			"UDP socket and source address (127.0.0.2 upwards), and measures: full handshakes/s (connect at --concurrency), " +
			"the server's RSS, goroutines and CPU per idle client, a few tunnels, the time for every client to come back " +
			"after a SIGTERM and a SIGKILL restart of the server, 0-RTT handshakes/s (resume) and what is left on the " +
			"server after every client left. Prints the table of report.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Command = strings.Join(os.Args, " ")
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			dir, err := loadgen.Run(ctx, o)
			if dir != "" {
				if r, lerr := loadgen.LoadResults(dir); lerr == nil {
					r.WriteReport(os.Stdout)
				}
				fmt.Printf("\nReport: %s/report.md\n", dir)
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.BinDir, "bin", o.BinDir, "directory with quictun-server")
	fs.StringVar(&o.ResultsDir, "out", o.ResultsDir, "results directory; the run writes <out>/loadgen-<UTC date>/")
	fs.IntVarP(&o.Clients, "clients", "n", o.Clients, "emulated clients (N), one source address each")
	fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "clients connecting at once (handshake and hello in flight)")
	fs.DurationVar(&o.Idle, "idle", o.Idle, "how long the connected clients stay idle while the server's CPU is measured (span a keep-alive period: 25s)")
	fs.DurationVar(&o.Quiet, "quiet", o.Quiet, "wait before the idle measurement: a new connection heartbeats until it had no work for 5s")
	fs.IntVar(&o.Tunnels, "tunnels", o.Tunnels, "clients that open a tunnel to an echo server and exchange --tunnel-bytes")
	fs.IntVar(&o.TunnelBytes, "tunnel-bytes", o.TunnelBytes, "bytes each tunnel sends and reads back")
	fs.StringSliceVar(&o.Restarts, "restarts", o.Restarts, "server restarts, in order: term (SIGTERM: drain), kill (SIGKILL); --restarts= for none")
	fs.BoolVar(&o.Resume, "resume", o.Resume, "disconnect every client and connect them again with their session tickets (0-RTT handshakes/s)")
	fs.DurationVar(&o.KeepAlive, "keepalive", o.KeepAlive, "the clients' QUIC keep-alive period (0: the client's default, 25s): all an idle client sends")
	fs.DurationVar(&o.PhaseTimeout, "phase-timeout", o.PhaseTimeout, "bound on each phase that waits for the clients (connect, each restart, leave)")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "bound on the whole run")
	fs.DurationVar(&o.LeaveWait, "leave-wait", o.LeaveWait, "read the server's memory once more this long after every client left (e.g. 2m30s: past the 2-minute replay window, with time for Go's scavenger): what stays for good; 0 (default): not")
	fs.DurationVar(&o.GCWait, "gc-wait", o.GCWait, "after every client left, wait up to this long for the server's own next garbage collection (Go forces one every 2m) before reading its memory; 0 (default): ask the server for two collections at once (/debug/pprof/heap?gc=1)")
	fs.StringSliceVar(&o.ServerArgs, "quictun-server-arg", nil, "extra quictun-server flag (repeatable), e.g. --quictun-server-arg=--handshake-rate=5")
	fs.StringSliceVar(&o.ServerEnv, "quictun-env", nil, "extra environment of the server, e.g. GOMAXPROCS=2 (repeatable); nothing else is added (Go's defaults unless set)")
	return cmd
}

func newFlameCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "flame PROFILE OUT.cpuprofile",
		Short: "Write a pprof CPU profile's call tree as a .cpuprofile (V8) document, for a flame graph",
		Long: "Writes the call tree of a pprof CPU profile (e.g. from a daemon's /debug/pprof/profile) in the .cpuprofile " +
			"format that flame graph renderers read. An SVG: npx flamegraph@1.3.0 -t cpuprofile -f OUT.cpuprofile > OUT.svg",
		Args: cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			in, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer in.Close()
			p, err := profile.Parse(in)
			if err != nil {
				return fmt.Errorf("parse %s: %w", args[0], err)
			}
			out, err := os.Create(args[1])
			if err != nil {
				return err
			}
			if err := harness.WriteCPUProfileTree(p, out); err != nil {
				_ = out.Close()
				return err
			}
			return out.Close()
		},
	}
}

func newCompareCommand() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "compare OLD NEW",
		Short: "Print NEW/OLD ratios of every median (OLD/NEW: result directories or results.json files)",
		Args:  cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			o, err := harness.LoadResults(args[0])
			if err != nil {
				return err
			}
			n, err := harness.LoadResults(args[1])
			if err != nil {
				return err
			}
			return harness.Compare(os.Stdout, o, n, all)
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "compare every recorded metric, not only those in the report's tables")
	return cmd
}

func newScaleReportCommand() *cobra.Command {
	var in loadgen.ScaleInputs
	var out string
	cmd := &cobra.Command{
		Use:   "scale-report --loadgen DIR... --idle FILE... --out DIR",
		Short: "Write the server scale and idle sections (report.md and charts) from loadgen runs and idle-cost.sh results",
		Long: "Reads each --loadgen directory's results.json (bench loadgen) and each --idle file (OUT= of " +
			"scripts/idle-cost.sh) and writes --out/report.md: a \"Server scale\" table and charts (clients against the " +
			"server's RSS, live heap, stacks and idle CPU, handshakes per CPU-second, SIGKILL return) and an \"Idle\" table " +
			"(wake-ups a second per daemon, CPU, datagrams per keep-alive period). Globs are expanded.",
		Args: cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			var err error
			if in.Loadgen, err = expandGlobs(in.Loadgen); err != nil {
				return err
			}
			if in.Idle, err = expandGlobs(in.Idle); err != nil {
				return err
			}
			if err := loadgen.WriteScaleReport(out, in); err != nil {
				return err
			}
			fmt.Printf("Report: %s/report.md\n", out)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringSliceVar(&in.Loadgen, "loadgen", nil, "bench loadgen result directories (repeatable, comma-separated, globs)")
	fs.StringSliceVar(&in.Idle, "idle", nil, "scripts/idle-cost.sh result files (repeatable, comma-separated, globs)")
	fs.StringVar(&out, "out", "bench/runs/scale", "directory of report.md and the charts")
	return cmd
}

// expandGlobs expands each pattern (a name without a match is an error).
func expandGlobs(in []string) ([]string, error) {
	var out []string
	for _, p := range in {
		m, err := filepath.Glob(p)
		if err != nil {
			return nil, err
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("%s: no such file", p)
		}
		out = append(out, m...)
	}
	return out, nil
}

func newReportCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "report DIR",
		Short: "Rewrite DIR/report.md and charts from DIR/results.json",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			r, err := harness.LoadResults(args[0])
			if err != nil {
				return err
			}
			return harness.WriteReport(args[0], r)
		},
	}
}

// nonEmpty drops empty entries and returns a non-nil slice.
// resumeFlags are the --resume-* flags' values.
type resumeFlags struct {
	tunnels        int
	cases          []string
	blackout       time.Duration
	transfer, size string
	idle           time.Duration
	pause          string
}

// applyResumeFlags puts the --resume-* flags that were set into spec and
// validates it.
func applyResumeFlags(fs *pflag.FlagSet, spec *harness.ResumeSpec, f resumeFlags) error {
	switch f.transfer {
	case "each-way", "down":
		spec.TransferDown = f.transfer == "down"
	default:
		return fmt.Errorf("--resume-transfer %q: want each-way or down", f.transfer)
	}
	if fs.Changed("resume-tunnels") {
		spec.Tunnels = f.tunnels
	}
	if fs.Changed("resume-cases") {
		spec.Cases = f.cases
	}
	if fs.Changed("resume-blackout") {
		spec.Blackout = f.blackout
	}
	if fs.Changed("resume-idle-timeout") {
		if f.idle < 0 {
			return fmt.Errorf("--resume-idle-timeout %v: must be 0 or more", f.idle)
		}
		spec.IdleTimeout = f.idle
	}
	if fs.Changed("resume-pause") {
		lo, hi, ok := strings.Cut(f.pause, "-")
		minP, err1 := time.ParseDuration(lo)
		maxP, err2 := time.ParseDuration(hi)
		if !ok || err1 != nil || err2 != nil {
			return fmt.Errorf("--resume-pause %q: want MIN-MAX, e.g. 1s-2s", f.pause)
		}
		spec.PauseMin, spec.PauseMax = minP, maxP
	}
	if fs.Changed("resume-transfer-size") {
		n, err := harness.ParseSize(f.size)
		if err != nil {
			return fmt.Errorf("--resume-transfer-size: %w", err)
		}
		spec.Transfer = n
	}
	for _, name := range []string{"resume-tunnels", "resume-cases", "resume-blackout", "resume-idle-timeout", "resume-transfer-size", "resume-transfer", "resume-pause"} {
		if fs.Changed(name) {
			if err := spec.Validate(); err != nil {
				return fmt.Errorf("--resume-*: %w", err)
			}
			break
		}
	}
	return nil
}

func nonEmpty(in []string) []string {
	out := []string{}
	for _, s := range in {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func newReferenceCommand() *cobra.Command {
	var run, dir, profile string
	cmd := &cobra.Command{
		Use:   "reference",
		Short: "Keep a run as the reference of its profile: copy its report, notes and charts to bench/reference/PROFILE",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if run == "" || profile == "" {
				return fmt.Errorf("--run and --profile are required (make bench-reference PROFILE=quick RUN=bench/runs/DATE)")
			}
			if err := reference.Copy(run, dir, profile); err != nil {
				return err
			}
			fmt.Printf("Reference: %s\n", filepath.Join(dir, profile, "report.md"))
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&run, "run", "", "the run's directory (bench/runs/DATE)")
	fs.StringVar(&profile, "profile", "", "the profile it is the reference of: quick, full, cc, stn, loopback, scale")
	fs.StringVar(&dir, "dir", "bench/reference", "directory of the reference runs")
	return cmd
}
