// Package liveness keeps a QUIC connection's loss recovery fast with small
// QUIC datagrams (RFC 9221), which are ack-eliciting but never retransmitted:
//
//   - Heartbeats: the client sends one every interval and the server echoes
//     it. Each re-arms the sender's probe timer, so after a blackout the
//     connection notices the link is back within about one heartbeat instead
//     of waiting out an exponentially backed-off probe timeout (up to 60 s in
//     quic-go); the echoes also tell the client that the path is dark.
//   - Tail probes: shortly after the application wrote to a stream, a tiny
//     datagram follows. If the data packet was lost, the probe's
//     acknowledgement reveals the gap and loss detection repairs it after
//     about 9/8 RTT instead of a probe timeout (srtt + 4·rttvar + 26 ms).
//
// The payload's first byte is its type (pkg/dgram routes by it); anything
// nobody handles is counted as invalid and dropped.
package liveness

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quictun/quictun/pkg/dgram"
)

// Datagram types.
const (
	TypeHeartbeat byte = 'H'
	TypeEcho      byte = 'E'
	TypeTail      byte = 'T'
)

// Conn is the part of *quic.Conn this package uses.
type Conn interface {
	SendDatagram(b []byte) error
	ReceiveDatagram(ctx context.Context) ([]byte, error)
}

// Stats counts datagrams; safe for concurrent use.
type Stats struct {
	HeartbeatsSent atomic.Uint64
	EchoesReceived atomic.Uint64
	EchoesSent     atomic.Uint64
	TailProbesSent atomic.Uint64
	KeepAlivesSent atomic.Uint64
	Invalid        atomic.Uint64
}

// Receiver handles incoming datagrams for one connection.
type Receiver struct {
	c     Conn
	echo  bool
	stats *Stats
	// maxEchoes bounds echoes per second, so a peer cannot turn the server into a reflector.
	maxEchoes int
	lastEcho  atomic.Int64 // unix nanos of the last echo received
	// windowStart and echoes count this second's echoes; only the Mux's
	// goroutine touches them.
	windowStart time.Time
	echoes      int
}

// NewReceiver returns a Receiver. A server (echo=true) answers heartbeats with
// at most maxEchoesPerSecond echoes a second; a client records echoes.
func NewReceiver(c Conn, echo bool, maxEchoesPerSecond int, stats *Stats) *Receiver {
	r := &Receiver{c: c, echo: echo, stats: stats, maxEchoes: maxEchoesPerSecond, windowStart: time.Now()}
	r.lastEcho.Store(time.Now().UnixNano())
	return r
}

// LastEcho is when the last heartbeat echo arrived (or the Receiver was made).
func (r *Receiver) LastEcho() time.Time { return time.Unix(0, r.lastEcho.Load()) }

// Register routes the liveness datagram types on m to r; other types are
// for other handlers (m's unknown handler counts what nobody takes).
func (r *Receiver) Register(m *dgram.Mux) {
	m.Handle(TypeHeartbeat, r.heartbeat)
	m.Handle(TypeEcho, r.echoed)
	m.Handle(TypeTail, func([]byte) {}) // its acknowledgement was the point
}

// Invalid counts a datagram nobody handles (a Mux's unknown handler).
func (r *Receiver) Invalid([]byte) { r.stats.Invalid.Add(1) }

// Run receives until ctx is done or the connection closes, and returns then:
// a Mux with only the liveness types (others count as invalid).
func (r *Receiver) Run(ctx context.Context) {
	m := dgram.NewMux(r.Invalid)
	r.Register(m)
	m.Run(ctx, r.c)
}

// heartbeat answers a heartbeat (server side), within maxEchoes a second.
func (r *Receiver) heartbeat(b []byte) {
	if !r.echo || len(b) > 64 {
		r.stats.Invalid.Add(1)
		return
	}
	now := time.Now()
	if now.Sub(r.windowStart) >= time.Second {
		r.windowStart, r.echoes = now, 0
	}
	if r.echoes >= r.maxEchoes {
		return
	}
	r.echoes++
	out := append([]byte{TypeEcho}, b[1:]...)
	if r.c.SendDatagram(out) == nil {
		r.stats.EchoesSent.Add(1)
	}
}

// echoed records a heartbeat echo (client side).
func (r *Receiver) echoed([]byte) {
	if r.echo {
		r.stats.Invalid.Add(1)
		return
	}
	r.stats.EchoesReceived.Add(1)
	r.lastEcho.Store(time.Now().UnixNano())
}

