// Package udpflow carries UDP packets of one flow (one application socket
// and one destination) between the tunnel's two ends.
//
// A flow is a QUIC stream plus QUIC datagrams (RFC 9221). The stream is
// opened with a udp-kind header and stays open for the flow's life; closing
// it ends the flow. Packets travel
//
//   - on the stream, framed as u16 length | packet, until the sender has
//     seen the peer's OK reply (before that the peer has no flow to hand a
//     datagram to, so the first packets are not lost and cost no extra round
//     trip), and whenever a packet does not fit in one datagram: such packets
//     are delivered reliably rather than dropped;
//   - otherwise as datagrams: 'U' | varint flow ID | packet, where the flow ID
//     is the QUIC stream ID, which both ends know without negotiating.
//
// Datagrams are unreliable by design, like the UDP they carry; the stream
// path is not. A packet is never split: at most MaxPacket bytes.
package udpflow

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/quicvarint"
)

// TypeUDP is the first byte of a datagram that carries a flow's packet
// (pkg/liveness uses 'H', 'E' and 'T').
const TypeUDP byte = 'U'

// MaxPacket is the largest UDP payload carried (the u16 framing's limit; an
// IPv4 UDP payload is at most 65,507 bytes).
const MaxPacket = 1<<16 - 1

var (
	// ErrMalformed is wrapped by errors about a malformed datagram or frame.
	ErrMalformed = errors.New("malformed UDP flow data")
	// ErrTooLarge: a packet larger than MaxPacket.
	ErrTooLarge = errors.New("UDP packet larger than 65535 bytes")
)

// AppendDatagram appends the datagram carrying packet p of flow to dst.
func AppendDatagram(dst []byte, flow uint64, p []byte) []byte {
	dst = quicvarint.Append(append(dst, TypeUDP), flow)
	return append(dst, p...)
}

// DatagramOverhead is how many bytes AppendDatagram adds to a packet of flow.
func DatagramOverhead(flow uint64) int { return 1 + quicvarint.Len(flow) }

// ParseDatagram splits a datagram made by AppendDatagram. The packet aliases b.
func ParseDatagram(b []byte) (flow uint64, p []byte, err error) {
	if len(b) < 2 || b[0] != TypeUDP {
		return 0, nil, fmt.Errorf("%w: not a UDP flow datagram", ErrMalformed)
	}
	flow, n, err := quicvarint.Parse(b[1:])
	if err != nil {
		return 0, nil, fmt.Errorf("%w: flow ID: %w", ErrMalformed, err)
	}
	return flow, b[1+n:], nil
}

// WriteFrame writes packet p on a flow's stream as u16 length | p, in one
// Write so that concurrent writers (each holding the stream's lock) never
// interleave.
func WriteFrame(w io.Writer, p []byte) error {
	if len(p) > MaxPacket {
		return ErrTooLarge
	}
	buf := make([]byte, 2+len(p))
	binary.BigEndian.PutUint16(buf, uint16(len(p)))
	copy(buf[2:], p)
	_, err := w.Write(buf)
	return err
}

// ReadFrame reads one framed packet into buf (at least MaxPacket bytes) and
// returns it. io.EOF means the stream ended cleanly between packets; an end
// inside a packet is io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader, buf []byte) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(l[:]))
	if n > len(buf) {
		return nil, fmt.Errorf("%w: %d-byte packet, buffer %d", ErrMalformed, n, len(buf))
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf[:n], nil
}

// DatagramConn is the part of *quic.Conn a Sender uses.
type DatagramConn interface {
	SendDatagram(b []byte) error
}

// Paths a packet takes (label values of quictun_<daemon>_udp_packets_total).
const (
	PathDatagram = "datagram"
	PathStream   = "stream"
)

// Counters counts one direction of a flow; safe for concurrent use.
type Counters struct {
	Datagrams     atomic.Uint64
	StreamPackets atomic.Uint64
	Bytes         atomic.Int64
	// OnPacket, if set, is called for each packet counted, with its path
	// (PathDatagram or PathStream) and size: the daemons' metrics.
	OnPacket func(path string, n int)
}

func (c *Counters) count(path string, n int) {
	if path == PathDatagram {
		c.Datagrams.Add(1)
	} else {
		c.StreamPackets.Add(1)
	}
	c.Bytes.Add(int64(n))
	if c.OnPacket != nil {
		c.OnPacket(path, n)
	}
}

// After SendDatagram fails, a Sender carries the flow's packets on its
// stream and tries a datagram again after a pause that starts at
// datagramRetryMin and doubles, up to datagramRetryMax, while the failures
// go on; a success ends it. quic-go fails for good when the peer does not
// take datagrams (one failing call per pause is all that costs) and when the
// connection is closing (the stream fails then too). A packet refused as too
// large pauses only the packets at least that large: quic-go's limit follows
// the path's MTU, which drops to its initial 1200 bytes after a path change
// (the client's path rescue, a NAT rebinding) and grows back as the path is
// probed; a limit learnt once and kept for good (as before) left a flow of
// 1200-byte packets on its stream for the rest of its life.
const (
	datagramRetryMin = 250 * time.Millisecond
	datagramRetryMax = time.Minute
)

