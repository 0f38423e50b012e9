// Package fec adds forward error correction beneath QUIC: a net.PacketConn
// wrapper that follows every group of up to K datagrams with M Reed-Solomon
// parity datagrams, so the receiver rebuilds up to M lost datagrams of a group
// before QUIC notices the loss. QUIC's loss recovery and NewReno congestion
// control (not configurable in quic-go) then see far less random loss: they
// keep their window instead of halving it on every lost packet. It costs M/K
// more bandwidth (and all of a datagram for a lone interactive packet), and
// quic-go loses GSO and ECN on a wrapped socket, so it is off unless enabled.
//
// Frames are distinguished from plain QUIC packets by their first byte:
// QUIC sets the fixed bit 0x40 in every packet; FEC frames never do. A server
// therefore serves FEC and plain clients on one socket, and answers with FEC
// only those peers that send it.
//
// Frame layout: kind (0x10 data, 0x11 parity) | shard index | K of the group
// (parity only) | M of the group (parity only) | group id (uint32, big endian)
// | payload. A data payload is the QUIC datagram; a parity payload is a parity
// shard over data shards made of a 2-byte length and the datagram, zero padded
// to the longest in the group.
package fec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/reedsolomon"
)

const (
	kindData   = 0x10
	kindParity = 0x11
	headerLen  = 8
	// Overhead is the number of bytes FEC adds to a datagram (header and the
	// length prefix inside parity shards).
	Overhead = headerLen + 2

	maxGroupsPerPeer = 128
	maxPeers         = 4096
	peerIdle         = 2 * time.Minute
)

// Config sets the code. The zero value is invalid; use DefaultConfig.
type Config struct {
	// DataShards (K) is the largest group of datagrams protected together.
	DataShards int
	// ParityShards (M) is the number of parity datagrams for a full group;
	// a partial group gets ceil(k·M/K), at least 1.
	ParityShards int
	// FlushDelay is how long a partial group waits for more datagrams before
	// its parity is sent.
	FlushDelay time.Duration
	// EncodeAll encodes toward every peer (the client); otherwise only toward
	// peers that sent FEC frames (the server).
	EncodeAll bool
}

// DefaultConfig is 10 data + 3 parity (30 %, as kcptun), 1 ms flush.
func DefaultConfig() Config {
	return Config{DataShards: 10, ParityShards: 3, FlushDelay: time.Millisecond}
}

// Stats counts what FEC did; safe for concurrent use.
type Stats struct {
	DataSent      atomic.Uint64
	ParitySent    atomic.Uint64
	DataReceived  atomic.Uint64
	ParityRecv    atomic.Uint64
	Recovered     atomic.Uint64
	Unrecoverable atomic.Uint64
	Malformed     atomic.Uint64
}

// Conn is a PacketConn with FEC. It owns the wrapped conn: Close closes it.
type Conn struct {
	net.PacketConn
	cfg   Config
	stats *Stats

	encMu    sync.Mutex
	encoders map[[2]int]reedsolomon.Encoder

	mu    sync.Mutex
	peers map[string]*peer
	ready []delivery // recovered datagrams not yet returned by ReadFrom
}

type delivery struct {
	b    []byte
	addr net.Addr
}

type peer struct {
	// sendMu keeps a group's data frames ahead of its parity on the wire: the
	// flush timer must not send parity between a datagram joining the group
	// and that datagram being sent. Taken before c.mu.
	sendMu sync.Mutex
	// sending (under c.mu)
	gid     uint32
	shards  [][]byte // length-prefixed copies of this group's datagrams
	timer   *time.Timer
	encodes bool
	addr    net.Addr
	// receiving
	groups   map[uint32]*group
	order    []uint32
	lastSeen time.Time
}

type group struct {
	shards [][]byte // data shards (length-prefixed), then parity
	k, m   int
	size   int
	done   bool
}

// ErrConfig is returned for an invalid Config.
var ErrConfig = errors.New("fec: DataShards must be 1..64 and ParityShards 1..DataShards")

// Layer wraps UDP sockets in FEC with one Config and counts what all of
// them did: a client's extra sockets (path rescue) add to the same Stats as
// its first.
type Layer struct {
	cfg   Config
	stats Stats
}

// NewLayer checks cfg and returns a Layer.
func NewLayer(cfg Config) (*Layer, error) {
	if cfg.DataShards < 1 || cfg.DataShards > 64 || cfg.ParityShards < 1 || cfg.ParityShards > cfg.DataShards {
		return nil, ErrConfig
	}
	if cfg.FlushDelay <= 0 {
		cfg.FlushDelay = time.Millisecond
	}
	return &Layer{cfg: cfg}, nil
}

// Wrap returns pc with FEC; the Conn counts into the Layer's Stats.
func (l *Layer) Wrap(pc net.PacketConn) *Conn {
	return &Conn{PacketConn: pc, cfg: l.cfg, stats: &l.stats, encoders: map[[2]int]reedsolomon.Encoder{}, peers: map[string]*peer{}}
}

// Stats counts what every Conn of the Layer did.
func (l *Layer) Stats() *Stats { return &l.stats }

