package udpflow

import (
	"sync"

	"github.com/quictun/quictun/pkg/dgram"
)

// Drop reasons counted by a Table and a Relay (label values of
// quictun_<daemon>_udp_drops_total).
const (
	// DropUnknownFlow: a datagram for a flow that is not open (it ended, or
	// the peer sent it before the flow existed here).
	DropUnknownFlow = "unknown_flow"
	// DropMalformed: a 'U' datagram whose flow ID does not parse.
	DropMalformed = "malformed"
	// DropQueueFull: a packet from a local application found its flow's
	// queue full (the tunnel cannot keep up); dropped as a router would.
	DropQueueFull = "queue_full"
	// DropFlowLimit: a packet that would have started a flow beyond the
	// flow limit.
	DropFlowLimit = "flow_limit"
	// DropIdentityFlowLimit: a packet that would have started a flow beyond
	// its client identity's share of the server's flows (server only).
	DropIdentityFlowLimit = "identity_flow_limit"
	// DropWriteError: a packet from the peer that the local socket refused
	// (e.g. ICMP port unreachable from the destination).
	DropWriteError = "write_error"
	// DropNoSession: a packet that started a flow while the client had no
	// connection to the server, or whose flow could not be opened.
	DropNoSession = "no_session"
	// DropForeignSource: a SOCKS5 UDP ASSOCIATE packet from an address
	// other than the association's client.
	DropForeignSource = "foreign_source"
	// DropReceiveQueue: a datagram that arrived while the connection's
	// datagram goroutine was behind by more than quic-go's receive queue
	// holds (1024, third_party/quic-go patch 0006): the daemon was not
	// scheduled for a while. Counted for the connection's datagrams of
	// every type, nearly all of them UDP flows' when it happens.
	DropReceiveQueue = "receive_queue"
)

// DropReasons lists every drop reason, for pre-creating metric labels and
// checking the documentation.
func DropReasons() []string {
	return []string{DropUnknownFlow, DropMalformed, DropQueueFull, DropFlowLimit, DropIdentityFlowLimit, DropWriteError, DropNoSession, DropForeignSource, DropReceiveQueue}
}

// Table routes a QUIC connection's 'U' datagrams to the flows open on it,
// by flow ID (the flow's stream ID). Register Handle on the connection's
// dgram.Mux. Safe for concurrent use.
type Table struct {
	drop func(reason string)

	mu    sync.RWMutex
	flows map[uint64]func(p []byte)
}

// NewTable returns an empty Table; drop, which may be nil, counts datagrams
// dropped by reason.
func NewTable(drop func(reason string)) *Table {
	if drop == nil {
		drop = func(string) {}
	}
	return &Table{drop: drop} // flows: made at the first Add (most connections carry no UDP)
}

// Add routes the datagrams of flow id to deliver, which runs on the
// connection's datagram goroutine and must not block, until remove is
// called. It returns ok false, and routes nothing, if id is taken or the
// table already holds max flows (max < 1: no limit).
func (t *Table) Add(id uint64, max int, deliver func(p []byte)) (remove func(), ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, taken := t.flows[id]; taken || (max > 0 && len(t.flows) >= max) {
		return nil, false
	}
	if t.flows == nil {
		t.flows = map[uint64]func([]byte){}
	}
	t.flows[id] = deliver
	return sync.OnceFunc(func() {
		t.mu.Lock()
		delete(t.flows, id)
		t.mu.Unlock()
	}), true
}

// Len is the number of flows open.
func (t *Table) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.flows)
}

// Register routes the 'U' datagrams of m to t (dgram.Registrar).
func (t *Table) Register(m *dgram.Mux) { m.Handle(TypeUDP, t.Handle) }

// Handle delivers one 'U' datagram to its flow, or drops and counts it.
func (t *Table) Handle(b []byte) {
	id, p, err := ParseDatagram(b)
	if err != nil {
		t.drop(DropMalformed)
		return
	}
	t.mu.RLock()
	deliver := t.flows[id]
	t.mu.RUnlock()
	if deliver == nil {
		t.drop(DropUnknownFlow)
		return
	}
	deliver(p)
}
