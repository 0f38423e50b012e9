package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"sync"
	"time"

	"github.com/spf13/pflag"
)

// bulkOptions holds the flags of the bulk command.
type bulkOptions struct {
	target    target
	bytes     byteSize
	duration  time.Duration
	parallel  int
	direction string
	timeout   time.Duration
	json      bool
}

func newBulkOptions() *bulkOptions {
	return &bulkOptions{parallel: 1, direction: "up"}
}

func (o *bulkOptions) addFlags(fs *pflag.FlagSet) {
	o.target.addFlags(fs, 15677)
	fs.Var(&o.bytes, "bytes", "total bytes to transfer, split evenly over --parallel streams, e.g. 256MiB")
	fs.DurationVar(&o.duration, "duration", 0, "transfer for this long instead of a fixed --bytes (default 10s when --bytes is not set)")
	fs.IntVar(&o.parallel, "parallel", o.parallel, "number of parallel connections")
	fs.StringVar(&o.direction, "direction", o.direction, "up (client to server) or down (server to client)")
	fs.DurationVar(&o.timeout, "timeout", 0, "bound on the whole run (default: --duration + 60s, or 10m with --bytes)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object instead of text")
}

// complete fills in defaults that depend on other flags.
func (o *bulkOptions) complete() {
	if o.bytes == 0 && o.duration == 0 {
		o.duration = 10 * time.Second
	}
	if o.timeout == 0 {
		if o.duration > 0 {
			o.timeout = o.duration + time.Minute
		} else {
			o.timeout = 10 * time.Minute
		}
	}
}

func (o *bulkOptions) validate() error {
	errs := []error{o.target.validate()}
	if o.bytes != 0 && o.duration != 0 {
		errs = append(errs, errors.New("--bytes and --duration are mutually exclusive"))
	}
	if o.bytes < 0 || o.duration < 0 {
		errs = append(errs, errors.New("--bytes and --duration must not be negative"))
	}
	if o.parallel < 1 || o.parallel > 1024 {
		errs = append(errs, errors.New("--parallel must be in 1..1024"))
	}
	if o.bytes > 0 && int64(o.bytes) < int64(o.parallel) {
		errs = append(errs, errors.New("--bytes must be at least --parallel"))
	}
	if o.direction != "up" && o.direction != "down" {
		errs = append(errs, errors.New(`--direction must be "up" or "down"`))
	}
	if o.timeout <= 0 {
		errs = append(errs, errors.New("--timeout must be positive"))
	}
	return errors.Join(errs...)
}

// StreamReport is the per-connection part of a BulkReport.
type StreamReport struct {
	Index    int     `json:"index"`
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	MbitPerS float64 `json:"mbit_per_s"`
	Verified bool    `json:"verified"`
	Error    string  `json:"error,omitempty"`
}

// BulkReport is the result of a bulk run; its JSON form is the --json output.
type BulkReport struct {
	Target    string         `json:"target"`
	Direction string         `json:"direction"`
	Parallel  int            `json:"parallel"`
	Bytes     int64          `json:"bytes"`
	Seconds   float64        `json:"seconds"`
	MbitPerS  float64        `json:"mbit_per_s"`
	Verified  bool           `json:"verified"`
	Errors    int            `json:"errors"`
	Streams   []StreamReport `json:"streams"`
}

type streamResult struct {
	bytes      int64
	start, end time.Time
	err        error
}

// runBulk runs o.parallel transfers at once and verifies each end to end.
func runBulk(ctx context.Context, o *bulkOptions) *BulkReport {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	dir := dirUp
	if o.direction == "down" {
		dir = dirDown
	}
	results := make([]streamResult, o.parallel)
	var wg sync.WaitGroup
	for i := range o.parallel {
		var count int64
		if o.bytes > 0 {
			// Spread the remainder so the streams add up exactly.
			count = int64(o.bytes) / int64(o.parallel)
			if int64(i) < int64(o.bytes)%int64(o.parallel) {
				count++
			}
		}
		wg.Go(func() {
			results[i] = bulkStream(ctx, &o.target, dir, count, o.duration)
		})
	}
	wg.Wait()

	r := &BulkReport{Target: o.target.network() + ":" + o.target.address(), Direction: o.direction, Parallel: o.parallel, Verified: true}
	var first, last time.Time
	for i, sr := range results {
		rep := StreamReport{Index: i, Bytes: sr.bytes}
		if !sr.start.IsZero() {
			d := sr.end.Sub(sr.start)
			rep.Seconds = d.Seconds()
			rep.MbitPerS = mbitPerSecond(sr.bytes, d)
			if first.IsZero() || sr.start.Before(first) {
				first = sr.start
			}
			if sr.end.After(last) {
				last = sr.end
			}
		}
		if sr.err != nil {
			rep.Error = sr.err.Error()
			r.Errors++
			r.Verified = false
		} else {
			rep.Verified = true
		}
		r.Bytes += sr.bytes
		r.Streams = append(r.Streams, rep)
	}
	if !first.IsZero() {
		r.Seconds = last.Sub(first).Seconds()
		r.MbitPerS = mbitPerSecond(r.Bytes, last.Sub(first))
	}
	return r
}

