package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/quictun/quictun/pkg/splice"
)

// maxEarlyBytes bounds the application bytes kept for a re-send while a
// connection's 0-RTT outcome is unknown; beyond it, reading waits for the handshake.
const maxEarlyBytes = 256 << 10

// earlyPhase forwards the application's first bytes as 0-RTT data while the
// handshake completes, keeping a copy. If the server accepted 0-RTT it returns
// str unchanged. If it rejected it (all 0-RTT data is then discarded), or the
// connection died before its handshake (the server was still down), it opens a
// stream on the next connection and re-sends a fresh header and the copy. Downstream bytes cannot arrive before the handshake completes, so only
// the upstream direction needs this.
func (c *Client) earlyPhase(ctx context.Context, conn *quic.Conn, nc splice.Conn, str *quic.Stream, token string) (*quic.Stream, error) {
	var sent []byte
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 16<<10)
		for len(sent) < maxEarlyBytes {
			n, err := nc.Read(buf)
			if n > 0 {
				sent = append(sent, buf[:n]...)
				_, _ = str.Write(buf[:n]) // fails with Err0RTTRejected on rejection; the copy is re-sent
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case <-conn.HandshakeComplete():
	case <-conn.Context().Done():
	case <-ctx.Done():
	}
	_ = nc.SetReadDeadline(time.Now()) // stop the reader; what it read was forwarded
	rerr := <-done
	_ = nc.SetReadDeadline(time.Time{})
	if rerr != nil && !errors.Is(rerr, io.EOF) && !errors.Is(rerr, os.ErrDeadlineExceeded) {
		return nil, fmt.Errorf("read before handshake: %w", rerr)
	}
	if conn.Context().Err() == nil && conn.ConnectionState().Used0RTT {
		return str, nil
	}
	str.CancelRead(0) // discarded with the rest of the 0-RTT data
	str.CancelWrite(0)
	var next *quic.Conn
	if conn.Context().Err() == nil {
		// Rejected: the same connection goes on without 0-RTT.
		n, err := conn.NextConnection(ctx)
		if err != nil {
			return nil, fmt.Errorf("connection after 0-RTT rejection: %w", err)
		}
		next = n
	} else {
		// The server never answered (it may still be down): wait for the
		// supervisor's next connection, with its handshake done.
		for next == nil {
			sess, err := c.waitSession(ctx)
			if err != nil {
				return nil, fmt.Errorf("connection died before its handshake: %w", err)
			}
			select {
			case <-sess.conn.HandshakeComplete():
				if sess.conn.Context().Err() == nil {
					next = sess.conn
				}
			case <-sess.conn.Context().Done():
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	octx, cancel := context.WithTimeout(ctx, c.cfg.StreamOpenTimeout)
	defer cancel()
	nstr, err := next.OpenStreamSync(octx)
	if err != nil {
		return nil, fmt.Errorf("stream after 0-RTT rejection: %w", err)
	}
	hb, err := c.header(token)
	if err == nil {
		_, err = nstr.Write(append(hb, sent...))
	}
	if err != nil {
		nstr.CancelRead(0)
		nstr.CancelWrite(0)
		return nil, fmt.Errorf("re-send after 0-RTT rejection: %w", err)
	}
	return nstr, nil
}
