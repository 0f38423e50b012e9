package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/spf13/cobra"
)

func newServeCommand(stdout io.Writer) *cobra.Command {
	var (
		addr, sinkAddr string
		cfg            = DefaultServerConfig()
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the TCP echo server (and optionally the bulk sink/source server)",
		Long: `serve runs a TCP echo server: every byte received is sent back in order; when
the client half-closes, the server half-closes after the last echoed byte.
With --sink-listen it also runs the sink/source server used by "bulk"
(protocol in README.md). SIGINT or SIGTERM stops accepting, waits up to
--drain-timeout for open connections, then closes them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.MaxConns < 1 || cfg.IdleTimeout < 0 || cfg.DrainTimeout < 0 {
				return usageError{errors.New("--max-connections must be positive; --idle-timeout and --drain-timeout must not be negative")}
			}
			ctx := cmd.Context()
			ln, err := listen(ctx, addr)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", addr, err)
			}
			var sinkLn net.Listener
			if sinkAddr != "" {
				if sinkLn, err = listen(ctx, sinkAddr); err != nil {
					_ = ln.Close()
					return fmt.Errorf("listen on %s: %w", sinkAddr, err)
				}
			}
			// The first line matches quic-tun's server.
			fmt.Fprintf(stdout, "The server listen on %s\n", ln.Addr())
			if sinkLn != nil {
				fmt.Fprintf(stdout, "The sink server listen on %s\n", sinkLn.Addr())
			}
			var wg sync.WaitGroup
			var sinkErr error
			if sinkLn != nil {
				wg.Go(func() { sinkErr = Serve(ctx, sinkLn, cfg, "sink", handleSink) })
			}
			echoErr := Serve(ctx, ln, cfg, "echo", handleEcho)
			wg.Wait()
			return errors.Join(echoErr, sinkErr)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&addr, "listen", "0.0.0.0:15676", "echo server address, HOST:PORT or unix:/path")
	fs.StringVar(&sinkAddr, "sink-listen", "", "sink/source server address for bulk, e.g. 0.0.0.0:15677 (empty disables)")
	fs.IntVar(&cfg.MaxConns, "max-connections", cfg.MaxConns, "connections handled at once per service; more wait in the accept queue")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "close a connection idle for this long (0 disables)")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "on SIGINT/SIGTERM, wait this long for open connections before closing them")
	return cmd
}

func newBulkCommand(stdout, stderr io.Writer) *cobra.Command {
	o := newBulkOptions()
	cmd := &cobra.Command{
		Use:   "bulk",
		Short: "Measure throughput against the sink/source server (serve --sink-listen)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.complete()
			if err := o.validate(); err != nil {
				return usageError{err}
			}
			r := runBulk(cmd.Context(), o)
			if err := printBulk(stdout, r, o.json); err != nil {
				return err
			}
			if r.Errors > 0 {
				for _, s := range r.Streams {
					if s.Error != "" {
						fmt.Fprintf(stderr, "Error: stream %d: %s\n", s.Index, s.Error)
					}
				}
				return errMeasured
			}
			return nil
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

func printBulk(w io.Writer, r *BulkReport, asJSON bool) error {
	if asJSON {
		return writeJSON(w, r)
	}
	var err error
	p := func(format string, a ...any) {
		if err == nil {
			_, err = fmt.Fprintf(w, format, a...)
		}
	}
	for _, s := range r.Streams {
		p("[%d] %d bytes in %s s: %s Mbit/s", s.Index, s.Bytes, f3(s.Seconds), f3(s.MbitPerS))
		if s.Error != "" {
			p(", error: %s", s.Error)
		}
		p("\n")
	}
	verified := "yes (byte count and CRC-32C matched on every stream)"
	if !r.Verified {
		verified = "NO"
	}
	p("Direction: %s, parallel: %d\n", r.Direction, r.Parallel)
	p("Bytes: %d in %s s\n", r.Bytes, f3(r.Seconds))
	p("Throughput: %s Mbit/s\n", f3(r.MbitPerS))
	p("Verified: %s, errors: %d\n", verified, r.Errors)
	return err
}

func newConnrateCommand(stdout, stderr io.Writer) *cobra.Command {
	o := newConnrateOptions()
	cmd := &cobra.Command{
		Use:   "connrate",
		Short: "Measure short-lived connections per second against the echo server",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return usageError{err}
			}
			r := runConnrate(cmd.Context(), o)
			if err := printConnrate(stdout, r, o.json); err != nil {
				return err
			}
			if r.Errors > 0 {
				fmt.Fprintf(stderr, "Error: %d of %d connections failed; first: %s\n", r.Errors, r.Number, r.FirstError)
				return errMeasured
			}
			return nil
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

func printConnrate(w io.Writer, r *ConnrateReport, asJSON bool) error {
	if asJSON {
		return writeJSON(w, r)
	}
	var err error
	p := func(format string, a ...any) {
		if err == nil {
			_, err = fmt.Fprintf(w, format, a...)
		}
	}
	line := func(name string, s LatencyStats) {
		p("%s latency: p50 %s ms, p90 %s ms, p99 %s ms, max %s ms\n", name, f3(s.P50Ms), f3(s.P90Ms), f3(s.P99Ms), f3(s.MaxMs))
	}
	p("Connections: %d of %d completed in %s s, concurrency %d, errors: %d\n", r.Completed, r.Number, f3(r.Seconds), r.Concurrency, r.Errors)
	p("Connection rate: %s connections/s\n", f3(r.ConnsPerSecond))
	line("Connect", r.Connect)
	line("First byte", r.FirstByte)
	line("Transaction", r.Transaction)
	return err
}
