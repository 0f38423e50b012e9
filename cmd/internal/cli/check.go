package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/hostcheck"
)

// NewCheckCommand returns the "check" subcommand: it prints the host report
// and exits non-zero when something important is off. withRemote adds
// --server-endpoint for the path MTU check.
func NewCheckCommand(withRemote bool) *cobra.Command {
	var remote string
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check the host for QUIC: UDP buffer limits, GSO, path MTU; print fixes",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			fs := hostcheck.Run(hostcheck.Options{Remote: remote})
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
	if withRemote {
		cmd.Flags().StringVar(&remote, "server-endpoint", "", "server UDP address, to check the path MTU")
	}
	return cmd
}

// LogHostCheck logs one line per finding that needs attention, with its fix,
// and silences quic-go's own buffer warning, which this replaces.
func LogHostCheck(remote string) {
	_ = os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	for _, f := range hostcheck.Run(hostcheck.Options{Remote: remote}) {
		if f.Severity == hostcheck.OK {
			klog.V(1).InfoS("Host check passed", "check", f.Check, "detail", f.Detail)
			continue
		}
		klog.InfoS("Host check: "+f.Detail, "check", f.Check, "severity", f.Severity.String(), "fix", f.Fix)
	}
}
