package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/spf13/pflag"
)

const (
	// maxMessageSize bounds --size for probe and connrate.
	maxMessageSize = 64 << 20
	// maxProbeMemory bounds connections × size × 2 buffers.
	maxProbeMemory = 2 << 30
	// maxSamples bounds connections × number, the recorded round trips.
	maxSamples = 20_000_000
	// inlineWriteLimit is the largest message written before reading on the
	// same goroutine. Larger messages are written concurrently with the
	// read, because the echo would otherwise fill both socket buffers and
	// deadlock the ping-pong.
	inlineWriteLimit = 16 << 10
	// eofWait bounds the wait for the server's EOF after the last round
	// trip.
	eofWait = 2 * time.Second
)

// probeOptions holds the flags of the default (probe) command.
type probeOptions struct {
	target      target
	size        byteSize
	number      int
	connections int
	timeout     time.Duration
	json        bool
}

func newProbeOptions() *probeOptions {
	return &probeOptions{size: 1000, number: 1000, connections: 1, timeout: 10 * time.Minute}
}

func (o *probeOptions) addFlags(fs *pflag.FlagSet) {
	o.target.addFlags(fs, 15676)
	fs.Var(&o.size, "size", "bytes per message, e.g. 1000, 64KiB, 16MiB")
	fs.IntVar(&o.number, "number", o.number, "round trips per connection")
	fs.IntVar(&o.connections, "connections", o.connections, "concurrent connections, each doing --number round trips")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "bound on the whole run, connect included")
	fs.BoolVar(&o.json, "json", false, "print one JSON object instead of text")
}

func (o *probeOptions) validate() error {
	errs := []error{o.target.validate()}
	if o.size < 1 || o.size > maxMessageSize {
		errs = append(errs, fmt.Errorf("--size must be in 1..%d", maxMessageSize))
	}
	if o.number < 1 {
		errs = append(errs, errors.New("--number must be at least 1"))
	}
	if o.connections < 1 || o.connections > 10000 {
		errs = append(errs, errors.New("--connections must be in 1..10000"))
	}
	if o.number >= 1 && o.connections >= 1 && int64(o.number)*int64(o.connections) > maxSamples {
		errs = append(errs, fmt.Errorf("--number × --connections must not exceed %d", maxSamples))
	}
	if o.size >= 1 && o.connections >= 1 && int64(o.size)*2*int64(o.connections) > maxProbeMemory {
		errs = append(errs, fmt.Errorf("--size × --connections × 2 buffers must not exceed %s", formatByteSize(maxProbeMemory)))
	}
	if o.timeout <= 0 {
		errs = append(errs, errors.New("--timeout must be positive"))
	}
	return errors.Join(errs...)
}

// connResult is what one probe connection measured.
type connResult struct {
	index      int
	connect    time.Duration
	roundTrips []time.Duration
	total      time.Duration
	err        error
}

// ConnReport is the per-connection part of a ProbeReport.
type ConnReport struct {
	Index         int     `json:"index"`
	ConnectMs     float64 `json:"connect_ms"`
	FirstPacketMs float64 `json:"first_packet_ms"`
	TotalMs       float64 `json:"total_ms"`
	RoundTrips    int     `json:"round_trips"`
	Error         string  `json:"error,omitempty"`
}

// ProbeReport is the result of a probe run; its JSON form is the --json
// output. Latencies are in milliseconds.
type ProbeReport struct {
	Target        string       `json:"target"`
	FirstPacketMs float64      `json:"first_packet_ms"`
	TotalMs       float64      `json:"total_ms"`
	ConnectMs     float64      `json:"connect_ms"`
	MinMs         float64      `json:"min_ms"`
	MeanMs        float64      `json:"mean_ms"`
	P50Ms         float64      `json:"p50_ms"`
	P90Ms         float64      `json:"p90_ms"`
	P99Ms         float64      `json:"p99_ms"`
	MaxMs         float64      `json:"max_ms"`
	Size          int64        `json:"size"`
	Number        int          `json:"number"`
	Connections   int          `json:"connections"`
	RoundTrips    int          `json:"round_trips"`
	TPS           float64      `json:"tps"`
	MbitPerS      float64      `json:"mbit_per_s"`
	Errors        int          `json:"errors"`
	ErrorMessages []string     `json:"error_messages,omitempty"`
	PerConnection []ConnReport `json:"per_connection"`
}

// runProbe connects o.connections times, waits until every connection is up,
// then runs the ping-pong on all of them at once. Failures (connect, I/O,
// timeout, a wrong echo) are counted per connection in the report.
func runProbe(ctx context.Context, o *probeOptions) *ProbeReport {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	results := make([]connResult, o.connections)
	conns := make([]net.Conn, o.connections)
	stops := make([]func() bool, o.connections)
	var wg sync.WaitGroup
	for i := range o.connections {
		wg.Go(func() {
			start := time.Now()
			c, stop, err := o.target.dial(ctx)
			results[i] = connResult{index: i, connect: time.Since(start), err: err}
			if err != nil {
				results[i].err = fmt.Errorf("connect: %w", err)
				return
			}
			conns[i], stops[i] = c, stop
		})
	}
	wg.Wait()

	// All connections start the ping-pong together, so that total_ms and
	// TPS describe concurrent load and exclude connection setup.
	phaseStart := time.Now()
	for i := range o.connections {
		if conns[i] == nil {
			continue
		}
		wg.Go(func() {
			defer func() { stops[i](); _ = conns[i].Close() }()
			results[i].roundTrips, results[i].total, results[i].err = pingPong(conns[i], int(o.size), o.number)
		})
	}
	wg.Wait()
	phase := time.Since(phaseStart)
	return buildProbeReport(o, results, phase)
}