// heartbeatLen pads heartbeats so their QUIC packet exceeds 42 bytes: quic-go
// answers only packets longer than that with a stateless reset, and an idle
// client must learn quickly that a restarted server no longer knows it.
const heartbeatLen = 40

// SendHeartbeat sends heartbeat number seq.
func SendHeartbeat(c Conn, seq uint64, stats *Stats) error {
	b := make([]byte, 1, heartbeatLen)
	b[0] = TypeHeartbeat
	b = binary.BigEndian.AppendUint64(b, seq)
	b = b[:heartbeatLen]
	if err := c.SendDatagram(b); err != nil {
		return err
	}
	stats.HeartbeatsSent.Add(1)
	return nil
}

// SendKeepAlive sends an idle connection's keep-alive: a tail-probe datagram
// (which the peer takes without answering, old servers too) padded as a
// heartbeat is, so that a restarted server answers it with a stateless reset
// (quic-go's own keep-alive PING is too short to draw one: an idle client
// would wait out its idle timeout, 90 s). Its acknowledgement keeps the NAT
// mapping open and quic-go's own keep-alive from firing: one packet each way.
func SendKeepAlive(c Conn, stats *Stats) error {
	b := make([]byte, heartbeatLen)
	b[0] = TypeTail
	if err := c.SendDatagram(b); err != nil {
		return err
	}
	stats.KeepAlivesSent.Add(1)
	return nil
}

// ShortPathWait bounds the adaptive wait before the first tail probe. On a
// path where two smoothed RTTs plus 2 ms (for the peer's turnaround, which
// srtt does not include) fit in it, the first probe waits that long instead
// of the fixed delay: in request/response traffic the
// answer nearly always comes first and the probe (and the acknowledgement it
// elicits) is skipped, while a lost burst is still found after about three
// RTTs, far sooner than a probe timeout (srtt + 4·rttvar + 26 ms). On longer
// paths a wait of two RTTs would lose against the probe timeout, and the
// fixed delay applies.
const ShortPathWait = 10 * time.Millisecond

// turnaround is the allowance for the peer's answer beyond two RTTs.
const turnaround = 2 * time.Millisecond

// LongPathWait caps the first probe's wait of srtt/8 on long paths. A probe
// is ack-eliciting, so quic-go's probe timeout counts from it: when both a
// burst and its probe are lost, a later probe delays that timeout by as
// much. 5 ms keeps the probe clear of the peer's turnaround for a request
// and bounds that shift (a probe timeout is srtt + 4·rttvar + 25 ms or more).
const LongPathWait = 5 * time.Millisecond

// TailProber sends up to Count tail probes after each burst of writes. Kick is
// cheap and never blocks or wakes another goroutine: it arms a timer once per
// burst. Safe for concurrent use.
type TailProber struct {
	c     Conn
	count int
	delay time.Duration
	stats *Stats
	rtt   func() time.Duration

	mu         sync.Mutex
	timer      *time.Timer
	left       int   // probes left in this round
	roundStart int64 // unix nanos of the Kick that started the round
	sentAt     int64 // unix nanos of the last probe
	closed     bool  // Run returned

	armed    atomic.Bool  // a round is pending
	kickedAt atomic.Int64 // unix nanos of the last Kick
	heardAt  atomic.Int64 // unix nanos of the last Heard
}

// NewTailProber returns a prober sending count probes, the first delay after
// a Kick and the next ones delay apart. count 0 makes Kick a no-op.
func NewTailProber(c Conn, count int, delay time.Duration, stats *Stats) *TailProber {
	p := &TailProber{c: c, count: count, delay: delay, stats: stats}
	p.timer = time.AfterFunc(time.Hour, p.fire)
	p.timer.Stop()
	return p
}

// WithRTT lets the first probe adapt to the path's smoothed RTT (see
// ShortPathWait); rtt returns 0 while unknown. It returns p.
func (p *TailProber) WithRTT(rtt func() time.Duration) *TailProber {
	p.rtt = rtt
	return p
}

// firstDelay is the wait between a burst's first write and its first probe.
//
// On longer paths it is at least srtt/8 (at most LongPathWait), which costs
// no repair time when the probe gets through: quic-go declares a packet lost
// only 9/8 of max(srtt, latest RTT) after it was sent (RFC 9002's time
// threshold; the probe is the only later packet, below the packet
// threshold), so the acknowledgement of a probe sent up to srtt/8 after a
// lost packet arrives no later than that verdict. A probe sent 1 ms
// after a request instead reaches the peer while it is still answering the
// request, and its processing and the acknowledgement it draws delay the
// answer (0.2-0.3 ms of a first round trip on a 25 ms path).
func (p *TailProber) firstDelay() time.Duration {
	d := p.delay
	if p.rtt != nil {
		switch srtt := p.rtt(); {
		case srtt <= 0:
		case 2*srtt+turnaround <= ShortPathWait:
			d = max(d, 2*srtt+turnaround)
		default:
			d = max(d, min(srtt/8, LongPathWait))
		}
	}
	return d
}

