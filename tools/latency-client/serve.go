package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// copyBufferSize is the size of the pooled buffers the echo and sink
// handlers use.
const copyBufferSize = 64 << 10

var bufferPool = sync.Pool{New: func() any { b := make([]byte, copyBufferSize); return &b }}

// ServerConfig bounds the resources a Server may use.
type ServerConfig struct {
	// MaxConns is the largest number of connections handled at once; when
	// it is reached the server stops accepting until one ends.
	MaxConns int
	// IdleTimeout closes a connection on which no read or write made
	// progress for this long. Zero disables it.
	IdleTimeout time.Duration
	// DrainTimeout is how long Serve waits, after ctx is cancelled, for
	// open connections to end before it closes them.
	DrainTimeout time.Duration
}

// DefaultServerConfig returns the defaults used by the serve command.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{MaxConns: 4096, IdleTimeout: 5 * time.Minute, DrainTimeout: 5 * time.Second}
}

// handler serves one connection. It must return when the connection is
// closed under it.
type handler func(conn net.Conn, cfg ServerConfig) error

// Serve accepts connections on ln and runs h on each until ctx is cancelled.
// It then closes ln, gives open connections cfg.DrainTimeout to end, closes
// the rest, and returns once every handler goroutine has exited. Serve
// closes ln. It returns nil after a shutdown requested through ctx.
func Serve(ctx context.Context, ln net.Listener, cfg ServerConfig, name string, h handler) error {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 1
	}
	logger := klog.FromContext(ctx).WithValues("service", name)
	var (
		mu    sync.Mutex
		conns = make(map[net.Conn]struct{})
		wg    sync.WaitGroup
		sem   = make(chan struct{}, cfg.MaxConns)
		done  = make(chan struct{})
	)
	stopAccept := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stopAccept()

	var acceptErr error
	var backoff time.Duration
	for {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		c, err := ln.Accept()
		if err != nil {
			<-sem
			if ctx.Err() != nil {
				break
			}
			if errors.Is(err, net.ErrClosed) {
				acceptErr = fmt.Errorf("accept on %s: %w", ln.Addr(), err)
				break
			}
			// Transient failures such as running out of file descriptors
			// are retried with a capped backoff, as net/http does, rather
			// than ending the server.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			logger.Info("Accept failed, retrying", "address", ln.Addr().String(), "delay", backoff, "err", err)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
			continue
		}
		backoff = 0
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := h(c, cfg)
			_ = c.Close()
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			if err != nil && !isExpectedNetErr(err) {
				logger.V(2).Info("Connection failed", "remoteAddress", c.RemoteAddr().String(), "err", err)
			} else {
				logger.V(4).Info("Closed connection", "remoteAddress", c.RemoteAddr().String())
			}
		}()
	}
	_ = ln.Close()

	go func() { wg.Wait(); close(done) }()
	timer := time.NewTimer(cfg.DrainTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		mu.Lock()
		n := len(conns)
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		logger.V(2).Info("Closed connections left after drain", "count", n)
		<-done
	}
	return acceptErr
}

// isExpectedNetErr reports errors that end a connection in the normal course
// of events: EOF, a closed socket, a reset by the peer or an idle timeout.
func isExpectedNetErr(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "connection reset") || strings.Contains(s, "broken pipe")
}

// deadlineConn refreshes the idle deadline before each read and write.
type deadlineConn struct {
	net.Conn
	idle time.Duration
}

func (d deadlineConn) Read(p []byte) (int, error) {
	if d.idle > 0 {
		_ = d.Conn.SetReadDeadline(time.Now().Add(d.idle))
	}
	return d.Conn.Read(p)
}

func (d deadlineConn) Write(p []byte) (int, error) {
	if d.idle > 0 {
		_ = d.Conn.SetWriteDeadline(time.Now().Add(d.idle))
	}
	return d.Conn.Write(p)
}

// handleEcho writes back every byte it reads, in order, until the peer
// half-closes; it then half-closes its own side, so the peer reads EOF
// after the last echoed byte.
func handleEcho(conn net.Conn, cfg ServerConfig) error {
	bp := bufferPool.Get().(*[]byte)
	defer bufferPool.Put(bp)
	buf := *bp
	dc := deadlineConn{Conn: conn, idle: cfg.IdleTimeout}
	for {
		n, rerr := dc.Read(buf)
		if n > 0 {
			if _, werr := dc.Write(buf[:n]); werr != nil {
				return fmt.Errorf("write echo: %w", werr)
			}
		}
		if errors.Is(rerr, io.EOF) {
			return closeWrite(conn)
		}
		if rerr != nil {
			return fmt.Errorf("read: %w", rerr)
		}
	}
}

// listen opens a listener for addr, which is HOST:PORT for TCP or
// unix:/path for a UNIX socket.
func listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		return lc.Listen(ctx, "unix", path)
	}
	return lc.Listen(ctx, "tcp", strings.TrimPrefix(addr, "tcp:"))
}
