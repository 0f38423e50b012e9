package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testTimeout bounds every scenario; a hung test fails instead of waiting
// for the go test deadline.
const testTimeout = 30 * time.Second

func testServerConfig() ServerConfig {
	return ServerConfig{MaxConns: 64, IdleTimeout: 10 * time.Second, DrainTimeout: 2 * time.Second}
}

// startServer runs Serve with h on a fresh loopback listener and stops it
// when the test ends.
func startServer(t *testing.T, network, address string, h handler) net.Listener {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), network, address)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, testServerConfig(), "test", h) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(testTimeout):
			t.Error("Serve did not return after cancel")
		}
	})
	return ln
}

func tcpTarget(t *testing.T, ln net.Listener) target {
	t.Helper()
	host, port, err := net.SplitHostPort(ln.Addr().String())
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	return target{host: host, port: p}
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func TestProbeEcho(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", handleEcho)
	o := newProbeOptions()
	o.target = tcpTarget(t, ln)
	o.number = 200
	require.NoError(t, o.validate())

	r := runProbe(testCtx(t), o)
	require.Zero(t, r.Errors, r.ErrorMessages)
	assert.Equal(t, 200, r.RoundTrips)
	assert.Equal(t, int64(1000), r.Size)
	assert.Equal(t, 1, r.Connections)
	require.Len(t, r.PerConnection, 1)
	assert.Positive(t, r.FirstPacketMs)
	assert.Positive(t, r.ConnectMs)
	assert.LessOrEqual(t, r.MinMs, r.P50Ms)
	assert.LessOrEqual(t, r.P50Ms, r.P90Ms)
	assert.LessOrEqual(t, r.P90Ms, r.P99Ms)
	assert.LessOrEqual(t, r.P99Ms, r.MaxMs)
	assert.LessOrEqual(t, r.FirstPacketMs, r.MaxMs)
	// Total is wall time over all round trips, so at least their sum's
	// share: never less than the largest single round trip.
	assert.GreaterOrEqual(t, r.TotalMs, r.MaxMs)
	assert.InDelta(t, float64(r.RoundTrips)/(r.TotalMs/1000), r.TPS, r.TPS*1e-6)
}

func TestProbeConnections(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", handleEcho)
	o := newProbeOptions()
	o.target = tcpTarget(t, ln)
	o.number = 100
	o.connections = 8
	r := runProbe(testCtx(t), o)
	require.Zero(t, r.Errors, r.ErrorMessages)
	assert.Equal(t, 800, r.RoundTrips)
	require.Len(t, r.PerConnection, 8)
	for _, c := range r.PerConnection {
		assert.Equal(t, 100, c.RoundTrips)
		assert.Empty(t, c.Error)
		assert.LessOrEqual(t, c.TotalMs, r.TotalMs+1e-6)
	}
	assert.Positive(t, r.TPS)
}

func TestProbeLargeMessages(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", handleEcho)
	for _, size := range []int64{1, 7, 8, inlineWriteLimit, inlineWriteLimit + 1, 1 << 20, 16 << 20} {
		t.Run(formatByteSize(size), func(t *testing.T) {
			o := newProbeOptions()
			o.target = tcpTarget(t, ln)
			o.size = byteSize(size)
			o.number = 3
			require.NoError(t, o.validate())
			r := runProbe(testCtx(t), o)
			require.Zero(t, r.Errors, r.ErrorMessages)
			assert.Equal(t, 3, r.RoundTrips)
		})
	}
}

func TestProbeUnixSocket(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "echo.sock")
	startServer(t, "unix", path, handleEcho)
	o := newProbeOptions()
	o.target = target{unixPath: path}
	o.number = 50
	r := runProbe(testCtx(t), o)
	require.Zero(t, r.Errors, r.ErrorMessages)
	assert.Equal(t, 50, r.RoundTrips)
	assert.Equal(t, "unix:"+path, r.Target)
}

// corruptingEcho echoes faithfully except that it flips one bit of the
// 1500th byte it sees.
func corruptingEcho(conn net.Conn, _ ServerConfig) error {
	buf := make([]byte, 4096)
	var seen int
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if seen <= 1500 && 1500 < seen+n {
				buf[1500-seen] ^= 0x01
			}
			seen += n
			if _, werr := conn.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			return closeWrite(conn)
		}
	}
}

