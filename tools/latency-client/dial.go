package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
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
	// socks5 is a SOCKS5 proxy (HOST:PORT) to connect through: the proxy
	// is asked to CONNECT to host:port, and its answer is part of connect_ms.
	socks5 string
}

func (t *target) addFlags(fs *pflag.FlagSet, defaultPort int) {
	fs.StringVar(&t.host, "server-host", "127.0.0.1", "server host name or IP address")
	fs.IntVar(&t.port, "server-port", defaultPort, "server TCP port")
	fs.StringVar(&t.unixPath, "unix", "", "connect to this UNIX socket path instead of --server-host/--server-port")
	fs.StringVar(&t.socks5, "socks5", "", "connect through this SOCKS5 proxy (HOST:PORT, no authentication), asking it for --server-host:--server-port (a name is resolved by the proxy); the proxy's answer counts in connect_ms")
}

func (t *target) validate() error {
	if t.unixPath != "" {
		if t.socks5 != "" {
			return errors.New("--socks5 connects to --server-host/--server-port, not --unix")
		}
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
	network, address := t.network(), t.address()
	if t.socks5 != "" {
		network, address = "tcp", t.socks5
	}
	c, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, nil, err
	}
	if t.socks5 != "" {
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		if err := socksConnect(c, t.host, t.port); err != nil {
			_ = c.Close()
			return nil, nil, err
		}
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

// socksConnect asks the SOCKS5 proxy on c (no authentication) to CONNECT to
// host:port and reads its answer (RFC 1928). Greeting and request go in one
// write: the proxy's answer is the only wait.
func socksConnect(c net.Conn, host string, port int) error {
	req := []byte{5, 1, 0, 5, 1, 0}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() {
		req = append(append(req, 1), ip.AsSlice()...)
	} else if err == nil {
		req = append(append(req, 4), ip.AsSlice()...)
	} else {
		if len(host) > 255 {
			return errors.New("socks5: host name longer than 255 bytes")
		}
		req = append(append(req, 3, byte(len(host))), host...)
	}
	req = append(req, byte(port>>8), byte(port))
	if _, err := c.Write(req); err != nil {
		return fmt.Errorf("socks5: %w", err)
	}
	var resp [5]byte // method choice, then VER REP RSV ATYP and one byte of the address
	if _, err := io.ReadFull(c, resp[:2]); err != nil {
		return fmt.Errorf("socks5: %w", err)
	}
	if resp[0] != 5 || resp[1] != 0 {
		return fmt.Errorf("socks5: the proxy wants authentication method %d", resp[1])
	}
	if _, err := io.ReadFull(c, resp[:]); err != nil {
		return fmt.Errorf("socks5: %w", err)
	}
	if resp[1] != 0 {
		return fmt.Errorf("socks5: the proxy answered %d (2: not allowed by ruleset, 5: connection refused)", resp[1])
	}
	rest := 0 // bytes of the bound address left, then the port
	switch resp[3] {
	case 1:
		rest = 4 - 1 + 2
	case 4:
		rest = 16 - 1 + 2
	case 3:
		rest = int(resp[4]) + 2
	default:
		return fmt.Errorf("socks5: unknown address type %d in the answer", resp[3])
	}
	_, err := io.ReadFull(c, make([]byte, rest))
	return err
}