// Sender sends one flow's packets to the peer: on the stream until
// Established, and for packets too large for a datagram; as datagrams
// otherwise. Safe for concurrent use.
type Sender struct {
	flow   uint64
	conn   DatagramConn
	stream io.Writer
	count  *Counters
	now    func() time.Time

	established atomic.Bool
	// maxDatagram is the largest packet known to fit a datagram (0: no
	// limit known; learnt from quic-go's DatagramTooLargeError), until
	// sizeRetryAt (unix nanoseconds), when a larger one is tried again.
	maxDatagram, sizeRetryAt atomic.Int64
	// retryAt: after a failed datagram, packets go on the stream until this
	// time (unix nanoseconds); 0 while datagrams work.
	retryAt atomic.Int64

	mu        sync.Mutex    // serialises stream writes and datagram sends
	buf       []byte        // datagram scratch, under mu
	pause     time.Duration // the current pause after failures, under mu
	sizePause time.Duration // the current pause after too-large refusals, under mu
}

// NewSender returns a Sender for flow (its QUIC stream ID) writing to stream
// and conn. count may be nil.
func NewSender(flow uint64, conn DatagramConn, stream io.Writer, count *Counters) *Sender {
	if count == nil {
		count = &Counters{}
	}
	return &Sender{flow: flow, conn: conn, stream: stream, count: count, now: time.Now}
}

// datagramsPaused reports whether a recent failure keeps packets on the stream.
func (s *Sender) datagramsPaused() bool {
	r := s.retryAt.Load()
	return r != 0 && s.now().UnixNano() < r
}

// mayFit reports whether an n-byte packet may go as a datagram: no size
// limit is known, it is within the limit, or the limit is due to be tried.
func (s *Sender) mayFit(n int) bool {
	m := s.maxDatagram.Load()
	return m == 0 || int64(n) <= m || s.now().UnixNano() >= s.sizeRetryAt.Load()
}

// pauseFor doubles *pause within the bounds and returns when it ends; under mu.
func (s *Sender) pauseFor(pause *time.Duration) int64 {
	*pause = min(max(2**pause, datagramRetryMin), datagramRetryMax)
	return s.now().Add(*pause).UnixNano()
}

// Establish lets later packets go as datagrams: the peer has the flow.
func (s *Sender) Establish() { s.established.Store(true) }

// Send sends packet p. Errors are the stream's (the flow is over) or
// ErrTooLarge; a datagram that quic-go refuses as too large goes on the
// stream instead.
func (s *Sender) Send(p []byte) error {
	if len(p) > MaxPacket {
		return ErrTooLarge
	}
	if s.established.Load() && s.conn != nil && !s.datagramsPaused() {
		if s.mayFit(len(p)) {
			s.mu.Lock()
			s.buf = AppendDatagram(s.buf[:0], s.flow, p)
			err := s.conn.SendDatagram(s.buf)
			var tooLarge *quic.DatagramTooLargeError
			switch {
			case err == nil:
				if s.pause != 0 {
					s.pause = 0
					s.retryAt.Store(0)
				}
				if m := s.maxDatagram.Load(); m != 0 && int64(len(p)) > m {
					s.maxDatagram.Store(0) // the path takes more again
					s.sizePause = 0
				}
			case errors.As(err, &tooLarge):
				m := max(tooLarge.MaxDatagramPayloadSize-int64(DatagramOverhead(s.flow)), 1)
				s.maxDatagram.Store(min(m, int64(len(p)-1)))
				s.sizeRetryAt.Store(s.pauseFor(&s.sizePause))
			default:
				// Datagrams not negotiated, or the connection is closing
				// (the stream says which when it is written to): the
				// stream for a while, then a datagram again.
				s.retryAt.Store(s.pauseFor(&s.pause))
			}
			s.mu.Unlock()
			if err == nil {
				s.count.count(PathDatagram, len(p))
				return nil
			}
		}
	}
	s.mu.Lock()
	err := WriteFrame(s.stream, p)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.count.count(PathStream, len(p))
	return nil
}

// Idle tracks a flow's last activity for its idle timeout without a timer
// per packet: Touch is an atomic store; Wait checks once per timeout.
type Idle struct {
	last atomic.Int64 // unix nanos
	now  func() time.Time
}

// NewIdle returns an Idle touched now; now may be nil (time.Now).
func NewIdle(now func() time.Time) *Idle {
	if now == nil {
		now = time.Now
	}
	i := &Idle{now: now}
	i.Touch()
	return i
}

// Touch records activity.
func (i *Idle) Touch() { i.last.Store(i.now().UnixNano()) }

// Remaining is how long until the flow has been idle for timeout (<= 0: it has).
func (i *Idle) Remaining(timeout time.Duration) time.Duration {
	return time.Duration(i.last.Load()) + timeout - time.Duration(i.now().UnixNano())
}

// Wait returns when the flow has been idle for timeout (true) or done is
// closed (false).
func (i *Idle) Wait(done <-chan struct{}, timeout time.Duration) bool {
	t := time.NewTimer(max(i.Remaining(timeout), 0))
	defer t.Stop()
	for {
		select {
		case <-done:
			return false
		case <-t.C:
			r := i.Remaining(timeout)
			if r <= 0 {
				return true
			}
			t.Reset(r)
		}
	}
}
