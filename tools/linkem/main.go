// Command linkem is a userspace link emulator: it joins two network
// namespaces through TUN devices and applies delay, jitter, loss (Bernoulli
// and Gilbert-Elliott), a rate limit with a bounded queue, duplication,
// reordering and blackouts per direction. See README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	goflag "flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/tools/linkem/emu"
	"github.com/quictun/quictun/tools/linkem/netns"
)

func main() {
	os.Exit(run())
}

func run() int {
	cmd := newRootCommand()
	if err := cmd.Execute(); err != nil {
		klog.ErrorS(err, "linkem failed")
		klog.Flush()
		return 1
	}
	klog.Flush()
	return 0
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:          "linkem",
		Short:        "Userspace link emulator between two network namespaces",
		SilenceUsage: true,
	}
	gfs := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(gfs)
	root.PersistentFlags().AddGoFlag(gfs.Lookup("v"))
	root.PersistentFlags().AddGoFlag(gfs.Lookup("vmodule"))
	root.AddCommand(newUpCommand(), newDownCommand(), newCtlCommand())
	return root
}

// linkFlags binds every link parameter three times: --NAME (both
// directions), --c2s-NAME and --s2c-NAME.
type linkFlags struct {
	fs *pflag.FlagSet
}

func addLinkFlags(fs *pflag.FlagSet) *linkFlags {
	for _, f := range emu.Fields() {
		fs.String(f.Name, "", f.Usage+" (both directions)")
		fs.String("c2s-"+f.Name, "", f.Usage+" (client to server only)")
		fs.String("s2c-"+f.Name, "", f.Usage+" (server to client only)")
	}
	return &linkFlags{fs: fs}
}

// update returns the link flags set on the command line as a config update.
func (l *linkFlags) update() emu.ConfigUpdate {
	u := emu.ConfigUpdate{}
	for _, f := range emu.Fields() {
		for prefix, dst := range map[string]*map[string]any{"": &u.Both, "c2s-": &u.C2S, "s2c-": &u.S2C} {
			if fl := l.fs.Lookup(prefix + f.Name); fl != nil && fl.Changed {
				if *dst == nil {
					*dst = map[string]any{}
				}
				(*dst)[f.Name] = fl.Value.String()
			}
		}
	}
	return u
}

func defaultControl(prefix string) string { return "/run/linkem-" + prefix + ".sock" }

func newUpCommand() *cobra.Command {
	var (
		prefix, control string
		seed            uint64
		spin, timeout   time.Duration
		maxHeld         int
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create the namespaces and run the emulator until SIGINT/SIGTERM, then tear down",
		Args:  cobra.NoArgs,
	}
	fs := cmd.Flags()
	fs.StringVar(&prefix, "prefix", "qt", "namespace prefix: <prefix>-c is the client host (198.18.0.1), <prefix>-s the server host (198.18.0.2)")
	fs.StringVar(&control, "control", "", "control socket path (default /run/linkem-<prefix>.sock)")
	fs.Uint64Var(&seed, "seed", 1, "random seed (directions use seed and seed+1)")
	fs.DurationVar(&spin, "spin", emu.DefaultSpin, "final part of each wait spent spinning instead of sleeping (0 = sleep only, less CPU, ~1ms late)")
	fs.DurationVar(&timeout, "timeout", 0, "stop and tear down after this long (0 = run until a signal)")
	fs.IntVar(&maxHeld, "max-held", emu.DefaultMaxHeld, "bound on packets held in each direction's delay line")
	lf := addLinkFlags(fs)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if control == "" {
			control = defaultControl(prefix)
		}
		c2s, s2c := emu.NewLink(emu.DefaultParams(), seed), emu.NewLink(emu.DefaultParams(), seed+1)
		ctl := emu.NewControl(c2s, s2c, emu.RealClock())
		if err := ctl.Apply(lf.update()); err != nil {
			return fmt.Errorf("link flags: %w", err)
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		return up(ctx, prefix, control, ctl, spin, maxHeld)
	}
	return cmd
}

