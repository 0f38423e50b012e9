//go:build unix

package resume

import (
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quictun/quictun/pkg/splice"
)

// sockConn is an imported tunnel's application socket as the previous
// process handed it over: the descriptor received, served by the runtime's
// poller as an *os.File. net.FileConn would make a net.Conn of it by
// duplicating the descriptor and asking the kernel for its type, its
// addresses and its options again (about twelve system calls, and two
// more to close the file it was made from): in perf of a 1,000-tunnel
// upgrade, 8 % of the new server's CPU and 14 % of the new client's while
// they took the tunnels over, on the path of the re-attachments.
type sockConn struct {
	f *os.File
}

// importConn makes f, a stream socket's descriptor in non-blocking mode
// (as one handed over is), the tunnel's connection; it takes f. A
// descriptor the poller does not serve (blocking) goes through
// net.FileConn, as before.
func importConn(f *os.File) (splice.Conn, error) {
	if f.SetDeadline(time.Time{}) != nil { // not in the poller: no deadlines
		return netFileConn(f)
	}
	return &sockConn{f: f}, nil
}

func (c *sockConn) Read(b []byte) (int, error)         { return c.f.Read(b) }
func (c *sockConn) Write(b []byte) (int, error)        { return c.f.Write(b) }
func (c *sockConn) Close() error                       { return c.f.Close() }
func (c *sockConn) SetDeadline(t time.Time) error      { return c.f.SetDeadline(t) }
func (c *sockConn) SetReadDeadline(t time.Time) error  { return c.f.SetReadDeadline(t) }
func (c *sockConn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }

// CloseWrite shuts the socket's write side down (the peer reads EOF).
func (c *sockConn) CloseWrite() error {
	return c.control("shutdown", func(fd int) error { return unix.Shutdown(fd, unix.SHUT_WR) })
}

// SetLinger sets SO_LINGER (0: Close resets the connection).
func (c *sockConn) SetLinger(sec int) error {
	return c.control("setsockopt", func(fd int) error {
		return unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: int32(sec)})
	})
}

// File returns a duplicate of the descriptor (Export hands it over
// again, to the next process).
func (c *sockConn) File() (*os.File, error) {
	var nfd int
	err := c.control("fcntl", func(fd int) error {
		var err error
		nfd, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(nfd), c.f.Name()), nil
}

// LocalAddr and RemoteAddr ask the kernel (nothing asks on the tunnel's
// path: the handover carries the tunnel's source).
func (c *sockConn) LocalAddr() net.Addr  { return c.addr("getsockname", unix.Getsockname) }
func (c *sockConn) RemoteAddr() net.Addr { return c.addr("getpeername", unix.Getpeername) }

func (c *sockConn) addr(name string, get func(int) (unix.Sockaddr, error)) net.Addr {
	var sa unix.Sockaddr
	_ = c.control(name, func(fd int) error {
		var err error
		sa, err = get(fd)
		return err
	})
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(sa.Addr[:]).To16(), Port: sa.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(sa.Addr[:]), Port: sa.Port}
	case *unix.SockaddrUnix:
		return &net.UnixAddr{Name: sa.Name, Net: "unix"}
	}
	return &net.TCPAddr{}
}

// control runs op on the descriptor.
func (c *sockConn) control(name string, op func(fd int) error) error {
	rc, err := c.f.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	if err := rc.Control(func(fd uintptr) { opErr = op(int(fd)) }); err != nil {
		return err
	}
	if opErr != nil {
		return &net.OpError{Op: name, Net: "tcp", Err: os.NewSyscallError(name, opErr)}
	}
	return nil
}
