package harness

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"sync"
	"time"
)

// The harness speaks latency-client's sink protocol (tools/latency-client/
// sink.go) itself for downloads of a fixed duration: `latency-client bulk`
// stops a download with a half-close, which kcptun turns into a full close,
// whereas the protocol also accepts any byte as the stop signal.

const (
	sinkMaxFrame    = 64 << 10
	sinkTrailerSize = 12
)

// BulkStream is the outcome of one download stream.
type BulkStream struct {
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	Error   string  `json:"error,omitempty"`
	start   time.Time
	end     time.Time
}

// BulkDownload is the outcome of parallel download streams.
type BulkDownload struct {
	Target   string       `json:"target"`
	Parallel int          `json:"parallel"`
	Bytes    int64        `json:"bytes"`
	Seconds  float64      `json:"seconds"`
	MbitPerS float64      `json:"mbit_per_s"`
	Verified bool         `json:"verified"`
	Errors   int          `json:"errors"`
	Streams  []BulkStream `json:"streams"`
}

func sinkRequest(count uint64) []byte {
	b := make([]byte, 16)
	copy(b, "QTSK")
	b[4] = 1
	b[5] = 'D'
	binary.BigEndian.PutUint64(b[8:], count)
	return b
}

// downloadOne reads frames from c until stop fires, then sends the stop
// byte, reads the end frame and the trailer, and checks count and CRC-32C.
func downloadOne(c net.Conn, d time.Duration, limit time.Duration) BulkStream {
	var s BulkStream
	_ = c.SetDeadline(time.Now().Add(limit))
	if _, err := c.Write(sinkRequest(0)); err != nil {
		s.Error = fmt.Sprintf("write request: %v", err)
		return s
	}
	s.start = time.Now()
	var once sync.Once
	var stopErr error
	stop := time.AfterFunc(d, func() {
		once.Do(func() {
			_, stopErr = c.Write([]byte{0})
		})
	})
	defer stop.Stop()
	br := bufio.NewReaderSize(c, 256<<10)
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	buf := make([]byte, sinkMaxFrame)
	var hdr [4]byte
	err := func() error {
		for {
			if _, err := io.ReadFull(br, hdr[:]); err != nil {
				return fmt.Errorf("read frame header: %w", err)
			}
			n := binary.BigEndian.Uint32(hdr[:])
			if n == 0 {
				break
			}
			if n > sinkMaxFrame {
				return fmt.Errorf("frame of %d bytes: stream corrupted", n)
			}
			if _, err := io.ReadFull(br, buf[:n]); err != nil {
				return fmt.Errorf("read frame: %w", err)
			}
			_, _ = h.Write(buf[:n])
			s.Bytes += int64(n)
		}
		tr := make([]byte, sinkTrailerSize)
		if _, err := io.ReadFull(br, tr); err != nil {
			return fmt.Errorf("read trailer: %w", err)
		}
		s.end = time.Now()
		if cnt := binary.BigEndian.Uint64(tr); cnt != uint64(s.Bytes) {
			return fmt.Errorf("server sent %d bytes, client received %d", cnt, s.Bytes)
		}
		if crc := binary.BigEndian.Uint32(tr[8:]); crc != h.Sum32() {
			return fmt.Errorf("CRC-32C mismatch: server %08x, client %08x", crc, h.Sum32())
		}
		return nil
	}()
	stop.Stop()
	once.Do(func() {}) // no stop byte after this point
	if err == nil && stopErr != nil {
		err = fmt.Errorf("write stop byte: %w", stopErr)
	}
	if err != nil {
		s.Error = err.Error()
		if s.end.IsZero() {
			s.end = time.Now()
		}
	}
	s.Seconds = s.end.Sub(s.start).Seconds()
	return s
}

// bulkDownload runs par parallel downloads of duration d from the sink at
// addr, dialled from namespace ns.
func bulkDownload(ctx context.Context, ns, addr string, par int, d time.Duration) BulkDownload {
	res := BulkDownload{Target: addr, Parallel: par, Streams: make([]BulkStream, par)}
	conns := make([]net.Conn, par)
	for i := range par {
		dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		c, err := dialIn(dctx, ns, addr)
		cancel()
		if err != nil {
			res.Streams[i].Error = err.Error()
			continue
		}
		conns[i] = c
	}
	var wg sync.WaitGroup
	for i, c := range conns {
		if c == nil {
			continue
		}
		wg.Go(func() {
			defer c.Close()
			res.Streams[i] = downloadOne(c, d, d+60*time.Second)
		})
	}
	// Cancelling ctx closes the connections, which ends the streams.
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			for _, c := range conns {
				if c != nil {
					_ = c.Close()
				}
			}
		case <-done:
		}
	}()
	wg.Wait()
	close(done)
	var first, last time.Time
	for _, s := range res.Streams {
		res.Bytes += s.Bytes
		if s.Error != "" {
			res.Errors++
		}
		if !s.start.IsZero() && (first.IsZero() || s.start.Before(first)) {
			first = s.start
		}
		if s.end.After(last) {
			last = s.end
		}
	}
	res.Verified = res.Errors == 0
	if last.After(first) {
		res.Seconds = last.Sub(first).Seconds()
		res.MbitPerS = float64(res.Bytes) * 8 / res.Seconds / 1e6
	}
	return res
}