// bulkStream runs one transfer. count 0 means: for duration. The clock
// starts once the request is written and stops when the peer's trailer has
// been read, so the figure covers delivery, not just local buffering.
func bulkStream(ctx context.Context, t *target, dir byte, count int64, duration time.Duration) streamResult {
	c, stop, err := t.dial(ctx)
	if err != nil {
		return streamResult{err: fmt.Errorf("connect: %w", err)}
	}
	defer func() { stop(); _ = c.Close() }()
	if _, err := c.Write(sinkRequest{direction: dir, count: uint64(count)}.encode()); err != nil {
		return streamResult{err: fmt.Errorf("send request: %w", err)}
	}
	res := streamResult{start: time.Now()}
	if dir == dirUp {
		res.bytes, res.err = bulkUpload(c, count, duration)
	} else {
		res.bytes, res.err = bulkDownload(c, count, duration)
	}
	res.end = time.Now()
	return res
}

func bulkUpload(c net.Conn, count int64, duration time.Duration) (int64, error) {
	p := newPattern()
	h := crc32.New(castagnoli)
	var sent int64
	deadline := time.Now().Add(duration)
	for {
		n := int64(sinkMaxFrame)
		if count > 0 {
			if sent >= count {
				break
			}
			n = min(n, count-sent)
		} else if !time.Now().Before(deadline) {
			break
		}
		chunk := p.next(int(n))
		if _, err := c.Write(chunk); err != nil {
			return sent, fmt.Errorf("send: %w", err)
		}
		_, _ = h.Write(chunk)
		sent += n
	}
	if err := closeWrite(c); err != nil {
		return sent, fmt.Errorf("half-close: %w", err)
	}
	tr := make([]byte, sinkTrailerSize)
	if _, err := io.ReadFull(c, tr); err != nil {
		return sent, fmt.Errorf("read server report: %w", err)
	}
	got := decodeSinkTrailer(tr)
	if got.count != uint64(sent) {
		return sent, fmt.Errorf("server received %d bytes, client sent %d", got.count, sent)
	}
	if got.crc != h.Sum32() {
		return sent, fmt.Errorf("server's CRC-32C %08x differs from client's %08x: data corrupted in transit", got.crc, h.Sum32())
	}
	return sent, nil
}

func bulkDownload(c net.Conn, count int64, duration time.Duration) (int64, error) {
	var stopTimer *time.Timer
	if count == 0 {
		// The stop signal is our half-close; the server then finishes the
		// frame in flight and sends its trailer.
		stopTimer = time.AfterFunc(duration, func() { _ = closeWrite(c) })
		defer stopTimer.Stop()
	}
	br := bufio.NewReaderSize(c, 256<<10)
	h := crc32.New(castagnoli)
	buf := make([]byte, sinkMaxFrame)
	var got int64
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return got, fmt.Errorf("read frame header: %w", err)
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 {
			break
		}
		if n > sinkMaxFrame {
			return got, fmt.Errorf("frame of %d bytes exceeds %d: stream corrupted", n, sinkMaxFrame)
		}
		if _, err := io.ReadFull(br, buf[:n]); err != nil {
			return got, fmt.Errorf("read frame: %w", err)
		}
		_, _ = h.Write(buf[:n])
		got += int64(n)
	}
	tr := make([]byte, sinkTrailerSize)
	if _, err := io.ReadFull(br, tr); err != nil {
		return got, fmt.Errorf("read server report: %w", err)
	}
	sent := decodeSinkTrailer(tr)
	if sent.count != uint64(got) {
		return got, fmt.Errorf("server sent %d bytes, client received %d", sent.count, got)
	}
	if count > 0 && got != count {
		return got, fmt.Errorf("requested %d bytes, received %d", count, got)
	}
	if sent.crc != h.Sum32() {
		return got, fmt.Errorf("server's CRC-32C %08x differs from client's %08x: data corrupted in transit", sent.crc, h.Sum32())
	}
	if count > 0 {
		_ = closeWrite(c)
	}
	var extra [1]byte
	if n, _ := br.Read(extra[:]); n > 0 {
		return got, errors.New("server sent bytes after its report")
	}
	return got, nil
}