// New wraps pc in a Layer of its own.
func New(pc net.PacketConn, cfg Config) (*Conn, error) {
	l, err := NewLayer(cfg)
	if err != nil {
		return nil, err
	}
	return l.Wrap(pc), nil
}

// Stats counts what c (and the other Conns of its Layer) did.
func (c *Conn) Stats() *Stats { return c.stats }

func (c *Conn) encoder(k, m int) (reedsolomon.Encoder, error) {
	c.encMu.Lock()
	defer c.encMu.Unlock()
	if e, ok := c.encoders[[2]int{k, m}]; ok {
		return e, nil
	}
	e, err := reedsolomon.New(k, m)
	if err != nil {
		return nil, fmt.Errorf("fec: %w", err)
	}
	c.encoders[[2]int{k, m}] = e
	return e, nil
}

// peerLocked returns the state for addr; c.mu must be held.
func (c *Conn) peerLocked(addr net.Addr) *peer {
	key := addr.String()
	p, ok := c.peers[key]
	if !ok {
		if len(c.peers) >= maxPeers {
			c.evictLocked()
		}
		p = &peer{addr: addr, groups: map[uint32]*group{}, encodes: c.cfg.EncodeAll}
		c.peers[key] = p
	}
	p.lastSeen = time.Now()
	return p
}

func (c *Conn) evictLocked() {
	now := time.Now()
	for k, p := range c.peers {
		if now.Sub(p.lastSeen) > peerIdle {
			if p.timer != nil {
				p.timer.Stop()
			}
			delete(c.peers, k)
		}
	}
	if len(c.peers) >= maxPeers { // all busy: drop an arbitrary one
		for k, p := range c.peers {
			if p.timer != nil {
				p.timer.Stop()
			}
			delete(c.peers, k)
			break
		}
	}
}

// WriteTo sends b to addr, as a data frame followed in time by parity when
// FEC is on for addr.
func (c *Conn) WriteTo(b []byte, addr net.Addr) (int, error) {
	c.mu.Lock()
	p := c.peerLocked(addr)
	if !p.encodes {
		c.mu.Unlock()
		return c.PacketConn.WriteTo(b, addr)
	}
	c.mu.Unlock()
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	c.mu.Lock()
	frame := make([]byte, headerLen+len(b))
	frame[0], frame[1] = kindData, byte(len(p.shards))
	binary.BigEndian.PutUint32(frame[4:8], p.gid)
	copy(frame[headerLen:], b)
	shard := make([]byte, 2+len(b))
	binary.BigEndian.PutUint16(shard, uint16(len(b))) // a datagram is < 64 KiB
	copy(shard[2:], b)
	p.shards = append(p.shards, shard)
	var parity [][]byte
	if len(p.shards) >= c.cfg.DataShards {
		parity = c.cutGroupLocked(p)
	} else if p.timer == nil {
		p.timer = time.AfterFunc(c.cfg.FlushDelay, func() { c.flush(p) })
	}
	c.mu.Unlock()
	n, err := c.PacketConn.WriteTo(frame, addr)
	if err != nil {
		return 0, err
	}
	c.stats.DataSent.Add(1)
	c.sendParity(parity, addr)
	return n - headerLen, nil
}

func (c *Conn) flush(p *peer) {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	c.mu.Lock()
	p.timer = nil
	var parity [][]byte
	if len(p.shards) > 0 {
		parity = c.cutGroupLocked(p)
	}
	addr := p.addr
	c.mu.Unlock()
	c.sendParity(parity, addr)
}

// cutGroupLocked ends the current group and returns its parity frames.
func (c *Conn) cutGroupLocked(p *peer) [][]byte {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	shards := p.shards
	gid := p.gid
	p.shards = nil
	p.gid++
	k := len(shards)
	m := max(1, (k*c.cfg.ParityShards+c.cfg.DataShards-1)/c.cfg.DataShards)
	enc, err := c.encoder(k, m)
	if err != nil {
		return nil
	}
	size := 0
	for _, s := range shards {
		size = max(size, len(s))
	}
	all := make([][]byte, k+m)
	for i, s := range shards {
		all[i] = append(s, make([]byte, size-len(s))...)
	}
	frames := make([][]byte, m)
	for i := range m {
		f := make([]byte, headerLen+size)
		f[0], f[1], f[2], f[3] = kindParity, byte(k+i), byte(k), byte(m)
		binary.BigEndian.PutUint32(f[4:8], gid)
		all[k+i] = f[headerLen:]
		frames[i] = f
	}
	if err := enc.Encode(all); err != nil {
		return nil
	}
	return frames
}

func (c *Conn) sendParity(frames [][]byte, addr net.Addr) {
	for _, f := range frames {
		if _, err := c.PacketConn.WriteTo(f, addr); err == nil {
			c.stats.ParitySent.Add(1)
		}
	}
}

