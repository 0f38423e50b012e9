package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
)

// connrateOptions holds the flags of the connrate command.
type connrateOptions struct {
	target      target
	number      int
	size        byteSize
	concurrency int
	halfClose   bool
	timeout     time.Duration
	json        bool
}

func newConnrateOptions() *connrateOptions {
	return &connrateOptions{number: 1000, size: 100, concurrency: 8, timeout: 10 * time.Minute}
}

func (o *connrateOptions) addFlags(fs *pflag.FlagSet) {
	o.target.addFlags(fs, 15676)
	fs.IntVar(&o.number, "number", o.number, "total connections to make")
	fs.Var(&o.size, "size", "request bytes sent on each connection")
	fs.IntVar(&o.concurrency, "concurrency", o.concurrency, "connections in flight at once")
	fs.BoolVar(&o.halfClose, "half-close", false, "half-close after the request and require the server's EOF after the echo")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "bound on the whole run")
	fs.BoolVar(&o.json, "json", false, "print one JSON object instead of text")
}

func (o *connrateOptions) validate() error {
	errs := []error{o.target.validate()}
	if o.number < 1 || o.number > 10_000_000 {
		errs = append(errs, errors.New("--number must be in 1..10000000"))
	}
	if o.size < 1 || o.size > 1<<20 {
		errs = append(errs, errors.New("--size must be in 1..1MiB"))
	}
	if o.concurrency < 1 || o.concurrency > 4096 {
		errs = append(errs, errors.New("--concurrency must be in 1..4096"))
	}
	if o.timeout <= 0 {
		errs = append(errs, errors.New("--timeout must be positive"))
	}
	return errors.Join(errs...)
}

// LatencyStats holds percentiles in milliseconds.
type LatencyStats struct {
	MinMs  float64 `json:"min_ms"`
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
}

func latencyStats(s Summary) LatencyStats {
	return LatencyStats{ms(s.Min), ms(s.Mean), ms(s.P50), ms(s.P90), ms(s.P99), ms(s.Max)}
}

// ConnrateReport is the result of a connrate run; its JSON form is the
// --json output.
type ConnrateReport struct {
	Target         string       `json:"target"`
	Number         int          `json:"number"`
	Size           int64        `json:"size"`
	Concurrency    int          `json:"concurrency"`
	HalfClose      bool         `json:"half_close"`
	Completed      int          `json:"completed"`
	Errors         int          `json:"errors"`
	FirstError     string       `json:"first_error,omitempty"`
	Seconds        float64      `json:"seconds"`
	ConnsPerSecond float64      `json:"connections_per_s"`
	Connect        LatencyStats `json:"connect"`
	FirstByte      LatencyStats `json:"first_byte"`
	Transaction    LatencyStats `json:"transaction"`
}

type connrateSample struct {
	connect, firstByte, transaction time.Duration
}

// runConnrate makes o.number short-lived connections with o.concurrency in
// flight. Each connects, sends one request, reads and checks the full echo,
// and closes. Latencies are counted only for successful connections.
func runConnrate(ctx context.Context, o *connrateOptions) *ConnrateReport {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	req := make([]byte, o.size)
	_, _ = rand.Read(req)

	var (
		next     atomic.Int64
		mu       sync.Mutex
		samples  = make([]connrateSample, 0, o.number)
		nErr     int
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	for range min(o.concurrency, o.number) {
		wg.Go(func() {
			resp := make([]byte, len(req))
			for next.Add(1) <= int64(o.number) && ctx.Err() == nil {
				s, err := oneTransaction(ctx, &o.target, req, resp, o.halfClose)
				mu.Lock()
				if err != nil {
					nErr++
					if firstErr == nil {
						firstErr = err
					}
				} else {
					samples = append(samples, s)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	r := &ConnrateReport{
		Target: o.target.network() + ":" + o.target.address(), Number: o.number, Size: int64(o.size),
		Concurrency: o.concurrency, HalfClose: o.halfClose, Completed: len(samples), Errors: nErr, Seconds: elapsed.Seconds(),
		ConnsPerSecond: perSecond(len(samples), elapsed),
	}
	// Connections never attempted because the run timed out are errors too.
	if missing := o.number - len(samples) - nErr; missing > 0 {
		r.Errors += missing
		if firstErr == nil {
			firstErr = fmt.Errorf("%d connections not attempted: %w", missing, ctx.Err())
		}
	}
	if firstErr != nil {
		r.FirstError = firstErr.Error()
	}
	var conn, fb, tx []time.Duration
	for _, s := range samples {
		conn = append(conn, s.connect)
		fb = append(fb, s.firstByte)
		tx = append(tx, s.transaction)
	}
	r.Connect, r.FirstByte, r.Transaction = latencyStats(Summarize(conn)), latencyStats(Summarize(fb)), latencyStats(Summarize(tx))
	return r
}

// oneTransaction times one connection. firstByte runs from the start of the
// dial to the first echoed byte (time to first byte, connect included);
// transaction runs to the last byte of the echo, or with halfClose to the
// server's EOF that must follow it.
func oneTransaction(ctx context.Context, t *target, req, resp []byte, halfClose bool) (connrateSample, error) {
	var s connrateSample
	start := time.Now()
	c, stop, err := t.dial(ctx)
	if err != nil {
		return s, fmt.Errorf("connect: %w", err)
	}
	defer func() { stop(); _ = c.Close() }()
	s.connect = time.Since(start)
	if _, err := c.Write(req); err != nil {
		return s, fmt.Errorf("write: %w", err)
	}
	if halfClose {
		if err := closeWrite(c); err != nil {
			return s, fmt.Errorf("half-close: %w", err)
		}
	}
	if _, err := io.ReadFull(c, resp[:1]); err != nil {
		return s, fmt.Errorf("read first byte: %w", err)
	}
	s.firstByte = time.Since(start)
	if _, err := io.ReadFull(c, resp[1:]); err != nil {
		return s, fmt.Errorf("read echo: %w", err)
	}
	if !bytes.Equal(req, resp) {
		return s, errors.New("echo differs from request")
	}
	if halfClose {
		var extra [1]byte
		if n, err := c.Read(extra[:]); n > 0 {
			return s, errors.New("server sent bytes that were never requested")
		} else if !errors.Is(err, io.EOF) {
			return s, fmt.Errorf("wait for EOF: %w", err)
		}
	}
	s.transaction = time.Since(start)
	return s, nil
}