func TestProbeFailsOnCorruptedEcho(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", corruptingEcho)
	tg := tcpTarget(t, ln)
	var out, errOut bytes.Buffer
	code := execute(testCtx(t), []string{"--server-port", strconv.Itoa(tg.port), "--number", "10"}, &out, &errOut)
	assert.Equal(t, 1, code)
	// Byte 1500 is byte 500 of the second 1000-byte message.
	assert.Contains(t, errOut.String(), "round trip 2: echo differs from request at byte 500")
	assert.Contains(t, out.String(), "errors: 1")
}

// truncatingEcho echoes only the first half of what it reads, then closes.
func truncatingEcho(conn net.Conn, _ ServerConfig) error {
	buf := make([]byte, 4096)
	n, err := io.ReadAtLeast(conn, buf, 2)
	if err != nil {
		return err
	}
	_, _ = conn.Write(buf[:n/2])
	return nil
}

// chattyEcho echoes and then adds one byte nobody asked for.
func chattyEcho(conn net.Conn, _ ServerConfig) error {
	if err := handleEchoNoClose(conn); err != nil {
		return err
	}
	_, _ = conn.Write([]byte{'!'})
	return closeWrite(conn)
}

func handleEchoNoClose(conn net.Conn) error {
	_, err := io.Copy(conn, readerOnly{conn})
	return err
}

func TestProbeFailsOnBadServers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		h       handler
		wantErr string
	}{
		{"truncated echo", truncatingEcho, "read echo"},
		{"extra bytes", chattyEcho, "never requested"},
		{"corrupted echo", corruptingEcho, "differs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln := startServer(t, "tcp", "127.0.0.1:0", tc.h)
			o := newProbeOptions()
			o.target = tcpTarget(t, ln)
			o.number = 5
			r := runProbe(testCtx(t), o)
			require.Equal(t, 1, r.Errors)
			require.Len(t, r.ErrorMessages, 1)
			assert.Contains(t, r.ErrorMessages[0], tc.wantErr)
		})
	}
}

func TestProbeConnectFailure(t *testing.T) {
	t.Parallel()
	// Take a free port and release it, so nothing listens there.
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tg := tcpTarget(t, ln)
	require.NoError(t, ln.Close())
	var out, errOut bytes.Buffer
	code := execute(testCtx(t), []string{"--server-port", strconv.Itoa(tg.port), "--json"}, &out, &errOut)
	assert.Equal(t, 1, code)
	var r ProbeReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &r))
	assert.Equal(t, 1, r.Errors)
	assert.Zero(t, r.RoundTrips)
	assert.Contains(t, errOut.String(), "connect")
}

func TestProbeTimeout(t *testing.T) {
	t.Parallel()
	// A server that accepts and never answers.
	silent := func(conn net.Conn, _ ServerConfig) error {
		_, err := io.Copy(io.Discard, conn)
		return err
	}
	ln := startServer(t, "tcp", "127.0.0.1:0", silent)
	o := newProbeOptions()
	o.target = tcpTarget(t, ln)
	o.timeout = 200 * time.Millisecond
	start := time.Now()
	r := runProbe(testCtx(t), o)
	assert.Less(t, time.Since(start), 10*time.Second)
	require.Equal(t, 1, r.Errors)
	assert.Contains(t, r.ErrorMessages[0], "timeout")
}

func TestProbeJSONOutput(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", handleEcho)
	tg := tcpTarget(t, ln)
	var out, errOut bytes.Buffer
	code := execute(testCtx(t), []string{
		"--server-host", "127.0.0.1", "--server-port", strconv.Itoa(tg.port),
		"--size", "2KiB", "--number", "20", "--connections", "2", "--json",
	}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	var m map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &m), out.String())
	for _, k := range []string{
		"first_packet_ms", "total_ms", "connect_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms",
		"size", "number", "connections", "errors", "tps", "round_trips", "per_connection",
	} {
		assert.Contains(t, m, k)
	}
	assert.InDelta(t, 2048, m["size"], 0)
	assert.InDelta(t, 20, m["number"], 0)
	assert.InDelta(t, 2, m["connections"], 0)
	assert.InDelta(t, 0, m["errors"], 0)
	assert.InDelta(t, 40, m["round_trips"], 0)
	assert.Equal(t, 1, strings.Count(strings.TrimSpace(out.String()), "\n")+1, "exactly one JSON line")
}

