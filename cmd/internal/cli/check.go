package cli

import (
	"fmt"
	"os"

	"github.com/quic-go/quic-go"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/hostcheck"
	"github.com/quictun/quictun/pkg/transport"
)

// NewCheckCommand returns the "check" subcommand: it prints the host report
// and exits non-zero when something important is off. It takes the daemon's
// flags, config file and environment (AddDaemonFlags), so remote (the server
// endpoint, for the path MTU check; nil for none) sees the configured value.
func NewCheckCommand(d Daemon, remote func() string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check the host for QUIC: UDP buffer limits, GSO, path MTU; print fixes",
		Args:  NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := LoadConfig(c.Flags(), d.Config().ConfigFile); err != nil {
				return err
			}
			var r string
			if remote != nil {
				r = remote()
			}
			fs := hostcheck.Run(hostcheck.Options{Remote: r})
			for _, f := range fs {
				_, _ = fmt.Fprintf(c.OutOrStdout(), "%-5s %-12s %s\n", f.Severity, f.Check, f.Detail)
				if f.Fix != "" {
					_, _ = fmt.Fprintf(c.OutOrStdout(), "      fix: %s\n", f.Fix)
				}
			}
			if hostcheck.Worst(fs) >= hostcheck.Warn {
				return fmt.Errorf("%w: host check found problems", ErrUsage)
			}
			return nil
		},
	}
	AddDaemonFlags(cmd, d)
	return cmd
}

// AddDaemonFlags gives a subcommand the daemon's flags (config, options,
// logging), so it reads the same configuration.
func AddDaemonFlags(cmd *cobra.Command, d Daemon) {
	d.Config().AddFlags(cmd.Flags())
	d.AddFlags(cmd.Flags())
	AddKlogFlags(cmd.Flags())
}

// LogHostCheck logs one line per finding that needs attention, with its fix,
// and silences quic-go's own buffer warning where the check replaces it
// (Linux). Elsewhere its one "platform" line at -v 0 names the Linux-only
// features the daemon runs without.
func LogHostCheck(remote string) {
	if hostcheck.BufferCheck {
		_ = os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	}
	for _, f := range hostcheck.Run(hostcheck.Options{Remote: remote}) {
		if f.Severity == hostcheck.OK {
			klog.V(1).InfoS("Host check passed", "check", f.Check, "detail", f.Detail)
			continue
		}
		klog.InfoS("Host check: "+f.Detail, "check", f.Check, "severity", f.Severity.String(), "fix", f.Fix)
	}
}

// EnableQlog makes qconf write a qlog file per connection into dir (created
// with mode 0700); nothing happens when dir is empty.
func EnableQlog(qconf *quic.Config, dir string, logger klog.Logger) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--qlog-dir: %w", err)
	}
	qconf.Tracer = transport.QlogTracer(dir, func(err error) { logger.Error(err, "Could not write qlog") })
	logger.Info("Writing a qlog file per connection; this costs throughput", "qlogDir", dir)
	return nil
}
