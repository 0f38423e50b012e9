//go:build linux

package splice

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// rawIO reads or writes a connection's socket with system calls that do not
// tell Go's scheduler they are system calls (syscall.RawSyscall inside
// syscall.RawConn's Read and Write, which still wait on the network poller
// while the socket has nothing to read or no room). The socket is
// non-blocking (the poller made it so), so each call returns at once; what
// this avoids is what an announced system call costs a daemon on one CPU:
// the first one after an idle spell wakes the runtime's system monitor from
// its deep sleep (a futex call and a thread switch), which then polls every
// 20 us for a while, and a call the kernel preempts for more than one such
// poll (a loopback write that wakes the application on the same CPU) has its
// P taken away and handed to another thread (two more thread switches).
//
// One rawIO serves one direction (one goroutine): its callbacks are made once
// and keep their state in the struct, so a read or a write allocates nothing.
type rawIO struct {
	c  Conn
	rc syscall.RawConn

	buf []byte // what the pending call reads into or writes from
	n   int    // bytes moved by the pending call
	err error  // its error

	readFn, writeFn func(fd uintptr) bool
}

// newRawIO returns a rawIO for c, or nil when c is not a *net.TCPConn or
// *net.UnixConn (then the Pipe calls c's own Read and Write: a type that
// wraps one may do more in them than the socket does). The net package's
// sockets are always non-blocking.
func newRawIO(c Conn) *rawIO {
	var sc syscall.Conn
	switch c := c.(type) {
	case *net.TCPConn:
		sc = c
	case *net.UnixConn:
		sc = c
	default:
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	r := &rawIO{c: c, rc: rc}
	r.readFn = r.readOnce
	r.writeFn = r.writeSome
	return r
}

// read reads into b as net.Conn's Read does: at least one byte, or an error
// (io.EOF at the end of the stream).
func (r *rawIO) read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	r.buf, r.n, r.err = b, 0, nil
	err := r.rc.Read(r.readFn)
	r.buf = nil
	if err == nil {
		err = r.err
	}
	if err != nil && !errors.Is(err, io.EOF) {
		err = r.opError("read", err)
	}
	return r.n, err
}

// opError wraps err as the net package's Read and Write do (the
// connection's addresses in the message).
func (r *rawIO) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: r.c.LocalAddr().Network(), Source: r.c.LocalAddr(), Addr: r.c.RemoteAddr(), Err: err}
}

// readOnce is rawConn.Read's callback: false asks it to wait until the
// socket is readable and call again.
func (r *rawIO) readOnce(fd uintptr) bool {
	for {
		n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&r.buf[0])), uintptr(len(r.buf)))
		switch {
		case errno == syscall.EINTR:
			continue
		case errno == syscall.EAGAIN:
			return false
		case errno != 0:
			r.err = os.NewSyscallError("read", errno)
		case n == 0:
			r.err = io.EOF
		default:
			r.n = int(n)
		}
		return true
	}
}

// write writes all of b as net.Conn's Write does.
func (r *rawIO) write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	r.buf, r.n, r.err = b, 0, nil
	err := r.rc.Write(r.writeFn)
	r.buf = nil
	if err == nil {
		err = r.err
	}
	if err != nil {
		err = r.opError("write", err)
	}
	return r.n, err
}

// writeSome is rawConn.Write's callback: it writes until all is written
// (true), an error (true) or the socket has no room (false: wait, call again).
func (r *rawIO) writeSome(fd uintptr) bool {
	for r.n < len(r.buf) {
		rest := r.buf[r.n:]
		n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&rest[0])), uintptr(len(rest)))
		switch {
		case errno == syscall.EINTR:
			continue
		case errno == syscall.EAGAIN:
			return false
		case errno != 0:
			r.err = os.NewSyscallError("write", errno)
			return true
		}
		r.n += int(n)
	}
	return true
}
