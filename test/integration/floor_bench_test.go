package integration

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/floor"
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
		_ = floor.ServeStreams(ctx, ln, func(s *quic.Stream) {
			tc, err := net.Dial("tcp", dest)
			if err != nil {
				s.CancelRead(0)
				s.CancelWrite(0)
				return
			}
			floor.Pipe(ctx, tc.(*net.TCPConn), s)
		})
	})

	conn, err := quic.DialAddr(ctx, ln.Addr().String(), ctls, transport.QUICConfig(o))
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.CloseWithError(0, "") }) // runs before the cleanup above
	wg.Go(func() { floor.Forward(ctx, tln, conn, nil) })
	return tln.Addr().String()
}
