// Package floor holds what issue 13's floor tunnel (tools/floortun, and the
// floor variant of the benchmarks in test/integration) is made of beyond
// quic-go: the accept loops of its two ends and the simplest copy between a
// TCP connection and a stream. It is for measurements only; quictun's own
// splice is pkg/splice.
package floor

import (
	"context"
	"io"
	"net"
	"sync"

	"github.com/quic-go/quic-go"
)

// ServeStreams accepts connections on ln, and the streams of each, until ctx
// is done or ln is closed, and runs handle on each stream in a goroutine of
// its own. A connection is closed when its accept loop ends. It returns
// ln.Accept's error once every connection and handler has returned.
func ServeStreams(ctx context.Context, ln *quic.Listener, handle func(*quic.Stream)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept(ctx)
		if err != nil {
			return err
		}
		wg.Go(func() {
			defer func() { _ = c.CloseWithError(0, "") }()
			for {
				s, err := c.AcceptStream(ctx)
				if err != nil {
					return
				}
				wg.Go(func() { handle(s) })
			}
		})
	}
}

// Forward accepts TCP connections on l until it is closed and carries each
// on a new stream of conn: prefix first (if any), then Pipe. It returns once
// every pipe has ended (they end when ctx is done).
func Forward(ctx context.Context, l net.Listener, conn *quic.Conn, prefix []byte) {
	var pipes sync.WaitGroup
	defer pipes.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		pipes.Go(func() {
			s, err := conn.OpenStreamSync(ctx)
			if err != nil {
				_ = c.Close()
				return
			}
			if len(prefix) > 0 {
				if _, err := s.Write(prefix); err != nil {
					s.CancelWrite(0)
					_ = c.Close()
					return
				}
			}
			Pipe(ctx, c.(*net.TCPConn), s)
		})
	}
}

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
