// Package floor holds what issue 13's floor tunnel (tools/floortun, and the
// floor variant of the benchmarks in test/integration) is made of beyond
// quic-go: the simplest copy between a TCP connection and a stream. It is
// for measurements only; quictun's own splice is pkg/splice.
package floor

import (
	"context"
	"io"
	"net"

	"github.com/quic-go/quic-go"
)

// Pipe copies both ways between c and s through 32 KiB buffers (no splice(2)
// fast path, as a tunnel's stream has none), passes each EOF on as a
// half-close, and closes both at the end or when ctx is done.
func Pipe(ctx context.Context, c *net.TCPConn, s *quic.Stream) {
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
