package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

// errMeasured marks a run that completed but measured failures; the report
// has already been printed, so only the exit code is left to set.
var errMeasured = errors.New("run reported errors")

// usageError marks bad flags or arguments (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// execute runs the command line args and returns the exit code.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newRootCommand(stdout, stderr)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errMeasured):
		return 1
	}
	fmt.Fprintln(stderr, "Error:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	o := newProbeOptions()
	cmd := &cobra.Command{
		Use:   "latency-client",
		Short: "Measure TCP round-trip latency (the default command), throughput and connection rate",
		Long: `latency-client measures a TCP path, directly or through a tunnel.

Without a subcommand it runs the latency probe: it connects, sends --number
messages of --size random bytes one at a time, reads every echo in full,
checks it byte for byte, and prints quic-tun compatible lines:
  First packet latency: X ms
  Total latency: Y ms
followed by connect time and round-trip percentiles. Start the echo server
with "latency-client serve".`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return usageError{err}
			}
			r := runProbe(cmd.Context(), o)
			if err := printProbe(stdout, r, o.json); err != nil {
				return err
			}
			if r.Errors > 0 {
				for _, m := range r.ErrorMessages {
					fmt.Fprintln(stderr, "Error:", m)
				}
				return errMeasured
			}
			return nil
		},
	}
	cmd.CompletionOptions.DisableDefaultCmd = true
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	o.addFlags(cmd.Flags())

	// klog's -v and --vmodule only; its file flags are deprecated.
	gfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gfs)
	for _, name := range []string{"v", "vmodule"} {
		cmd.PersistentFlags().AddGoFlag(gfs.Lookup(name))
	}

	cmd.AddCommand(newServeCommand(stdout), newBulkCommand(stdout, stderr), newConnrateCommand(stdout, stderr),
		newSweepCommand(stdout, stderr), newFloodCommand(stdout, stderr),
		&cobra.Command{
			Use:   "version",
			Short: "Print the version",
			Args:  cobra.NoArgs,
			Run:   func(*cobra.Command, []string) { fmt.Fprintln(stdout, version) },
		})
	return cmd
}

// f formats a float like quic-tun's Python tool: plain decimal, shortest
// representation that round-trips.
func f(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }

// f3 formats a float with three decimals for secondary figures.
func f3(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	return enc.Encode(v)
}

func printProbe(w io.Writer, r *ProbeReport, asJSON bool) error {
	if asJSON {
		return writeJSON(w, r)
	}
	var err error
	p := func(format string, a ...any) {
		if err == nil {
			_, err = fmt.Fprintf(w, format, a...)
		}
	}
	// The first two lines are exactly quic-tun's.
	p("First packet latency: %s ms\n", f(r.FirstPacketMs))
	p("Total latency: %s ms\n", f(r.TotalMs))
	p("Connect latency: %s ms\n", f(r.ConnectMs))
	p("p50 latency: %s ms\n", f(r.P50Ms))
	p("p90 latency: %s ms\n", f(r.P90Ms))
	p("p99 latency: %s ms\n", f(r.P99Ms))
	p("Max latency: %s ms\n", f(r.MaxMs))
	p("Round trips: %d of %d x %d bytes over %d connection(s), %s round trips/s, %s Mbit/s each way, errors: %d\n",
		r.RoundTrips, r.Number*r.Connections, r.Size, r.Connections, f3(r.TPS), f3(r.MbitPerS), r.Errors)
	if r.Connections > 1 {
		for _, c := range r.PerConnection {
			p("  connection %d: connect %s ms, first packet %s ms, total %s ms, %d round trips",
				c.Index, f3(c.ConnectMs), f3(c.FirstPacketMs), f3(c.TotalMs), c.RoundTrips)
			if c.Error != "" {
				p(", error: %s", c.Error)
			}
			p("\n")
		}
	}
	return err
}