// Kick tells the prober data was just written.
func (p *TailProber) Kick() {
	if p == nil || p.count == 0 {
		return
	}
	p.kickedAt.Store(time.Now().UnixNano())
	p.arm()
}

// arm starts a round of probes unless one is pending.
func (p *TailProber) arm() {
	if p.armed.Load() || !p.armed.CompareAndSwap(false, true) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.left = p.count
	p.roundStart = p.kickedAt.Load()
	p.timer.Reset(p.firstDelay())
}

// fire runs on the timer's goroutine: it sends the next probe of the round,
// unless the peer answered after the last write. The send happens outside
// the lock: quic-go's SendDatagram blocks while its datagram queue is full
// (a congestion-limited connection), and Run must still be able to stop.
func (p *TailProber) fire() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	kicked, heard := p.kickedAt.Load(), p.heardAt.Load()
	answered := heard > kicked
	if !answered && heard > p.roundStart && p.left == p.count {
		// The answer to the round's first writes came; the writes since
		// then are a new burst (the next request): give it its own wait.
		p.roundStart = kicked
		p.timer.Reset(time.Until(time.Unix(0, kicked).Add(p.firstDelay())))
		p.mu.Unlock()
		return
	}
	if !answered {
		p.sentAt = time.Now().UnixNano()
		p.left--
	}
	more := !answered && p.left > 0
	p.mu.Unlock()

	if !answered && p.c.SendDatagram([]byte{TypeTail}) == nil {
		p.stats.TailProbesSent.Add(1)
	}

	p.mu.Lock()
	if more && !p.closed {
		p.timer.Reset(p.delay)
		p.mu.Unlock()
		return
	}
	covered := max(p.sentAt, p.heardAt.Load())
	p.mu.Unlock()
	p.armed.Store(false)
	// A Kick that saw the round still pending was folded into it. If it
	// came after the last probe (or the answer), nothing covers its data:
	// start a new round.
	if p.kickedAt.Load() > covered {
		p.arm()
	}
}

// Heard tells the prober the peer's data just arrived. A probe still pending
// for a burst written before is skipped: on a short path the answer beat the
// probe, so the burst was not lost, and the probe would only add packets.
func (p *TailProber) Heard() {
	if p == nil || p.count == 0 {
		return
	}
	p.heardAt.Store(time.Now().UnixNano())
}

// Run keeps the prober working until ctx is done, then stops it: no probe
// starts after Run returns (one already handed to SendDatagram may still
// complete; it ends with the connection at the latest).
func (p *TailProber) Run(ctx context.Context) {
	if p.count == 0 {
		return
	}
	<-ctx.Done()
	p.Stop()
}

// StopWhenDone stops the prober once ctx is done, as Run does, without a
// goroutine waiting for it (a server holds thousands of idle connections).
func (p *TailProber) StopWhenDone(ctx context.Context) {
	if p.count == 0 {
		return
	}
	context.AfterFunc(ctx, p.Stop)
}

// Stop stops the prober: no probe starts after it returns (one already
// handed to SendDatagram may still complete).
func (p *TailProber) Stop() {
	if p.count == 0 {
		return
	}
	p.mu.Lock()
	p.closed = true
	p.timer.Stop()
	p.mu.Unlock()
}

// Waker tells a connection's liveness checks, which are silent while the
// connection is idle, that work is starting. The data path calls Wake on
// every chunk it moves; until the checks Arm it (as they go idle) that costs
// one atomic load. Safe for concurrent use; a nil *Waker does nothing.
type Waker struct {
	c     chan struct{}
	armed atomic.Bool
}

// NewWaker returns a Waker, not armed.
func NewWaker() *Waker { return &Waker{c: make(chan struct{}, 1)} }

// Arm makes the next Wake signal C.
func (w *Waker) Arm() { w.armed.Store(true) }

// Disarm takes back an Arm that no Wake used.
func (w *Waker) Disarm() { w.armed.Store(false) }

// Wake signals C once if armed, and disarms it.
func (w *Waker) Wake() {
	if w == nil || !w.armed.Load() || !w.armed.CompareAndSwap(true, false) {
		return
	}
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// C receives after a Wake of an armed Waker.
func (w *Waker) C() <-chan struct{} { return w.c }
