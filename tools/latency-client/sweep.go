package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// defaultSweepSizes spans small requests to the 16 MiB maximum the probe
// must handle.
const defaultSweepSizes = "64,1KiB,16KiB,64KiB,256KiB,1MiB,4MiB,16MiB"

// SweepReport is the --json output of the sweep command: one probe report
// per request size, in the order given.
type SweepReport struct {
	Target string         `json:"target"`
	Errors int            `json:"errors"`
	Runs   []*ProbeReport `json:"runs"`
}

func parseSizes(s string) ([]int64, error) {
	var out []int64
	for part := range strings.SplitSeq(s, ",") {
		n, err := parseByteSize(part)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func newSweepCommand(stdout, stderr io.Writer) *cobra.Command {
	o := newProbeOptions()
	o.number = 100
	sizes := defaultSweepSizes
	cmd := &cobra.Command{
		Use:   "sweep",
		Short: "Run the latency probe once per request size and tabulate round trips/s and throughput",
		Long: `sweep runs the probe (same flags) once for each size in --sizes, each on fresh
connections, and prints one row per size: round trips per second, payload
throughput each way, and round-trip percentiles. --number and --timeout apply
to each size separately.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := parseSizes(sizes)
			if err != nil {
				return usageError{fmt.Errorf("--sizes: %w", err)}
			}
			var errs []error
			for _, n := range list {
				po := *o
				po.size = byteSize(n)
				if err := po.validate(); err != nil {
					errs = append(errs, fmt.Errorf("size %s: %w", formatByteSize(n), err))
				}
			}
			if err := errors.Join(errs...); err != nil {
				return usageError{err}
			}
			r := runSweep(cmd.Context(), o, list, func(p *ProbeReport) {
				if !o.json {
					printSweepRow(stdout, p)
				}
			}, func() {
				if !o.json {
					fmt.Fprintf(stdout, "%10s %8s %12s %12s %10s %10s %10s %10s %s\n",
						"size", "trips", "trips/s", "Mbit/s", "p50_ms", "p90_ms", "p99_ms", "max_ms", "errors")
				}
			})
			if o.json {
				if err := writeJSON(stdout, r); err != nil {
					return err
				}
			}
			if r.Errors > 0 {
				for _, p := range r.Runs {
					for _, m := range p.ErrorMessages {
						fmt.Fprintf(stderr, "Error: size %s: %s\n", formatByteSize(p.Size), m)
					}
				}
				return errMeasured
			}
			return nil
		},
	}
	o.addFlags(cmd.Flags())
	_ = cmd.Flags().MarkHidden("size")
	cmd.Flags().StringVar(&sizes, "sizes", sizes, "comma-separated request sizes")
	return cmd
}

// runSweep probes each size in turn; row is called after each, header once
// before the first. It stops early when ctx is cancelled.
func runSweep(ctx context.Context, o *probeOptions, sizes []int64, row func(*ProbeReport), header func()) *SweepReport {
	r := &SweepReport{Target: o.target.network() + ":" + o.target.address()}
	header()
	for _, n := range sizes {
		if ctx.Err() != nil {
			r.Errors++
			break
		}
		po := *o
		po.size = byteSize(n)
		p := runProbe(ctx, &po)
		r.Runs = append(r.Runs, p)
		r.Errors += p.Errors
		row(p)
	}
	return r
}

func printSweepRow(w io.Writer, p *ProbeReport) {
	fmt.Fprintf(w, "%10s %8d %12s %12s %10s %10s %10s %10s %d\n",
		formatByteSize(p.Size), p.RoundTrips, f3(p.TPS), f3(p.MbitPerS), f3(p.P50Ms), f3(p.P90Ms), f3(p.P99Ms), f3(p.MaxMs), p.Errors)
}
