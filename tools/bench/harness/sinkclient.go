package harness

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"runtime"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"
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
	// ReaderCPU is the CPU time of the harness thread that read the stream
	// (it runs locked to its OS thread), so that the harness's own CPU use
	// can be told apart from the in-process emulator's.
	ReaderCPU float64 `json:"reader_cpu_s"`
	Error     string  `json:"error,omitempty"`
	start     time.Time
	end       time.Time
}

// BulkDownload is the outcome of parallel download streams.
type BulkDownload struct {
	Target    string       `json:"target"`
	Parallel  int          `json:"parallel"`
	Bytes     int64        `json:"bytes"`
	Seconds   float64      `json:"seconds"`
	MbitPerS  float64      `json:"mbit_per_s"`
	ReaderCPU float64      `json:"reader_cpu_s"`
	Verified  bool         `json:"verified"`
	Errors    int          `json:"errors"`
	Streams   []BulkStream `json:"streams"`
}

// flowPoint is the cumulative byte count of a stream at a time.
type flowPoint struct {
	T     time.Time
	Bytes int64
}

// progress records when a stream's bytes arrived (one point per frame).
type progress struct {
	mu  sync.Mutex
	pts []flowPoint
}

// maxFlowPoints bounds a progress record (frames are up to 64 KiB: hours
// of 100 Mbit/s).
const maxFlowPoints = 1 << 20

func (p *progress) add(t time.Time, cum int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pts) < maxFlowPoints {
		p.pts = append(p.pts, flowPoint{t, cum})
	}
}

// last returns the latest cumulative count.
func (p *progress) last() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pts) == 0 {
		return 0
	}
	return p.pts[len(p.pts)-1].Bytes
}

// points returns a copy of the record.
func (p *progress) points() []flowPoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]flowPoint(nil), p.pts...)
}

// bytesAt is the cumulative count at t (of the last point not after t).
func bytesAt(pts []flowPoint, t time.Time) int64 {
	i := sort.Search(len(pts), func(i int) bool { return pts[i].T.After(t) })
	if i == 0 {
		return 0
	}
	return pts[i-1].Bytes
}

// flowAfter returns how long after mark at least want bytes had arrived
// that arrived after mark, and false if that never happened.
func flowAfter(pts []flowPoint, mark time.Time, want int64) (time.Duration, bool) {
	base := bytesAt(pts, mark)
	for _, p := range pts {
		if p.T.After(mark) && p.Bytes-base >= want {
			return p.T.Sub(mark), true
		}
	}
	return 0, false
}

// rateBetween is the goodput in Mbit/s between a and b.
func rateBetween(pts []flowPoint, a, b time.Time) float64 {
	if !b.After(a) {
		return 0
	}
	return float64(bytesAt(pts, b)-bytesAt(pts, a)) * 8 / b.Sub(a).Seconds() / 1e6
}

// threadCPU returns the CPU time (user+system) of the calling OS thread.
func threadCPU() float64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return tvSeconds(ru.Utime) + tvSeconds(ru.Stime)
}

// processCPU returns the CPU time (user+system) of this process.
func processCPU() float64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return tvSeconds(ru.Utime) + tvSeconds(ru.Stime)
}

func tvSeconds(tv unix.Timeval) float64 { return float64(tv.Sec) + float64(tv.Usec)/1e6 }

// Sink protocol directions.
const (
	sinkUp   byte = 'U'
	sinkDown byte = 'D'
)

// sinkRequest is the 16-byte request of a transfer in direction dir of
// count bytes (0: until stopped).
func sinkRequest(dir byte, count uint64) []byte {
	b := make([]byte, 16)
	copy(b, "QTSK")
	b[4] = 1
	b[5] = dir
	binary.BigEndian.PutUint64(b[8:], count)
	return b
}

// readSinkDownload reads a download's frames up to the end frame, then
// the trailer, and checks the trailer's count and CRC-32C against what
// arrived. onFrame, if not nil, is called with the running byte count
// after each frame. It returns the payload bytes read.
func readSinkDownload(br *bufio.Reader, onFrame func(total int64)) (int64, error) {
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	buf := make([]byte, sinkMaxFrame)
	var hdr [4]byte
	var total int64
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return total, fmt.Errorf("read frame header: %w", err)
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 {
			break
		}
		if n > sinkMaxFrame {
			return total, fmt.Errorf("frame of %d bytes: stream corrupted", n)
		}
		if _, err := io.ReadFull(br, buf[:n]); err != nil {
			return total, fmt.Errorf("read frame: %w", err)
		}
		_, _ = h.Write(buf[:n])
		total += int64(n)
		if onFrame != nil {
			onFrame(total)
		}
	}
	tr := make([]byte, sinkTrailerSize)
	if _, err := io.ReadFull(br, tr); err != nil {
		return total, fmt.Errorf("read trailer: %w", err)
	}
	if cnt := binary.BigEndian.Uint64(tr); cnt != uint64(total) {
		return total, fmt.Errorf("server sent %d bytes, client received %d", cnt, total)
	}
	if crc := binary.BigEndian.Uint32(tr[8:]); crc != h.Sum32() {
		return total, fmt.Errorf("CRC-32C mismatch: server %08x, client %08x", crc, h.Sum32())
	}
	return total, nil
}

// downloadOne downloads from c for d (see download).
func downloadOne(c net.Conn, d time.Duration, limit time.Duration, prog *progress) BulkStream {
	return download(c, nil, d, limit, prog)
}

// download reads frames from c until stop is closed or, if d > 0, for d
// from the request, then sends the stop byte, reads the end frame and the
// trailer, and checks count and CRC-32C. limit bounds the whole download;
// prog, if not nil, records the arrivals. It runs locked to its OS thread
// and reports that thread's CPU time.
func download(c net.Conn, stop <-chan struct{}, d, limit time.Duration, prog *progress) (s BulkStream) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU()
	defer func() { s.ReaderCPU = threadCPU() - cpu0 }()
	_ = c.SetDeadline(time.Now().Add(limit))
	if _, err := c.Write(sinkRequest(sinkDown, 0)); err != nil {
		s.Error = fmt.Sprintf("write request: %v", err)
		return s
	}
	s.start = time.Now()
	prog.add(s.start, 0)
	// The stop byte is written once stop is closed, unless the download
	// has already ended.
	var mu sync.Mutex
	finished := false
	var stopErr error
	done := make(chan struct{})
	var wg sync.WaitGroup
	var after <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		after = t.C
	}
	wg.Go(func() {
		select {
		case <-stop:
		case <-after:
		case <-done:
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			_, stopErr = c.Write([]byte{0})
		}
	})
	br := bufio.NewReaderSize(c, 256<<10)
	_, err := readSinkDownload(br, func(total int64) {
		s.Bytes = total
		prog.add(time.Now(), total)
	})
	if err == nil {
		s.end = time.Now()
	}
	mu.Lock()
	finished = true // no stop byte after this point
	mu.Unlock()
	close(done)
	wg.Wait()
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
// addr, dialled from namespace ns. prog, if not nil, records the arrivals
// of a single download (par 1; it is ignored for more).
func bulkDownload(ctx context.Context, ns, addr string, par int, d time.Duration, prog *progress) BulkDownload {
	if par > 1 {
		prog = nil
	}
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
			res.Streams[i] = downloadOne(c, d, d+60*time.Second, prog)
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
		res.ReaderCPU += s.ReaderCPU
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
