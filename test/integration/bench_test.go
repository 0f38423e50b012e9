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

func pingPong(b *testing.B, addr string, size int) {
	b.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(b, err)
	defer func() { _ = c.Close() }()
	msg := make([]byte, size)
	_, _ = rand.Read(msg)
	got := make([]byte, size)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, got); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPingPong compares 1000-byte echo round trips on loopback, direct
// and through the tunnel (report the ratio, never assert it).
func BenchmarkPingPong(b *testing.B) {
	echo := testutil.EchoServer(b)
	srv := testutil.StartServer(b, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	cl := testutil.StartClient(b, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})
	b.Run("direct", func(b *testing.B) { pingPong(b, echo, 1000) })
	b.Run("tunnel", func(b *testing.B) { pingPong(b, cl.Addr, 1000) })
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
	run := func(b *testing.B, addr string) {
		msg := make([]byte, 100)
		got := make([]byte, 100)
		b.RunParallel(func(pb *testing.PB) {
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
}
