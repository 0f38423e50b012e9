package integration

import (
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/congestion"
	"github.com/quictun/quictun/pkg/splice"
	"github.com/quictun/quictun/pkg/transport"
)

// cpuSeconds is this process's user+system CPU time.
func cpuSeconds(b *testing.B) float64 {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// bulkRun writes 16 MiB per iteration through a fresh connection made by
// dial and reports CPU seconds per GB (both ends live in this process).
func bulkRun(b *testing.B, dial func() (io.WriteCloser, func())) {
	buf := make([]byte, 64<<10)
	const per = 256
	b.SetBytes(int64(len(buf)) * per)
	cpu0 := cpuSeconds(b)
	for b.Loop() {
		w, wait := dial()
		for range per {
			if _, err := w.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		require.NoError(b, w.Close())
		wait()
	}
	gb := float64(b.N) * float64(len(buf)*per) / 1e9
	b.ReportMetric((cpuSeconds(b)-cpu0)/gb, "cpu-s/GB")
}

// BenchmarkBulkLoopbackCC: one-way bulk on loopback through the tunnel and
// over bare quic-go with the same congestion controller and quic.Config, so
// the ratio is the tunnel's own cost (TCP legs, splice, header). Report the
// ratio, never assert it.
func BenchmarkBulkLoopbackCC(b *testing.B) {
	for _, alg := range congestion.Algorithms {
		setCC := func(o *transport.QUICOptions) { o.Congestion = alg }
		b.Run(string(alg), func(b *testing.B) {
			b.Run("raw-quic", func(b *testing.B) {
				stls, ctls := testutil.SelfSignedTLS(b, "bench")
				o := transport.DefaultQUICOptions()
				setCC(&o)
				ln, err := quic.ListenAddr("127.0.0.1:0", stls, transport.QUICConfig(o))
				require.NoError(b, err)
				defer ln.Close()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				go func() {
					for {
						c, err := ln.Accept(ctx)
						if err != nil {
							return
						}
						go func() {
							for {
								s, err := c.AcceptStream(ctx)
								if err != nil {
									return
								}
								go func() {
									_, _ = io.Copy(io.Discard, s)
									_ = s.Close()
								}()
							}
						}()
					}
				}()
				conn, err := quic.DialAddr(ctx, ln.Addr().String(), ctls, transport.QUICConfig(o))
				require.NoError(b, err)
				defer conn.CloseWithError(0, "")
				bulkRun(b, func() (io.WriteCloser, func()) {
					s, err := conn.OpenStreamSync(ctx)
					require.NoError(b, err)
					return s, func() { _, _ = io.Copy(io.Discard, s) }
				})
			})
			b.Run("tunnel", func(b *testing.B) {
				sink := testutil.ServeTCP(b, func(c net.Conn) {
					_, _ = io.Copy(io.Discard, c)
					_ = c.(*net.TCPConn).CloseWrite()
				})
				srv := testutil.StartServer(b, testutil.ServerOptions{Allow: []string{"tcp:" + sink}, QUIC: setCC})
				cl := testutil.StartClient(b, srv, testutil.ClientOptions{Token: "tcp:" + sink, WaitReady: true, QUIC: setCC})
				bulkRun(b, func() (io.WriteCloser, func()) {
					c, err := net.Dial("tcp", cl.Addr)
					require.NoError(b, err)
					tc := c.(*net.TCPConn)
					return closeWriter{tc}, func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }
				})
			})
			// floor: the tunnel's structure with nothing of quictun's own; its
			// ratio to raw-quic is the floor the tunnel can reach.
			b.Run("floor", func(b *testing.B) {
				sink := testutil.ServeTCP(b, func(c net.Conn) {
					_, _ = io.Copy(io.Discard, c)
					_ = c.(*net.TCPConn).CloseWrite()
				})
				addr := startFloorTunnel(b, sink, setCC)
				bulkRun(b, func() (io.WriteCloser, func()) {
					c, err := net.Dial("tcp", addr)
					require.NoError(b, err)
					return closeWriter{c.(*net.TCPConn)}, func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }
				})
			})
		})
	}
}

// BenchmarkBulkLoopbackTCPLegs: the tunnel's two loopback TCP legs
// without QUIC between them (application -> TCP -> a relay that copies
// through a user buffer, as the tunnel's ends do -> TCP -> sink). Its CPU
// seconds per GB, added to raw-quic's, predict the tunnel's: what the tunnel
// costs beyond them is its own overhead. On a machine whose cores are all
// busy moving the bytes, the legs alone keep tunnel/raw-quic below 1.
func BenchmarkBulkLoopbackTCPLegs(b *testing.B) {
	sink := testutil.ServeTCP(b, func(c net.Conn) {
		_, _ = io.Copy(io.Discard, c)
		_ = c.(*net.TCPConn).CloseWrite()
	})
	relay := testutil.ServeTCP(b, func(c net.Conn) {
		out, err := net.Dial("tcp", sink)
		if err != nil {
			return
		}
		defer out.Close()
		// Plain Reader/Writer: no splice(2) fast path, as the tunnel has none.
		_, _ = io.CopyBuffer(struct{ io.Writer }{out}, struct{ io.Reader }{c}, make([]byte, splice.BufferSize))
		_ = out.(*net.TCPConn).CloseWrite()
		_, _ = io.Copy(io.Discard, out)
		_ = c.(*net.TCPConn).CloseWrite()
	})
	bulkRun(b, func() (io.WriteCloser, func()) {
		c, err := net.Dial("tcp", relay)
		require.NoError(b, err)
		return closeWriter{c.(*net.TCPConn)}, func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }
	})
}

// closeWriter makes Close half-close a TCP connection.
type closeWriter struct{ *net.TCPConn }

func (c closeWriter) Close() error { return c.CloseWrite() }
