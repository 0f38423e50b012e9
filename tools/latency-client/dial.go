package main

import (
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/spf13/pflag"
)

// target says where a client command connects: a TCP host and port, or a
// UNIX socket path when unixPath is set.
type target struct {
	host     string
	port     int
	unixPath string
}

func (t *target) addFlags(fs *pflag.FlagSet, defaultPort int) {
	fs.StringVar(&t.host, "server-host", "127.0.0.1", "server host name or IP address")
	fs.IntVar(&t.port, "server-port", defaultPort, "server TCP port")
	fs.StringVar(&t.unixPath, "unix", "", "connect to this UNIX socket path instead of --server-host/--server-port")
}

func (t *target) validate() error {
	if t.unixPath != "" {
		return nil
	}
	var errs []error
	if t.host == "" {
		errs = append(errs, errors.New("--server-host must not be empty"))
	}
	if t.port < 1 || t.port > 65535 {
		errs = append(errs, errors.New("--server-port must be in 1..65535"))
	}
	return errors.Join(errs...)
}

// network and address give the arguments for net.Dialer.DialContext.
func (t *target) network() string {
	if t.unixPath != "" {
		return "unix"
	}
	return "tcp"
}

func (t *target) address() string {
	if t.unixPath != "" {
		return t.unixPath
	}
	// JoinHostPort brackets IPv6 literals.
	return net.JoinHostPort(t.host, strconv.Itoa(t.port))
}

// dial connects to t. The connection is bound to ctx: it gets ctx's deadline
// and is closed when ctx is cancelled, so no read or write on it can outlive
// the run. The returned stop function detaches it from ctx and must be
// called before the connection is closed by the caller.
func (t *target) dial(ctx context.Context) (net.Conn, func() bool, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, t.network(), t.address())
	if err != nil {
		return nil, nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		// Latency probes must not wait for Nagle; Go sets this by default,
		// but say so explicitly since the measurement depends on it.
		_ = tc.SetNoDelay(true)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	return c, stop, nil
}

// closeWriter is implemented by *net.TCPConn and *net.UnixConn.
type closeWriter interface {
	CloseWrite() error
}

// closeWrite half-closes c when it supports it, and fully closes it
// otherwise.
func closeWrite(c net.Conn) error {
	if cw, ok := c.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}