func up(ctx context.Context, prefix, control string, ctl *emu.Control, spin time.Duration, maxHeld int) (err error) {
	// Teardown must run even when ctx is cancelled.
	bg := context.WithoutCancel(ctx)
	topo, err := netns.Setup(ctx, prefix)
	if err != nil {
		return fmt.Errorf("set up namespaces: %w", err)
	}
	defer func() {
		topo.Close()
		if terr := netns.Teardown(bg, prefix); terr != nil {
			err = errors.Join(err, fmt.Errorf("tear down: %w", terr))
		}
		klog.InfoS("Tore down namespaces", "prefix", prefix)
	}()
	_ = os.Remove(control)
	ln, err := net.Listen("unix", control)
	if err != nil {
		return fmt.Errorf("listen on control socket: %w", err)
	}
	defer os.Remove(control)
	srv := &http.Server{Handler: ctl.Handler(), ReadHeaderTimeout: 5 * time.Second}
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(bg, 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if serr := <-srvErr; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, fmt.Errorf("control server: %w", serr))
		}
	}()
	cfg, _ := json.Marshal(map[string]any{"c2s": ctl.Links[emu.C2S].Params().ToMap(), "s2c": ctl.Links[emu.S2C].Params().ToMap()})
	klog.InfoS("Started link emulator", "prefix", prefix, "clientNamespace", topo.Client.NS, "serverNamespace", topo.Server.NS,
		"clientAddress", topo.Client.Addr, "serverAddress", topo.Server.Addr, "control", control, "config", string(cfg))
	fwd := emu.NewForwarder(topo.Client.TUN, topo.Server.TUN, ctl.Links[emu.C2S], ctl.Links[emu.S2C])
	fwd.Spin = spin
	fwd.MaxHeld = maxHeld
	if err := fwd.Run(ctx, topo.Close); err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	klog.InfoS("Stopped link emulator", "prefix", prefix)
	return nil
}

func newDownCommand() *cobra.Command {
	var prefix, control string
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Remove the namespaces and control socket left by `linkem up` (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if control == "" {
				control = defaultControl(prefix)
			}
			for _, ns := range func() []string { c, s := netns.Names(prefix); return []string{c, s} }() {
				if !netns.Exists(ns) {
					continue
				}
				if pids, err := netns.PIDs(cmd.Context(), ns); err == nil && len(pids) > 0 {
					klog.InfoS("Processes still run in namespace; it lives until they exit", "namespace", ns, "pids", pids)
				}
			}
			if err := netns.Teardown(cmd.Context(), prefix); err != nil {
				return err
			}
			if err := os.Remove(control); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove control socket: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&prefix, "prefix", "qt", "namespace prefix")
	cmd.Flags().StringVar(&control, "control", "", "control socket path (default /run/linkem-<prefix>.sock)")
	return cmd
}

func newCtlCommand() *cobra.Command {
	var control, prefix string
	cmd := &cobra.Command{
		Use:   "ctl",
		Short: "Talk to a running `linkem up`: stats | config | blackout DURATION | set --LINK-FLAGS",
	}
	cmd.PersistentFlags().StringVar(&control, "control", "", "control socket path (default /run/linkem-<prefix>.sock)")
	cmd.PersistentFlags().StringVar(&prefix, "prefix", "qt", "namespace prefix, used for the default control path")
	client := func() *emu.Client {
		if control == "" {
			control = defaultControl(prefix)
		}
		return emu.NewClient(control)
	}
	printJSON := func(v any) error {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return fmt.Errorf("print: %w", err)
		}
		return nil
	}
	stats := &cobra.Command{Use: "stats", Short: "Print per-direction counters as JSON", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := client()
			defer c.Close()
			s, err := c.Stats(cmd.Context())
			if err != nil {
				return err
			}
			return printJSON(s)
		}}
	config := &cobra.Command{Use: "config", Short: "Print the link parameters as JSON", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := client()
			defer c.Close()
			m, err := c.Config(cmd.Context())
			if err != nil {
				return err
			}
			return printJSON(m)
		}}
	var dir string
	blackout := &cobra.Command{Use: "blackout DURATION", Short: "Drop every packet for DURATION (e.g. 5s)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := time.ParseDuration(args[0])
			if err != nil {
				return fmt.Errorf("duration: %w", err)
			}
			c := client()
			defer c.Close()
			return c.Blackout(cmd.Context(), d, dir)
		}}
	blackout.Flags().StringVar(&dir, "dir", "both", "direction: both, c2s or s2c")
	set := &cobra.Command{Use: "set --LINK-FLAG VALUE...", Short: "Change link parameters live", Args: cobra.NoArgs}
	lf := addLinkFlags(set.Flags())
	set.RunE = func(cmd *cobra.Command, _ []string) error {
		u := lf.update()
		if u.Both == nil && u.C2S == nil && u.S2C == nil {
			names := make([]string, 0)
			for _, f := range emu.Fields() {
				names = append(names, "--"+f.Name)
			}
			sort.Strings(names)
			return fmt.Errorf("nothing to set; link flags: %s (prefix c2s-/s2c- for one direction)", strings.Join(names, " "))
		}
		c := client()
		defer c.Close()
		m, err := c.SetConfig(cmd.Context(), u)
		if err != nil {
			return err
		}
		return printJSON(m)
	}
	cmd.AddCommand(stats, config, blackout, set)
	return cmd
}
