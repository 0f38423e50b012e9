package integration

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/transport"
)

// rawQUIC starts a bare quic-go echo (or discard) server and returns a
// connected client: the baseline the tunnel is compared with.
func rawQUIC(b *testing.B, discard bool) *quic.Conn {
	b.Helper()
	st, err := transport.LoadOrCreateState(b.TempDir(), "", "")
	require.NoError(b, err)
	qconf := transport.QUICConfig(transport.DefaultQUICOptions())
	ln, err := quic.ListenAddr("127.0.0.1:0", transport.ServerTLSConfig(st, nil), qconf)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		for {
			s, err := c.AcceptStream(ctx)
			if err != nil {
				return
			}
			go func() {
				if discard {
					_, _ = io.Copy(io.Discard, s)
				} else {
					_, _ = io.Copy(s, s)
				}
				_ = s.Close()
			}()
		}
	}()
	tlsConf, err := transport.ClientTLSConfig(transport.ClientTLSOptions{InsecureSkipVerify: true})
	require.NoError(b, err)
	conn, err := quic.DialAddr(ctx, ln.Addr().String(), tlsConf, qconf)
	require.NoError(b, err)
	b.Cleanup(func() {
		_ = conn.CloseWithError(0, "")
		cancel()
		_ = ln.Close()
		<-done
	})
	return conn
}

// BenchmarkRawQUIC is the quic-go baseline for BenchmarkPingPong and BenchmarkBulk.
func BenchmarkRawQUIC(b *testing.B) {
	b.Run("pingpong", func(b *testing.B) {
		conn := rawQUIC(b, false)
		for _, sz := range pingPongSizes {
			b.Run(sz.name, func(b *testing.B) {
				s, err := conn.OpenStreamSync(context.Background())
				require.NoError(b, err)
				pingPongRW(b, s, sz.size)
				s.CancelRead(0)
				_ = s.Close()
			})
		}
	})
	b.Run("bulk", func(b *testing.B) {
		conn := rawQUIC(b, true)
		buf := make([]byte, 64<<10)
		b.SetBytes(int64(len(buf)) * 256)
		for b.Loop() {
			s, err := conn.OpenStreamSync(context.Background())
			require.NoError(b, err)
			for range 256 {
				if _, err := s.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			_ = s.Close()
			_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.Copy(io.Discard, s)
		}
	})
}
