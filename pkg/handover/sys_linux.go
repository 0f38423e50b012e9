package handover

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"syscall"
)

// Pair returns the parent's end and the child's end (to pass in
// exec.Cmd.ExtraFiles; close it in the parent once the child started).
func Pair() (*Conn, *os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("handover socketpair: %w", err)
	}
	parent := os.NewFile(uintptr(fds[0]), "handover-parent")
	c, err := newConn(parent)
	if err != nil {
		_ = syscall.Close(fds[1])
		return nil, nil, err
	}
	return c, os.NewFile(uintptr(fds[1]), "handover-child"), nil
}

// newConn takes f (closed here) as a Conn.
func newConn(f *os.File) (*Conn, error) {
	nc, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("handover socket: %w", err)
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		_ = nc.Close()
		return nil, fmt.Errorf("%w: handover descriptor is a %T, not a UNIX socket", ErrProtocol, nc)
	}
	return &Conn{c: uc}, nil
}

// FromEnv returns the child's end named by EnvFD (nil, nil: not started
// for a handover) and clears the variable, so that the child's own
// children do not see it.
func FromEnv() (*Conn, error) {
	v, ok := os.LookupEnv(EnvFD)
	if !ok {
		return nil, nil
	}
	_ = os.Unsetenv(EnvFD)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%w: %s=%q is not a descriptor", ErrProtocol, EnvFD, v)
	}
	syscall.CloseOnExec(fd)
	return newConn(os.NewFile(uintptr(fd), "handover"))
}

// send writes one message with fds.
func (c *Conn) send(typ byte, body []byte, fds ...int) error {
	b := make([]byte, 0, headerLen+len(body))
	b = append(b, 'Q', 'H', Version, typ)
	b = append(b, body...)
	if len(b) > MaxMessage {
		return fmt.Errorf("%w: message of %d bytes > %d", ErrProtocol, len(b), MaxMessage)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	if _, _, err := c.c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("handover send: %w", err)
	}
	return nil
}

// recvMsg reads one message with at most nfds descriptors and checks its
// size and header. On any error the descriptors received are closed.
func (c *Conn) recvMsg(nfds int) (byte, []byte, []*os.File, error) {
	if c.buf == nil {
		c.buf = make([]byte, MaxMessage+1) // one per Conn: a handover of 1,000 tunnels reads 1,000 messages
	}
	buf := c.buf
	oob := make([]byte, syscall.CmsgSpace(max(nfds, 1)*4))
	n, oobn, flags, _, err := c.c.ReadMsgUnix(buf, oob)
	files, ferr := parseRights(oob[:oobn])
	var bad error
	switch {
	case errors.Is(err, io.EOF):
		bad = fmt.Errorf("handover receive: %w", errPeerClosed)
	case err != nil:
		bad = fmt.Errorf("handover receive: %w", err)
	case ferr != nil:
		bad = ferr
	case flags&syscall.MSG_CTRUNC != 0:
		bad = fmt.Errorf("%w: more than %d descriptors", ErrProtocol, nfds)
	case flags&syscall.MSG_TRUNC != 0 || n > MaxMessage:
		bad = fmt.Errorf("%w: message over %d bytes", ErrProtocol, MaxMessage)
	case n == 0:
		bad = fmt.Errorf("handover receive: %w", errPeerClosed)
	case n < headerLen || buf[0] != 'Q' || buf[1] != 'H':
		bad = fmt.Errorf("%w: not a handover message", ErrProtocol)
	case buf[2] != Version:
		bad = fmt.Errorf("%w: version %d, want %d", ErrProtocol, buf[2], Version)
	}
	if bad != nil {
		closeFiles(files)
		return 0, nil, nil, bad
	}
	return buf[3], slices.Clone(buf[headerLen:n]), files, nil
}

// parseRights returns the descriptors of the SCM_RIGHTS messages in oob.
func parseRights(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: control message: %w", ErrProtocol, err)
	}
	var files []*os.File
	var bad error
	for i := range msgs {
		fds, err := syscall.ParseUnixRights(&msgs[i])
		if err != nil {
			bad = fmt.Errorf("%w: control message: %w", ErrProtocol, err)
			continue
		}
		for _, fd := range fds {
			syscall.CloseOnExec(fd)
			files = append(files, os.NewFile(uintptr(fd), "handover-fd"))
		}
	}
	return files, bad
}

// rawFD is f's descriptor, for SCM_RIGHTS. Unlike f.Fd() it leaves the
// descriptor non-blocking: the socket's file description is shared with
// the sender's own listener or connection, which must stay in Go's poller.
// f must stay open until the descriptor was sent.
func rawFD(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("handover: descriptor of %s: %w", f.Name(), err)
	}
	fd := -1
	if err := rc.Control(func(u uintptr) { fd = int(u) }); err != nil {
		return 0, fmt.Errorf("handover: descriptor of %s: %w", f.Name(), err)
	}
	return fd, nil
}
