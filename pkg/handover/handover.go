package handover

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/quictun/quictun/pkg/resume"
)

// Version is the protocol's version; a message of another is refused.
const Version = 1

// EnvFD names the environment variable that tells the child which of its
// descriptors is its end of the socket pair.
const EnvFD = "QUICTUN_HANDOVER_FD"

// MaxMessage bounds one message (header included); a longer one is
// refused (the kernel reports it truncated).
const MaxMessage = 64 << 10

// MaxListeners bounds the descriptors of the listeners message.
const MaxListeners = 8

// maxString bounds each text field of a record.
const maxString = 4096

const headerLen = 4 // "QH", version, type

// dataPiece is the payload of one data message.
const dataPiece = MaxMessage - headerLen

const (
	msgListeners byte = 1 + iota
	msgReady
	msgTunnel
	msgData
	msgEnd
	msgDone
)

// ErrProtocol is returned (wrapped) for a malformed message, one of
// another version or type, or one over a bound.
var ErrProtocol = errors.New("handover protocol error")

// ErrBounds is returned (wrapped) when the tunnels handed over exceed the
// receiver's Limits.
var ErrBounds = errors.New("handover exceeds the receiver's bounds")

// Limits bound what a receiver takes: tunnels, bytes of one tunnel, bytes
// in all. The new process never holds more than they allow.
type Limits struct {
	MaxTunnels     int
	MaxTunnelBytes int
	MaxTotalBytes  int64
}

// Listener is a listening socket handed over: Name says which
// ("udp", "tcp", "admin").
type Listener struct {
	Name string
	File *os.File
}

// Tunnel is a resumable tunnel handed over: its resume state (State.Conn
// is its application socket) and what the registry shows of it.
type Tunnel struct {
	resume.State
	UUID, Destination, Source string
	CreatedAt                 time.Time
}

// Conn is one end of the socket pair. Not safe for concurrent use.
type Conn struct {
	c *net.UnixConn
}

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

// Close closes the Conn.
func (c *Conn) Close() error { return c.c.Close() }

// SetDeadline bounds the reads and writes that follow.
func (c *Conn) SetDeadline(t time.Time) error { return c.c.SetDeadline(t) }

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

// recv reads one message of type want carrying exactly nfds descriptors
// (at most, if atMost). On any error the descriptors received are closed.
func (c *Conn) recv(want byte, nfds int, atMost bool) ([]byte, []*os.File, error) {
	typ, body, files, err := c.recvMsg(nfds)
	if err != nil {
		return nil, nil, err
	}
	if err := expect(typ, want, len(files), nfds, atMost); err != nil {
		closeFiles(files)
		return nil, nil, err
	}
	return body, files, nil
}

// expect checks a message's type and its count of descriptors.
func expect(typ, want byte, got, nfds int, atMost bool) error {
	switch {
	case typ != want:
		return fmt.Errorf("%w: message type %d, want %d", ErrProtocol, typ, want)
	case got > nfds || (!atMost && got != nfds):
		return fmt.Errorf("%w: %d descriptors, want %d", ErrProtocol, got, nfds)
	}
	return nil
}

// recvMsg reads one message with at most nfds descriptors and checks its
// size and header. On any error the descriptors received are closed.
func (c *Conn) recvMsg(nfds int) (byte, []byte, []*os.File, error) {
	buf := make([]byte, MaxMessage+1)
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
	return buf[3], buf[headerLen:n], files, nil
}

// errPeerClosed: the other process closed its end (it exited).
var errPeerClosed = errors.New("the other process closed the handover socket")

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

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// SendListeners sends the listening sockets (the parent). The files stay
// the caller's.
func (c *Conn) SendListeners(ls []Listener) error {
	if len(ls) > MaxListeners {
		return fmt.Errorf("%w: %d listeners > %d", ErrProtocol, len(ls), MaxListeners)
	}
	var w writer
	w.u8(byte(len(ls)))
	fds := make([]int, 0, len(ls))
	for _, l := range ls {
		w.str(l.Name)
		fd, err := rawFD(l.File)
		if err != nil {
			return err
		}
		fds = append(fds, fd)
	}
	return c.send(msgListeners, w.b, fds...)
}

// RecvListeners receives the listening sockets (the child).
func (c *Conn) RecvListeners() ([]Listener, error) {
	body, files, err := c.recv(msgListeners, MaxListeners, true)
	if err != nil {
		return nil, err
	}
	r := reader{b: body}
	n := int(r.u8())
	names := make([]string, 0, min(n, MaxListeners))
	for range min(n, MaxListeners) {
		names = append(names, r.str())
	}
	if err := r.done(); err != nil || n != len(files) {
		closeFiles(files)
		return nil, fmt.Errorf("%w: listeners message (%d names, %d descriptors): %w", ErrProtocol, n, len(files), err)
	}
	ls := make([]Listener, n)
	for i := range ls {
		ls[i] = Listener{Name: names[i], File: files[i]}
	}
	return ls, nil
}

// SendReady tells the parent the child built its server (pid: the
// child's).
func (c *Conn) SendReady(pid int) error {
	var w writer
	w.u64(uint64(pid))
	return c.send(msgReady, w.b)
}

// WaitReady waits until deadline for the child's ready message and returns
// its pid.
func (c *Conn) WaitReady(deadline time.Time) (int, error) {
	_ = c.c.SetReadDeadline(deadline)
	defer func() { _ = c.c.SetReadDeadline(time.Time{}) }()
	body, _, err := c.recv(msgReady, 0, false)
	if err != nil {
		return 0, err
	}
	r := reader{b: body}
	pid := r.u64()
	if err := r.done(); err != nil {
		return 0, err
	}
	return int(pid), nil
}

// SendDone tells the parent how many tunnels the child imported, or why it
// could not (errText).
func (c *Conn) SendDone(n int, errText string) error {
	var w writer
	w.u64(uint64(n))
	w.str(errText)
	return c.send(msgDone, w.b)
}

// WaitDone waits until deadline for the child's done message.
func (c *Conn) WaitDone(deadline time.Time) (int, error) {
	_ = c.c.SetReadDeadline(deadline)
	defer func() { _ = c.c.SetReadDeadline(time.Time{}) }()
	body, _, err := c.recv(msgDone, 0, false)
	if err != nil {
		return 0, err
	}
	r := reader{b: body}
	n, text := r.u64(), r.str()
	if err := r.done(); err != nil {
		return 0, err
	}
	if text != "" {
		return int(n), fmt.Errorf("new process: %s", text)
	}
	return int(n), nil
}

// writer encodes a message body.
type writer struct{ b []byte }

func (w *writer) u8(v byte)    { w.b = append(w.b, v) }
func (w *writer) u64(v uint64) { w.b = binary.BigEndian.AppendUint64(w.b, v) }
func (w *writer) str(s string) {
	if len(s) > maxString {
		s = s[:maxString]
	}
	w.b = binary.BigEndian.AppendUint16(w.b, uint16(len(s)))
	w.b = append(w.b, s...)
}

// reader decodes a message body; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.err = fmt.Errorf("%w: message ends early", ErrProtocol)
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *reader) str() string {
	b := r.take(2)
	if b == nil {
		return ""
	}
	n := int(binary.BigEndian.Uint16(b))
	if n > maxString {
		r.err = fmt.Errorf("%w: text field of %d bytes > %d", ErrProtocol, n, maxString)
		return ""
	}
	return string(r.take(n))
}

// done reports the first error, or trailing bytes.
func (r *reader) done() error {
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%w: %d trailing bytes", ErrProtocol, len(r.b))
	}
	return r.err
}
