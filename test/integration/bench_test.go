package integration

import (
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// pingPongSizes are the message sizes of the ping-pong benchmarks (issue 13:
// the message path at 128 B, 1 KiB, 16 KiB and 1 MiB).
var pingPongSizes = []struct {
	name string
	size int
}{{"128B", 128}, {"1KiB", 1 << 10}, {"16KiB", 16 << 10}, {"1MiB", 1 << 20}}

// pingPongRW sends a message and reads its echo in full, b.N times. Messages
// above 64 KiB are written by a second goroutine while the echo is read, so
// that neither side waits for the other's buffers.
func pingPongRW(b *testing.B, c io.ReadWriter, size int) {
	b.Helper()
	msg := make([]byte, size)
	_, _ = rand.Read(msg)
	got := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		var werr chan error
		if size > 64<<10 {
			werr = make(chan error, 1)
			go func() { _, err := c.Write(msg); werr <- err }()
		} else if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, got); err != nil {
			b.Fatal(err)
		}
		if werr != nil {
			if err := <-werr; err != nil {
				b.Fatal(err)
			}
		}
	}
}

func pingPong(b *testing.B, addr string, size int) {
	b.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(b, err)
	defer func() { _ = c.Close() }()
	pingPongRW(b, c, size)
}

// BenchmarkPingPong compares echo round trips on loopback, direct and
// through the tunnel, by message size (report the ratio, never assert it;
// BenchmarkRawQUIC/pingpong is quic-go's own figure; floor is
// startFloorTunnel, the tunnel's structure without quictun's own code).
func BenchmarkPingPong(b *testing.B) {
	echo := testutil.EchoServer(b)
	srv := testutil.StartServer(b, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	cl := testutil.StartClient(b, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})
	floor := startFloorTunnel(b, echo)
	for _, sz := range pingPongSizes {
		b.Run("direct/"+sz.name, func(b *testing.B) { pingPong(b, echo, sz.size) })
		b.Run("tunnel/"+sz.name, func(b *testing.B) { pingPong(b, cl.Addr, sz.size) })
		b.Run("floor/"+sz.name, func(b *testing.B) { pingPong(b, floor, sz.size) })
	}
}

// BenchmarkBulk measures one-way bulk throughput into a discarding destination.
func BenchmarkBulk(b *testing.B) {
	sink := testutil.ServeTCP(b, func(c net.Conn) {
		_, _ = io.Copy(io.Discard, c)
		_ = c.(*net.TCPConn).CloseWrite()
	})
	srv := testutil.StartServer(b, testutil.ServerOptions{Allow: []string{"tcp:" + sink}})
	cl := testutil.StartClient(b, srv, testutil.ClientOptions{Token: "tcp:" + sink, WaitReady: true})
	run := func(b *testing.B, addr string) {
		buf := make([]byte, 64<<10)
		b.SetBytes(int64(len(buf)) * 256)
		for b.Loop() {
			c, err := net.Dial("tcp", addr)
			require.NoError(b, err)
			for range 256 {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			_ = c.(*net.TCPConn).CloseWrite()
			_, _ = io.Copy(io.Discard, c)
			_ = c.Close()
		}
	}
	b.Run("direct", func(b *testing.B) { run(b, sink) })
	b.Run("tunnel", func(b *testing.B) { run(b, cl.Addr) })
}

// BenchmarkShortConnections: connect, one 100-byte round trip, close.
func BenchmarkShortConnections(b *testing.B) {
	echo := testutil.EchoServer(b)
	srv := testutil.StartServer(b, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	cl := testutil.StartClient(b, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})
	floor := startFloorTunnel(b, echo)
	run := func(b *testing.B, addr string) {
		b.RunParallel(func(pb *testing.PB) {
			msg, got := make([]byte, 100), make([]byte, 100) // each goroutine's own
			for pb.Next() {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Error(err)
					return
				}
				if _, err := c.Write(msg); err != nil {
					b.Error(err)
				}
				if _, err := io.ReadFull(c, got); err != nil {
					b.Error(err)
				}
				_ = c.Close()
			}
		})
	}
	b.Run("direct", func(b *testing.B) { run(b, echo) })
	b.Run("tunnel", func(b *testing.B) { run(b, cl.Addr) })
	b.Run("floor", func(b *testing.B) { run(b, floor) })
}