// pingPong sends number messages of size random bytes one at a time, reads
// each echo in full and checks it byte for byte. It returns each round trip
// and the wall time from the first send to the last byte of the last echo.
func pingPong(c net.Conn, size, number int) ([]time.Duration, time.Duration, error) {
	var seed [32]byte
	for i := range 4 {
		binary.LittleEndian.PutUint64(seed[i*8:], rand.Uint64())
	}
	rng := rand.NewChaCha8(seed)
	send := make([]byte, size)
	recv := make([]byte, size)
	_, _ = rng.Read(send)

	var w *asyncWriter
	if size > inlineWriteLimit {
		w = newAsyncWriter(c)
		defer w.close()
	}
	rtts := make([]time.Duration, 0, number)
	start := time.Now()
	for seq := range number {
		// Make every message differ from the one before, so that a stale
		// or replayed echo fails the check.
		if size >= 8 {
			binary.LittleEndian.PutUint64(send, rng.Uint64())
		} else {
			_, _ = rng.Read(send)
		}
		t0 := time.Now()
		if w != nil {
			w.write(send)
		} else if _, err := c.Write(send); err != nil {
			return rtts, time.Since(start), fmt.Errorf("round trip %d: write: %w", seq+1, err)
		}
		_, rerr := io.ReadFull(c, recv)
		if w != nil {
			if rerr != nil {
				// The echo stopped; do not wait for a write the
				// server may never drain.
				_ = c.SetWriteDeadline(time.Unix(1, 0))
			}
			if werr := w.wait(); werr != nil && rerr == nil {
				return rtts, time.Since(start), fmt.Errorf("round trip %d: write: %w", seq+1, werr)
			}
		}
		if rerr != nil {
			return rtts, time.Since(start), fmt.Errorf("round trip %d: read echo: %w", seq+1, rerr)
		}
		rtt := time.Since(t0)
		if !bytes.Equal(send, recv) {
			off := firstDifference(send, recv)
			return rtts, time.Since(start), fmt.Errorf("round trip %d: echo differs from request at byte %d of %d (sent 0x%02x, got 0x%02x)",
				seq+1, off, size, send[off], recv[off])
		}
		// Only verified round trips enter the statistics.
		rtts = append(rtts, rtt)
	}
	total := time.Since(start)
	// Half-close and read what follows: an echo server that sends bytes
	// nobody requested is wrong. The wait is short and its other outcomes
	// (EOF, reset, timeout) are not errors: every round trip is already
	// verified, and some paths (quic-tun) do not carry half-closes.
	if closeWrite(c) == nil {
		_ = c.SetReadDeadline(time.Now().Add(eofWait))
		var extra [1]byte
		if n, _ := c.Read(extra[:]); n > 0 {
			return rtts, total, errors.New("echo server sent bytes that were never requested")
		}
	}
	return rtts, total, nil
}

func firstDifference(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return 0
}

// asyncWriter writes messages on its own goroutine so that large messages
// can be sent while their echo is being read.
type asyncWriter struct {
	c    net.Conn
	reqs chan []byte
	errs chan error
	done chan struct{}
}

func newAsyncWriter(c net.Conn) *asyncWriter {
	w := &asyncWriter{c: c, reqs: make(chan []byte), errs: make(chan error, 1), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for b := range w.reqs {
			_, err := w.c.Write(b)
			w.errs <- err
		}
	}()
	return w
}

func (w *asyncWriter) write(b []byte) { w.reqs <- b }

func (w *asyncWriter) wait() error {
	return <-w.errs
}

// close stops the writer goroutine. A write still blocked ends when the
// caller closes the connection, so close must not be called before that
// when a write may be pending: pingPong always calls wait first.
func (w *asyncWriter) close() {
	close(w.reqs)
	<-w.done
}

func buildProbeReport(o *probeOptions, results []connResult, phase time.Duration) *ProbeReport {
	r := &ProbeReport{
		Target:      o.target.network() + ":" + o.target.address(),
		Size:        int64(o.size),
		Number:      o.number,
		Connections: o.connections,
	}
	var all []time.Duration
	var firstMax, connectMax time.Duration
	for _, cr := range results {
		rep := ConnReport{Index: cr.index, ConnectMs: ms(cr.connect), TotalMs: ms(cr.total), RoundTrips: len(cr.roundTrips)}
		if len(cr.roundTrips) > 0 {
			rep.FirstPacketMs = ms(cr.roundTrips[0])
			firstMax = max(firstMax, cr.roundTrips[0])
		}
		connectMax = max(connectMax, cr.connect)
		if cr.err != nil {
			rep.Error = cr.err.Error()
			r.Errors++
			r.ErrorMessages = append(r.ErrorMessages, fmt.Sprintf("connection %d: %v", cr.index, cr.err))
		}
		all = append(all, cr.roundTrips...)
		r.PerConnection = append(r.PerConnection, rep)
	}
	s := Summarize(all)
	r.RoundTrips = s.Count
	r.FirstPacketMs = ms(firstMax)
	r.ConnectMs = ms(connectMax)
	if o.connections == 1 {
		// quic-tun's meaning: from the first send to the last echo.
		r.TotalMs = r.PerConnection[0].TotalMs
	} else {
		r.TotalMs = ms(phase)
	}
	r.MinMs, r.MeanMs, r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs = ms(s.Min), ms(s.Mean), ms(s.P50), ms(s.P90), ms(s.P99), ms(s.Max)
	elapsed := time.Duration(r.TotalMs * float64(time.Millisecond))
	r.TPS = perSecond(s.Count, elapsed)
	r.MbitPerS = mbitPerSecond(int64(s.Count)*int64(o.size), elapsed)
	return r
}