func TestProbeTextOutput(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", handleEcho)
	tg := tcpTarget(t, ln)
	var out, errOut bytes.Buffer
	code := execute(testCtx(t), []string{"--server-port", strconv.Itoa(tg.port), "--number", "30"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	lines := strings.Split(out.String(), "\n")
	require.GreaterOrEqual(t, len(lines), 7)
	num := `[0-9]+(\.[0-9]+)?`
	// quic-tun's two lines come first, in its exact format.
	assert.Regexp(t, regexp.MustCompile(`^First packet latency: `+num+` ms$`), lines[0])
	assert.Regexp(t, regexp.MustCompile(`^Total latency: `+num+` ms$`), lines[1])
	for _, l := range []string{"Connect", "p50", "p90", "p99", "Max"} {
		assert.Regexp(t, regexp.MustCompile(`(?m)^`+l+` latency: `+num+` ms$`), out.String())
	}
	assert.Contains(t, out.String(), "Round trips: 30 of 30 x 1000 bytes")
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"zero size", []string{"--size", "0"}, "--size"},
		{"huge size", []string{"--size", "1GiB"}, "--size"},
		{"bad size", []string{"--size", "lots"}, "invalid"},
		{"zero number", []string{"--number", "0"}, "--number"},
		{"bad port", []string{"--server-port", "70000"}, "--server-port"},
		{"positional", []string{"extra"}, "unknown command"},
		{"unknown flag", []string{"--nope"}, "unknown flag"},
		{"bulk both", []string{"bulk", "--bytes", "1MiB", "--duration", "1s"}, "mutually exclusive"},
		{"bulk direction", []string{"bulk", "--direction", "sideways"}, "--direction"},
		{"connrate concurrency", []string{"connrate", "--concurrency", "0"}, "--concurrency"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			code := execute(testCtx(t), tc.args, &out, &errOut)
			assert.NotZero(t, code)
			assert.Contains(t, errOut.String(), tc.want)
		})
	}
}

func TestServeHalfClose(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", handleEcho)
	var d net.Dialer
	c, err := d.DialContext(testCtx(t), "tcp", ln.Addr().String())
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	require.NoError(t, c.SetDeadline(time.Now().Add(testTimeout)))

	payload := bytes.Repeat([]byte("half-close "), 100_000) // > socket buffers
	writeErr := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		writeErr <- err
	}()
	// The server must echo everything sent before our FIN, then send its
	// own FIN: ReadAll returns only on that EOF.
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	require.NoError(t, <-writeErr)
	assert.Equal(t, len(payload), len(got))
	assert.True(t, bytes.Equal(payload, got))
}

func TestServeHalfCloseEmpty(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", handleEcho)
	var d net.Dialer
	c, err := d.DialContext(testCtx(t), "tcp", ln.Addr().String())
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	require.NoError(t, c.SetDeadline(time.Now().Add(testTimeout)))
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	assert.Empty(t, got)
}

func TestServeGracefulStop(t *testing.T) {
	t.Parallel()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := testServerConfig()
	cfg.DrainTimeout = 200 * time.Millisecond
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, cfg, "test", handleEcho) }()

	// An open, idle connection must not keep the server up past the drain.
	var d net.Dialer
	c, err := d.DialContext(testCtx(t), "tcp", ln.Addr().String())
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	require.NoError(t, c.SetDeadline(time.Now().Add(testTimeout)))
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)

	start := time.Now()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(testTimeout):
		t.Fatal("Serve did not stop")
	}
	assert.GreaterOrEqual(t, time.Since(start), cfg.DrainTimeout)
	// The server closed our connection and no longer accepts.
	_, err = c.Read(buf)
	require.Error(t, err)
	_, err = d.DialContext(testCtx(t), "tcp", ln.Addr().String())
	require.Error(t, err)
}

func TestServeCommandStopsOnCancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(testCtx(t))
	out := &syncBuffer{}
	var errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- execute(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--sink-listen", "127.0.0.1:0"}, out, &errOut)
	}()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "The sink server listen on") }, testTimeout, 10*time.Millisecond)
	assert.Regexp(t, `^The server listen on 127\.0\.0\.1:[0-9]+\n`, out.String())
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, 0, code, errOut.String())
	case <-time.After(testTimeout):
		t.Fatal("serve did not stop")
	}
}

