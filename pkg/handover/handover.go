package handover

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
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

// MaxListeners bounds the descriptors of the listeners message (the
// server's three sockets; each of a client's local entry points).
const MaxListeners = 64

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
	msgReleased
	msgSaved
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

// Listener is a listening socket handed over: Name says which (the
// server's "udp", "tcp", "admin"; a client's local entry points).
type Listener struct {
	Name string
	File *os.File
}

// Tunnel is a resumable tunnel handed over: its resume state (State.Conn
// is its application socket) and what the registry shows of it (Endpoint:
// the client's local entry point it came in on).
type Tunnel struct {
	resume.State
	UUID, Destination, Source, Endpoint string
	// Server is the server a client's tunnel re-attaches to (tunnel.Tunnel.Server).
	Server    string
	CreatedAt time.Time
}

// SendFunc gives the tunnels of an upgrade to the new process
// (Conn.SendTunnels and the wait for its answer); the files in them are
// closed after it returns.
type SendFunc func(tunnels []Tunnel) error

// Steps are what an upgrading server's old process tells the new one, in
// this order: Released once it no longer reads its sockets (the new one
// serves them from then on, while it takes the tunnels), Send the tunnels
// (the files in them are closed after it returns), Saved once the
// accounting's last totals are saved; Saved then waits for the new
// process's answer.
type Steps struct {
	Released func() error
	Send     SendFunc
	Saved    func() error
}

// ErrNotServing is returned by a daemon's HandOver when its Run ended
// before it took the request (it is draining, or gone).
var ErrNotServing = errors.New("not serving")

// Conn is one end of the socket pair. Not safe for concurrent use.
type Conn struct {
	c   *net.UnixConn
	buf []byte // receive buffer
	// pending is a message read ahead (RecvReleased), returned by the next
	// read.
	pending *message
}

type message struct {
	typ   byte
	body  []byte
	files []*os.File
}

// next reads the next message with at most nfds descriptors: the one read
// ahead, or a new one.
func (c *Conn) next(nfds int) (byte, []byte, []*os.File, error) {
	if m := c.pending; m != nil {
		c.pending = nil
		if len(m.files) > nfds {
			closeFiles(m.files)
			return 0, nil, nil, fmt.Errorf("%w: %d descriptors, want at most %d", ErrProtocol, len(m.files), nfds)
		}
		return m.typ, m.body, m.files, nil
	}
	return c.recvMsg(nfds)
}

// Close closes the Conn (and what was read ahead).
func (c *Conn) Close() error {
	if c.pending != nil {
		closeFiles(c.pending.files)
		c.pending = nil
	}
	return c.c.Close()
}

// SetDeadline bounds the reads and writes that follow.
func (c *Conn) SetDeadline(t time.Time) error { return c.c.SetDeadline(t) }

// recv reads one message of type want carrying exactly nfds descriptors
// (at most, if atMost). On any error the descriptors received are closed.
func (c *Conn) recv(want byte, nfds int, atMost bool) ([]byte, []*os.File, error) {
	typ, body, files, err := c.next(nfds)
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

// errPeerClosed: the other process closed its end (it exited).
var errPeerClosed = errors.New("the other process closed the handover socket")

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

// SendReleased tells the child that the parent no longer reads the
// sockets it handed over (an upgrading server): the child may serve them
// now, before the tunnels come. The saved message follows the end of the
// tunnels then.
func (c *Conn) SendReleased() error { return c.send(msgReleased, nil) }

// RecvReleased reads the message after the ready one: released (true), or
// the first of the tunnels of a parent that does not send it (false; the
// message is kept for RecvTunnels).
func (c *Conn) RecvReleased() (bool, error) {
	typ, body, files, err := c.next(1)
	if err != nil {
		return false, err
	}
	if typ == msgReleased {
		if len(files) > 0 || len(body) > 0 {
			closeFiles(files)
			return false, fmt.Errorf("%w: released message with a body or descriptors", ErrProtocol)
		}
		return true, nil
	}
	c.pending = &message{typ: typ, body: body, files: files}
	return false, nil
}

// SendSaved tells the child that the parent saved its last accounting
// totals (after the tunnels' end, when it sent released).
func (c *Conn) SendSaved() error { return c.send(msgSaved, nil) }

// RecvSaved waits for the saved message.
func (c *Conn) RecvSaved() error {
	body, _, err := c.recv(msgSaved, 0, false)
	if err == nil && len(body) > 0 {
		err = fmt.Errorf("%w: saved message with a body", ErrProtocol)
	}
	return err
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