// ReadFrom returns the next datagram: a plain QUIC packet, the payload of a
// data frame, or a datagram rebuilt from parity.
func (c *Conn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		c.mu.Lock()
		if len(c.ready) > 0 {
			d := c.ready[0]
			c.ready = c.ready[1:]
			c.mu.Unlock()
			return copy(b, d.b), d.addr, nil
		}
		c.mu.Unlock()
		n, addr, err := c.PacketConn.ReadFrom(b)
		if err != nil || n == 0 || b[0]&0x40 != 0 { // plain QUIC (fixed bit set)
			return n, addr, err
		}
		if n < headerLen || (b[0] != kindData && b[0] != kindParity) {
			c.stats.Malformed.Add(1)
			continue
		}
		if payload, ok := c.receive(b[:n], addr); ok {
			return copy(b, payload), addr, nil
		}
	}
}

// receive records a frame. For a data frame it returns the datagram to deliver now.
func (c *Conn) receive(f []byte, addr net.Addr) ([]byte, bool) {
	kind, idx, gid := f[0], int(f[1]), binary.BigEndian.Uint32(f[4:8])
	payload := f[headerLen:]
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.peerLocked(addr)
	p.encodes = true // answer FEC with FEC
	g := p.groups[gid]
	if g == nil {
		g = &group{}
		p.groups[gid] = g
		p.order = append(p.order, gid)
		if len(p.order) > maxGroupsPerPeer {
			delete(p.groups, p.order[0])
			p.order = p.order[1:]
		}
	}
	if kind == kindData {
		c.stats.DataReceived.Add(1)
		if idx >= 64 {
			c.stats.Malformed.Add(1)
			return nil, false
		}
		if !g.done {
			g.grow(idx + 1)
			if g.shards[idx] == nil {
				s := make([]byte, 2+len(payload))
				binary.BigEndian.PutUint16(s, uint16(len(payload))) // < 64 KiB
				copy(s[2:], payload)
				g.shards[idx] = s
			}
			c.tryRecoverLocked(g, addr)
		}
		out := make([]byte, len(payload))
		copy(out, payload)
		return out, true
	}
	c.stats.ParityRecv.Add(1)
	k, m := int(f[2]), int(f[3])
	if k < 1 || m < 1 || k+m > 128 || idx < k || idx >= k+m || (g.k != 0 && (g.k != k || g.m != m)) ||
		(g.size != 0 && g.size != len(payload)) || len(payload) < 2 {
		c.stats.Malformed.Add(1)
		return nil, false
	}
	if g.done {
		return nil, false
	}
	g.k, g.m, g.size = k, m, len(payload)
	g.grow(k + m)
	g.shards[idx] = append([]byte(nil), payload...)
	c.tryRecoverLocked(g, addr)
	return nil, false
}

func (g *group) grow(n int) {
	for len(g.shards) < n {
		g.shards = append(g.shards, nil)
	}
}

// tryRecoverLocked rebuilds missing data shards once enough shards arrived.
func (c *Conn) tryRecoverLocked(g *group, addr net.Addr) {
	if g.k == 0 || g.done {
		return
	}
	have, missing := 0, 0
	for i, s := range g.shards[:g.k+g.m] {
		if s != nil {
			have++
		} else if i < g.k {
			missing++
		}
	}
	if missing == 0 {
		g.done = true
		return
	}
	if have < g.k {
		return
	}
	enc, err := c.encoder(g.k, g.m)
	if err != nil {
		return
	}
	shards := make([][]byte, g.k+g.m)
	for i, s := range g.shards[:g.k+g.m] {
		if s == nil {
			continue
		}
		if len(s) > g.size {
			c.stats.Malformed.Add(1)
			return
		}
		shards[i] = append(s[:len(s):len(s)], make([]byte, g.size-len(s))...)
	}
	if err := enc.ReconstructData(shards); err != nil {
		c.stats.Unrecoverable.Add(1)
		g.done = true
		return
	}
	g.done = true
	for i := range g.k {
		if g.shards[i] != nil {
			continue
		}
		s := shards[i]
		n := int(binary.BigEndian.Uint16(s))
		if n+2 > len(s) {
			c.stats.Malformed.Add(1)
			continue
		}
		c.ready = append(c.ready, delivery{b: s[2 : 2+n], addr: addr})
		c.stats.Recovered.Add(1)
	}
}

// Close stops the flush timers and closes the wrapped conn.
func (c *Conn) Close() error {
	c.mu.Lock()
	for _, p := range c.peers {
		if p.timer != nil {
			p.timer.Stop()
		}
	}
	c.mu.Unlock()
	return c.PacketConn.Close()
}

// ParseSpec parses "K/M" (e.g. "10/3") into a Config with the default flush delay.
func ParseSpec(s string) (Config, error) {
	cfg := DefaultConfig()
	var k, m int
	if _, err := fmt.Sscanf(s, "%d/%d", &k, &m); err != nil || fmt.Sprintf("%d/%d", k, m) != s {
		return cfg, fmt.Errorf("%w: want K/M such as 10/3, got %q", ErrConfig, s)
	}
	cfg.DataShards, cfg.ParityShards = k, m
	if _, err := New(nil, cfg); err != nil {
		return cfg, err
	}
	return cfg, nil
}
