package integration

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/transport"
)

// startFloorTunnel starts the simplest TCP-over-QUIC tunnel to dest and
// returns its client's TCP address: one quic-go connection with the tunnel's
// quic.Config, a stream per TCP connection, plain copies, no header, no auth,
// no metrics. It is the tunnel's structure with nothing of quictun's own: its
// ratio to raw-quic is the floor the tunnel can reach. The client must send
// first (quic-go accepts a stream at its first frame). Benchmarks only.
func startFloorTunnel(b *testing.B, dest string, quicOpts ...func(*transport.QUICOptions)) (addr string) {
	b.Helper()
	o := transport.DefaultQUICOptions()
	for _, f := range quicOpts {
		f(&o)
	}
	stls, ctls := testutil.SelfSignedTLS(b, "floor")
	ln, err := quic.ListenAddr("127.0.0.1:0", stls, transport.QUICConfig(o))
	require.NoError(b, err)
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	b.Cleanup(func() {
		cancel()
		_ = tln.Close()
		_ = ln.Close()
		wg.Wait()
	})

	wg.Go(func() {
		for {
			c, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			wg.Go(func() {
				defer func() { _ = c.CloseWithError(0, "") }()
				for {
					s, err := c.AcceptStream(ctx)
					if err != nil {
						return
					}
					wg.Go(func() {
						tc, err := net.Dial("tcp", dest)
						if err != nil {
							s.CancelRead(0)
							s.CancelWrite(0)
							return
						}
						floorPipe(ctx, tc.(*net.TCPConn), s)
					})
				}
			})
		}
	})

	conn, err := quic.DialAddr(ctx, ln.Addr().String(), ctls, transport.QUICConfig(o))
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.CloseWithError(0, "") }) // runs before the cleanup above
	wg.Go(func() {
		for {
			c, err := tln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				s, err := conn.OpenStreamSync(ctx)
				if err != nil {
					_ = c.Close()
					return
				}
				floorPipe(ctx, c.(*net.TCPConn), s)
			})
		}
	})
	return tln.Addr().String()
}

// floorPipe copies both ways between c and s through 32 KiB buffers (no
// splice(2) fast path), passes each EOF on as a half-close, and closes both
// at the end or when ctx is done.
func floorPipe(ctx context.Context, c *net.TCPConn, s *quic.Stream) {
	stop := context.AfterFunc(ctx, func() {
		s.CancelRead(0)
		s.CancelWrite(0)
		_ = c.Close()
	})
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{s}, make([]byte, 32<<10))
		if err != nil {
			s.CancelRead(0)
		}
		_ = c.CloseWrite()
	}()
	_, err := io.CopyBuffer(struct{ io.Writer }{s}, struct{ io.Reader }{c}, make([]byte, 32<<10))
	if err != nil {
		s.CancelWrite(0)
	} else {
		_ = s.Close()
	}
	<-done
	s.CancelRead(0) // no-op after EOF; otherwise stops the peer's writes
	_ = c.Close()
}