func TestBulk(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", handleSink)
	tests := []struct {
		name      string
		direction string
		bytes     int64
		duration  time.Duration
		parallel  int
	}{
		{"up bytes", "up", 8<<20 + 3, 0, 1},
		{"down bytes", "down", 8<<20 + 3, 0, 1},
		{"up bytes parallel", "up", 32 << 20, 0, 4},
		{"down bytes parallel uneven", "down", 10<<20 + 1, 0, 3},
		{"up duration", "up", 0, 200 * time.Millisecond, 2},
		{"down duration", "down", 0, 200 * time.Millisecond, 2},
		{"tiny", "down", 5, 0, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := newBulkOptions()
			o.target = tcpTarget(t, ln)
			o.direction = tc.direction
			o.bytes = byteSize(tc.bytes)
			o.duration = tc.duration
			o.parallel = tc.parallel
			o.complete()
			require.NoError(t, o.validate())
			r := runBulk(testCtx(t), o)
			require.Zero(t, r.Errors, r.Streams)
			assert.True(t, r.Verified)
			require.Len(t, r.Streams, tc.parallel)
			if tc.bytes > 0 {
				assert.Equal(t, tc.bytes, r.Bytes)
			} else {
				assert.Positive(t, r.Bytes)
				assert.GreaterOrEqual(t, r.Seconds, tc.duration.Seconds())
			}
			var sum int64
			for _, s := range r.Streams {
				sum += s.Bytes
				assert.True(t, s.Verified)
			}
			assert.Equal(t, r.Bytes, sum)
			assert.InDelta(t, float64(r.Bytes)*8/r.Seconds/1e6, r.MbitPerS, r.MbitPerS*1e-6)
		})
	}
}

// lyingSink answers like handleSink but reports a wrong checksum.
func lyingSink(conn net.Conn, _ ServerConfig) error {
	req := make([]byte, sinkRequestSize)
	if _, err := io.ReadFull(conn, req); err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, conn)
	if err != nil {
		return err
	}
	_, err = conn.Write(sinkTrailer{count: uint64(n), crc: 12345}.encode())
	return err
}

// droppingSink sends a download one frame short but claims the full count.
func droppingSink(conn net.Conn, _ ServerConfig) error {
	req := make([]byte, sinkRequestSize)
	if _, err := io.ReadFull(conn, req); err != nil {
		return err
	}
	r, err := decodeSinkRequest(req)
	if err != nil {
		return err
	}
	p := newPattern()
	var hdr [4]byte
	binary := func(n uint32) []byte {
		hdr[0], hdr[1], hdr[2], hdr[3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
		return hdr[:]
	}
	_, _ = conn.Write(binary(1000))
	_, _ = conn.Write(p.next(1000))
	_, _ = conn.Write(binary(0))
	_, err = conn.Write(sinkTrailer{count: r.count, crc: 0}.encode())
	return err
}

func TestBulkDetectsBadTransfer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, direction string
		h               handler
		want            string
	}{
		{"bad checksum", "up", lyingSink, "CRC-32C"},
		{"short download", "down", droppingSink, "server sent 4096 bytes, client received 1000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln := startServer(t, "tcp", "127.0.0.1:0", tc.h)
			tg := tcpTarget(t, ln)
			var out, errOut bytes.Buffer
			code := execute(testCtx(t), []string{"bulk", "--server-port", strconv.Itoa(tg.port),
				"--bytes", "4KiB", "--direction", tc.direction, "--json"}, &out, &errOut)
			assert.Equal(t, 1, code)
			var r BulkReport
			require.NoError(t, json.Unmarshal(out.Bytes(), &r))
			assert.False(t, r.Verified)
			assert.Equal(t, 1, r.Errors)
			assert.Contains(t, errOut.String(), tc.want)
		})
	}
}

func TestBulkCommandJSON(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", handleSink)
	tg := tcpTarget(t, ln)
	var out, errOut bytes.Buffer
	code := execute(testCtx(t), []string{"bulk", "--server-port", strconv.Itoa(tg.port),
		"--bytes", "4MiB", "--parallel", "2", "--direction", "down", "--json"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	var m map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &m))
	for _, k := range []string{"direction", "parallel", "bytes", "seconds", "mbit_per_s", "verified", "errors", "streams"} {
		assert.Contains(t, m, k)
	}
	assert.InDelta(t, 4<<20, m["bytes"], 0)
	assert.Equal(t, true, m["verified"])
}

func TestConnrate(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", handleEcho)
	tg := tcpTarget(t, ln)
	for _, halfClose := range []bool{false, true} {
		t.Run("half-close="+strconv.FormatBool(halfClose), func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			code := execute(testCtx(t), []string{"connrate", "--server-port", strconv.Itoa(tg.port),
				"--number", "200", "--size", "100", "--concurrency", "8", "--json",
				"--half-close=" + strconv.FormatBool(halfClose)}, &out, &errOut)
			require.Equal(t, 0, code, errOut.String())
			var r ConnrateReport
			require.NoError(t, json.Unmarshal(out.Bytes(), &r))
			assert.Equal(t, halfClose, r.HalfClose)
			checkConnrate(t, &r)
		})
	}
}

