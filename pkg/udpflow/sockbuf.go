package udpflow

import (
	"errors"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SocketBuffer is the receive and send buffer asked for a UDP socket that
// carries many flows (a client's forward or SOCKS5 relay socket), and the
// most a flow's own socket (a server's socket to a destination) grows to:
// about 350 ms of 1200-byte packets at 50 Mbit/s. With the kernel's default
// (about 208 KiB, some 90 such packets) a burst arriving while the daemon is
// not scheduled overflows the socket: iperf3 -u at 50 Mbit/s on a busy host
// lost thousands of packets there, where the direct path queues 5,000
// packets in its network device. The kernel caps it at net.core.rmem_max and
// wmem_max, which the deployment raises for QUIC (7.5 MB; quictun-server
// check-host warns when lower).
const SocketBuffer = 4 << 20

// BufferedConn is the part of *net.UDPConn SetSocketBuffers and Sizer use.
type BufferedConn interface {
	SetReadBuffer(bytes int) error
	SetWriteBuffer(bytes int) error
}

// SetSocketBuffers asks for SocketBuffer bytes of receive and send buffer
// on c. A smaller cap (net.core.rmem_max) is not an error: the kernel
// silently grants what it may.
func SetSocketBuffers(c BufferedConn) error {
	return errors.Join(c.SetReadBuffer(SocketBuffer), c.SetWriteBuffer(SocketBuffer))
}

// A flow's own socket starts with a receive buffer of InitialFlowBuffer
// bytes and grows with the flow's rate, to hold bufferTime of its packets
// (measured over sizeWindow), in powers of two up to SocketBuffer. Every
// byte of it is drawn from the daemon's Budget of socket memory first, as
// the kernel books it: twice the size asked (socket(7), SO_RCVBUF). A fixed
// 4 MiB for every flow let one client with the secret pin 8 MiB of the
// host's UDP memory (net.ipv4.udp_mem) per flow it stalled: about 560 flows
// reached this host's hard limit, past which the kernel drops UDP on every
// socket, the server's own QUIC listener included.
const (
	InitialFlowBuffer = 64 << 10
	sizeWindow        = 100 * time.Millisecond
	bufferTime        = 350 * time.Millisecond
)

// ErrNoSocketMemory is NewSizer's error when the daemon's Budget of socket memory cannot hold a new
// flow's initial buffer.
var ErrNoSocketMemory = errors.New("the UDP socket memory budget is used up")

// Sizer sizes one flow socket's receive buffer by the flow's rate, within a
// Budget. Observe is safe for concurrent use.
type Sizer struct {
	conn   BufferedConn
	budget *Budget
	now    func() time.Time

	mu          sync.Mutex
	size        int   // the receive buffer asked for
	held        int64 // drawn from budget
	windowStart time.Time
	windowBytes int64
}

// NewSizer asks for InitialFlowBuffer bytes of receive buffer on c, drawn
// from budget, and returns the Sizer that grows it. It fails with
// ErrNoSocketMemory when budget cannot hold it (c is left as it was), or
// with the socket's error. now may be nil (time.Now).
func NewSizer(c BufferedConn, budget *Budget, now func() time.Time) (*Sizer, error) {
	if now == nil {
		now = time.Now
	}
	s := &Sizer{conn: c, budget: budget, now: now}
	if !budget.Take(2 * InitialFlowBuffer) {
		return nil, ErrNoSocketMemory
	}
	s.held = 2 * InitialFlowBuffer
	if err := c.SetReadBuffer(InitialFlowBuffer); err != nil {
		s.Close()
		return nil, err
	}
	s.size = InitialFlowBuffer
	s.windowStart = now()
	return s, nil
}

// Observe counts an n-byte packet received on the socket. At the end of
// each window it grows the buffer to hold bufferTime at the window's rate,
// as far as the budget allows; it never shrinks it.
func (s *Sizer) Observe(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.windowBytes += int64(n)
	now := s.now()
	elapsed := now.Sub(s.windowStart)
	if elapsed < sizeWindow {
		return
	}
	want := s.windowBytes * int64(bufferTime) / int64(elapsed)
	s.windowStart, s.windowBytes = now, 0
	if want <= int64(s.size) || s.size >= SocketBuffer {
		return
	}
	size := min(1<<bits.Len64(uint64(want-1)), SocketBuffer)
	for ; size > s.size; size /= 2 {
		more := 2*int64(size) - s.held
		if !s.budget.Take(more) {
			continue // a smaller step may fit
		}
		if s.conn.SetReadBuffer(size) != nil {
			s.budget.Return(more)
			return
		}
		s.size, s.held = size, s.held+more
		return
	}
}

// Size is the receive buffer asked for now.
func (s *Sizer) Size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}

// Close returns what the Sizer drew from its budget; call it once the
// socket is closed.
func (s *Sizer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.budget.Return(s.held)
	s.held = 0
}

// MaxSocketMemory is the default Budget of a server's flow sockets: a
// quarter of the kernel's hard limit of UDP memory (the third value of
// net.ipv4.udp_mem, in pages), at most 256 MiB; 64 MiB when that cannot
// be read. Past its limit the kernel drops UDP on every socket of the host,
// the server's QUIC listener included, so the flows must never come near it.
func MaxSocketMemory() int64 {
	const most, fallback = 256 << 20, 64 << 20
	b, err := os.ReadFile("/proc/sys/net/ipv4/udp_mem")
	if err != nil {
		return fallback
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return fallback
	}
	pages, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || pages <= 0 {
		return fallback
	}
	return min(pages*int64(os.Getpagesize())/4, most)
}
