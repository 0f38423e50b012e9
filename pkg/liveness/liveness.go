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
// The payload's first byte is its type; anything else is counted and dropped.
package liveness

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"time"
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
}

// NewReceiver returns a Receiver. A server (echo=true) answers heartbeats with
// at most maxEchoesPerSecond echoes a second; a client records echoes.
func NewReceiver(c Conn, echo bool, maxEchoesPerSecond int, stats *Stats) *Receiver {
	r := &Receiver{c: c, echo: echo, stats: stats, maxEchoes: maxEchoesPerSecond}
	r.lastEcho.Store(time.Now().UnixNano())
	return r
}

// LastEcho is when the last heartbeat echo arrived (or the Receiver was made).
func (r *Receiver) LastEcho() time.Time { return time.Unix(0, r.lastEcho.Load()) }

// Run receives until ctx is done or the connection closes, and returns then.
func (r *Receiver) Run(ctx context.Context) {
	windowStart := time.Now()
	echoes := 0
	for {
		b, err := r.c.ReceiveDatagram(ctx)
		if err != nil {
			return
		}
		if len(b) == 0 {
			r.stats.Invalid.Add(1)
			continue
		}
		switch b[0] {
		case TypeHeartbeat:
			if !r.echo || len(b) > 64 {
				r.stats.Invalid.Add(1)
				continue
			}
			now := time.Now()
			if now.Sub(windowStart) >= time.Second {
				windowStart, echoes = now, 0
			}
			if echoes >= r.maxEchoes {
				continue
			}
			echoes++
			out := append([]byte{TypeEcho}, b[1:]...)
			if r.c.SendDatagram(out) == nil {
				r.stats.EchoesSent.Add(1)
			}
		case TypeEcho:
			if r.echo {
				r.stats.Invalid.Add(1)
				continue
			}
			r.stats.EchoesReceived.Add(1)
			r.lastEcho.Store(time.Now().UnixNano())
		case TypeTail:
		default:
			r.stats.Invalid.Add(1)
		}
	}
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

// TailProber sends up to Count tail probes after each burst of writes. Kick is
// cheap and never blocks; Run sends the probes. Safe for concurrent use.
type TailProber struct {
	c     Conn
	count int
	delay time.Duration
	stats *Stats
	kick  chan struct{}

	kickedAt atomic.Int64 // unix nanos of the last Kick
	heardAt  atomic.Int64 // unix nanos of the last Heard
}

// NewTailProber returns a prober sending count probes, the first delay after
// a Kick and the next ones delay apart. count 0 makes Kick a no-op.
func NewTailProber(c Conn, count int, delay time.Duration, stats *Stats) *TailProber {
	return &TailProber{c: c, count: count, delay: delay, stats: stats, kick: make(chan struct{}, 1)}
}

// Kick tells the prober data was just written.
func (p *TailProber) Kick() {
	if p == nil || p.count == 0 {
		return
	}
	p.kickedAt.Store(time.Now().UnixNano())
	select {
	case p.kick <- struct{}{}:
	default:
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

// Run sends probes after kicks until ctx is done.
func (p *TailProber) Run(ctx context.Context) {
	if p.count == 0 {
		return
	}
	t := time.NewTimer(time.Hour)
	t.Stop()
	probe := []byte{TypeTail}
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		for range p.count {
			t.Reset(p.delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if p.heardAt.Load() > p.kickedAt.Load() {
				break
			}
			if p.c.SendDatagram(probe) == nil {
				p.stats.TailProbesSent.Add(1)
			}
		}
	}
}