func checkConnrate(t *testing.T, r *ConnrateReport) {
	t.Helper()
	assert.Equal(t, 200, r.Completed)
	assert.Zero(t, r.Errors)
	assert.Positive(t, r.ConnsPerSecond)
	assert.InDelta(t, float64(r.Completed)/r.Seconds, r.ConnsPerSecond, r.ConnsPerSecond*1e-6)
	assert.LessOrEqual(t, r.Connect.P50Ms, r.FirstByte.P50Ms)
	assert.LessOrEqual(t, r.FirstByte.P50Ms, r.Transaction.P50Ms)
	assert.LessOrEqual(t, r.FirstByte.P99Ms, r.FirstByte.MaxMs)
}

func TestConnrateCountsFailures(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", corruptingEcho)
	o := newConnrateOptions()
	o.target = tcpTarget(t, ln)
	o.number = 20
	o.size = 2000 // byte 1500 gets corrupted on every connection
	r := runConnrate(testCtx(t), o)
	assert.Equal(t, 20, r.Errors)
	assert.Zero(t, r.Completed)
	assert.Contains(t, r.FirstError, "differs")
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestSweep(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", handleEcho)
	tg := tcpTarget(t, ln)
	var out, errOut bytes.Buffer
	code := execute(testCtx(t), []string{"sweep", "--server-port", strconv.Itoa(tg.port),
		"--sizes", "1,64KiB,16MiB", "--number", "3", "--json"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	var r SweepReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &r))
	require.Len(t, r.Runs, 3)
	for i, want := range []int64{1, 64 << 10, 16 << 20} {
		assert.Equal(t, want, r.Runs[i].Size)
		assert.Equal(t, 3, r.Runs[i].RoundTrips)
		assert.Zero(t, r.Runs[i].Errors)
	}

	out.Reset()
	code = execute(testCtx(t), []string{"sweep", "--server-port", strconv.Itoa(tg.port), "--sizes", "1,2", "--number", "2"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3, "header and one row per size")
	assert.Contains(t, lines[0], "trips/s")
}

func TestServeClosedListener(t *testing.T) {
	t.Parallel()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	// A listener closed by someone else ends Serve with an error rather
	// than a retry loop.
	err = Serve(testCtx(t), ln, testServerConfig(), "test", handleEcho)
	require.ErrorIs(t, err, net.ErrClosed)
}

// fullCloseEcho echoes until EOF and then closes both directions at once,
// like quic-tun's tunnel, which does not carry half-closes.
func fullCloseEcho(conn net.Conn, _ ServerConfig) error {
	_, err := io.Copy(conn, readerOnly{conn})
	if err == nil {
		err = conn.(*net.TCPConn).SetLinger(0) // reset instead of FIN
	}
	return err
}

func TestClientsToleratePathsWithoutHalfClose(t *testing.T) {
	t.Parallel()
	ln := startServer(t, "tcp", "127.0.0.1:0", fullCloseEcho)
	o := newProbeOptions()
	o.target = tcpTarget(t, ln)
	o.number = 20
	r := runProbe(testCtx(t), o)
	require.Zero(t, r.Errors, r.ErrorMessages)
	assert.Equal(t, 20, r.RoundTrips)

	co := newConnrateOptions()
	co.target = o.target
	co.number = 20
	cr := runConnrate(testCtx(t), co)
	require.Zero(t, cr.Errors, cr.FirstError)
	assert.Equal(t, 20, cr.Completed)
}

func TestProbeLargeMessageToDeadServer(t *testing.T) {
	t.Parallel()
	testDone := t.Context().Done()
	// The server reads a little, half-closes without echoing, then stops
	// reading, so a 16 MiB request can never be written in full.
	stuckEcho := func(conn net.Conn, _ ServerConfig) error {
		if _, err := conn.Read(make([]byte, 1024)); err != nil {
			return err
		}
		_ = closeWrite(conn)
		<-testDone
		return nil
	}
	ln := startServer(t, "tcp", "127.0.0.1:0", stuckEcho)
	o := newProbeOptions()
	o.target = tcpTarget(t, ln)
	o.size = 16 << 20
	o.number = 2
	start := time.Now()
	r := runProbe(testCtx(t), o)
	// The server half-closes without echoing: the read fails at once and
	// the blocked 16 MiB write must not hold the probe until --timeout.
	assert.Less(t, time.Since(start), 10*time.Second)
	require.Equal(t, 1, r.Errors)
	assert.Contains(t, r.ErrorMessages[0], "read echo")
}
