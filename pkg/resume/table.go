package resume

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quictun/quictun/pkg/dgram"
	"github.com/quictun/quictun/pkg/proto"
)

// Reasons a resume request is refused (the label of
// quictun_server_resume_refused_total). Every refusal looks the same to
// the client (CodeResumeRefused): it learns nothing about other tunnels.
const (
	// RefusedUnknown: no tunnel of that ID is held (it ended, its window
	// passed, the server restarted, or it never existed).
	RefusedUnknown = "unknown"
	// RefusedIdentity: the tunnel was opened by another identity.
	RefusedIdentity = "identity"
	// RefusedBadRequest: the request's token is malformed.
	RefusedBadRequest = "bad_request"
	// RefusedDisabled: this server keeps no tunnel (--resume-window 0).
	RefusedDisabled = "disabled"
	// RefusedSuspended: the operator suspended the identity (a kick);
	// the tunnel, if still held, is ended.
	RefusedSuspended = "suspended"
)

// RefusedReasons lists the reasons, for pre-created metric series.
func RefusedReasons() []string {
	return []string{RefusedUnknown, RefusedIdentity, RefusedBadRequest, RefusedDisabled, RefusedSuspended}
}

// Errors of Table.Lookup and Table.Add.
var (
	ErrUnknown   = errors.New("no resumable tunnel of that ID")
	ErrIdentity  = errors.New("resumable tunnel opened by another identity")
	ErrDuplicate = errors.New("resume ID in use")
)

// AckInterval is how often the receive offsets that changed are sent. At
// 100 Mbit/s a direction's buffer then holds about its bandwidth-delay
// product plus 20 ms of bytes; the acks cost one datagram of up to 48
// offsets per connection per interval.
const AckInterval = 20 * time.Millisecond

// ackRepeat: an offset that did not change is sent once more after this
// long, so a lost ack datagram does not leave the peer's buffer full.
const ackRepeat = 200 * time.Millisecond

// Table holds a daemon's resumable tunnels by ID: the server looks up a
// re-attachment's tunnel (bound to the identity that opened it), both
// daemons route ack datagrams to their tunnels and send theirs (Run).
// Safe for concurrent use.
type Table struct {
	mu      sync.Mutex
	tunnels map[ID]*entry
	// asleep: Run stopped ticking, nothing being due (no tunnel has an ack
	// to send now or later); wake ends its sleep (poke).
	asleep atomic.Bool
	wake   chan struct{}
	// importing is closed when the imports in progress end (nil: none;
	// BeginImport); imports counts them; waiting are the re-attachments
	// waiting for a tunnel meanwhile, by ID (LookupWait).
	importing chan struct{}
	imports   int
	waiting   map[ID]*waiter
}

type entry struct {
	pipe     *Pipe
	identity string
	// the last offset sent in an ack, when, and whether it was repeated.
	acked    uint64
	ackedAt  time.Time
	repeated bool
}

// settled reports whether e owes no ack for the count r: it was sent
// and repeated, or nothing was received.
func (e *entry) settled(r uint64) bool { return r == e.acked && (e.repeated || r == 0) }

// NewTable returns an empty Table.
func NewTable() *Table { return &Table{tunnels: make(map[ID]*entry), wake: make(chan struct{}, 1)} }

// Add registers p as tunnel id of identity until remove is called.
func (t *Table) Add(id ID, identity string, p *Pipe) (remove func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.tunnels[id]; ok {
		return nil, ErrDuplicate
	}
	e := &entry{pipe: p, identity: identity}
	t.tunnels[id] = e
	p.table.Store(t) // it pokes Run when it receives bytes
	if w := t.waiting[id]; w != nil {
		close(w.added)
		delete(t.waiting, id)
	}
	return sync.OnceFunc(func() {
		t.mu.Lock()
		if t.tunnels[id] == e {
			delete(t.tunnels, id)
		}
		t.mu.Unlock()
	}), nil
}

// Lookup returns tunnel id if identity opened it.
func (t *Table) Lookup(id ID, identity string) (*Pipe, error) {
	t.mu.Lock()
	e, ok := t.tunnels[id]
	t.mu.Unlock()
	return e.check(ok, identity)
}

// check returns e's pipe if it was found (ok) and identity opened it.
func (e *entry) check(ok bool, identity string) (*Pipe, error) {
	if !ok {
		return nil, ErrUnknown
	}
	if subtle.ConstantTimeCompare([]byte(e.identity), []byte(identity)) != 1 {
		return nil, ErrIdentity
	}
	return e.pipe, nil
}

// BeginImport marks an import in progress until end is called (once; more
// calls do nothing): an upgrade's new server serves while it takes its
// predecessor's tunnels, and a re-attachment that comes before its tunnel
// waits for it in LookupWait instead of being refused.
func (t *Table) BeginImport() (end func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.imports == 0 {
		t.importing = make(chan struct{})
	}
	t.imports++
	return sync.OnceFunc(func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.imports--; t.imports == 0 {
			close(t.importing)
			t.importing = nil
		}
	})
}

// LookupWait is Lookup, except that a tunnel not held while an import is
// in progress (BeginImport) is waited for: until it is added, the import
// ended, or ctx ended (then it is unknown). waited says whether it waited.
// The caller has authenticated the request: a wait holds the caller's
// goroutine and one map entry per ID waited for, and the import's own
// bound bounds it.
func (t *Table) LookupWait(ctx context.Context, id ID, identity string) (p *Pipe, waited bool, err error) {
	t.mu.Lock()
	e, ok := t.tunnels[id]
	importing := t.importing
	if ok || importing == nil {
		t.mu.Unlock()
		p, err = e.check(ok, identity)
		return p, false, err
	}
	w := t.waiting[id]
	if w == nil {
		if t.waiting == nil {
			t.waiting = make(map[ID]*waiter)
		}
		w = &waiter{added: make(chan struct{})}
		t.waiting[id] = w
	}
	w.n++
	t.mu.Unlock()
	select {
	case <-w.added:
	case <-importing:
	case <-ctx.Done():
	}
	t.mu.Lock()
	if w.n--; w.n == 0 && t.waiting[id] == w {
		delete(t.waiting, id)
	}
	e, ok = t.tunnels[id]
	t.mu.Unlock()
	p, err = e.check(ok, identity)
	return p, true, err
}

// Waiting is the number of re-attachments waiting in LookupWait.
func (t *Table) Waiting() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, w := range t.waiting {
		n += w.n
	}
	return n
}

// waiter is what the re-attachments waiting for one ID share: added is
// closed when it is added.
type waiter struct {
	added chan struct{}
	n     int
}

// Len is the number of tunnels held.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.tunnels)
}

// EndIdentity ends every tunnel identity opened, running or parked, with
// code, counted as given up for reason (Pipe.End), and returns how many
// it ended. The server's kick calls it, so that a kicked identity's
// tunnels do not wait to be resumed.
func (t *Table) EndIdentity(identity string, code proto.Code, reason string) int {
	t.mu.Lock()
	var pipes []*Pipe
	for _, e := range t.tunnels {
		if e.identity == identity {
			pipes = append(pipes, e.pipe)
		}
	}
	t.mu.Unlock()
	for _, p := range pipes {
		p.End(code, reason)
	}
	return len(pipes)
}

// Close gives up every parked tunnel (GaveUpShutdown); running ones end
// with their connections.
func (t *Table) Close() {
	t.mu.Lock()
	pipes := make([]*Pipe, 0, len(t.tunnels))
	for _, e := range t.tunnels {
		pipes = append(pipes, e.pipe)
	}
	t.mu.Unlock()
	for _, p := range pipes {
		p.GiveUp(GaveUpShutdown)
	}
}

// Acks returns the Registrar of conn's ack datagrams: each confirms the
// bytes of a tunnel that runs on conn (the Attachment's Conn); others are
// ignored.
func (t *Table) Acks(conn any) dgram.Registrar { return connAcks{t, conn} }

type connAcks struct {
	t    *Table
	conn any
}

func (c connAcks) Register(m *dgram.Mux) {
	m.Handle(TypeAck, func(b []byte) {
		_ = ParseAcks(b, func(a Ack) {
			c.t.mu.Lock()
			e := c.t.tunnels[a.ID]
			c.t.mu.Unlock()
			if e != nil {
				_ = e.pipe.Ack(a.Offset, c.conn)
			}
		})
	})
}

// Run sends, every AckInterval, the receive offsets that changed, one
// datagram per connection and 48 tunnels, until ctx ends. Each
// connection's datagrams go out on a goroutine of their own (quic-go's
// SendDatagram blocks while the connection's queue is full, in a
// blackout) and a connection still sending is skipped that round. While
// no attached tunnel has an ack to send now or later (every offset sent
// and repeated: idle tunnels, parked ones, none) it does not tick, so
// idle tunnels cost no wake-ups; a tunnel that receives bytes wakes it.
func (t *Table) Run(ctx context.Context) {
	tick := time.NewTicker(AckInterval)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	busy := make(map[any]bool)
	pending := make(map[any]*connPending)
	for {
		var due bool
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			due = t.collect(now, pending)
		}
		for conn, cp := range pending {
			delete(pending, conn)
			mu.Lock()
			if busy[conn] {
				mu.Unlock()
				continue
			}
			busy[conn] = true
			mu.Unlock()
			wg.Go(func() {
				for rest := cp.acks; len(rest) > 0; {
					var b []byte
					b, rest = AppendAcks(nil, rest)
					if cp.send(b) != nil {
						break // the connection ended; a lost ack is repeated (ackRepeat)
					}
				}
				mu.Lock()
				delete(busy, conn)
				mu.Unlock()
			})
		}
		if !due && !t.sleep(ctx, tick) {
			return
		}
	}
}

// sleep stops tick until a tunnel pokes Run (poke), and returns false if
// ctx ended first. asleep is set before the last look at the tunnels:
// bytes received after it poke, bytes received before it are seen.
func (t *Table) sleep(ctx context.Context, tick *time.Ticker) bool {
	tick.Stop()
	t.asleep.Store(true)
	defer t.asleep.Store(false)
	if !t.due() {
		select {
		case <-ctx.Done():
			return false
		case <-t.wake:
		}
	}
	tick.Reset(AckInterval)
	return true
}

// poke wakes Run if it sleeps; a tunnel calls it when it receives bytes
// (one atomic load while Run ticks).
func (t *Table) poke() {
	if t.asleep.Load() {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// due reports whether an attached tunnel has an ack to send now or later
// (collect's rules, without changing anything).
func (t *Table) due() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.tunnels {
		if e.settled(e.pipe.recv.Load()) {
			continue
		}
		if _, _, send := e.pipe.ackState(); send != nil {
			return true
		}
	}
	return false
}

type connPending struct {
	send func([]byte) error
	acks []Ack
}

// collect gathers the acks due now by connection, and reports whether
// an attached tunnel will have one to send later (its repeat).
func (t *Table) collect(now time.Time, pending map[any]*connPending) (later bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, e := range t.tunnels {
		r := e.pipe.recv.Load()
		if e.settled(r) {
			continue // idle, its count sent twice: nothing to do (and no lock taken)
		}
		recv, conn, send := e.pipe.ackState()
		if send == nil {
			// Parked (or on a connection without datagrams): its next
			// attachment tells the peer the count (the resume request's
			// offset, or the reply's), so it counts as sent until the
			// count changes. Otherwise every parked tunnel was locked at
			// every round (1,000 imported in an upgrade, until each
			// re-attached: 7 % of the new server's CPU then).
			e.acked, e.ackedAt, e.repeated = r, now, true
			continue
		}
		switch {
		case recv != e.acked:
			e.acked, e.ackedAt, e.repeated = recv, now, false
			later = true // its repeat
		case !e.repeated && recv > 0 && now.Sub(e.ackedAt) >= ackRepeat:
			e.repeated = true
		default:
			later = true // its repeat, not yet
			continue
		}
		cp := pending[conn]
		if cp == nil {
			cp = &connPending{send: send}
			pending[conn] = cp
		}
		cp.acks = append(cp.acks, Ack{ID: id, Offset: recv})
	}
	return later
}

// Export hands over every parked tunnel (Pipe.Export; their OnEnd removes
// them from the Table) with the identity that opened it, in the order of
// their IDs. Tunnels that are not parked, or whose socket cannot be handed
// over, stay; the caller ends them.
func (t *Table) Export() []*State {
	var out []*State
	t.ExportEach(func(st *State) { out = append(out, st) })
	return out
}

// ExportEach is Export giving each tunnel to each as soon as it is
// exported (each then owns it), in the same order.
func (t *Table) ExportEach(each func(*State)) {
	t.mu.Lock()
	type held struct {
		id ID
		e  *entry
	}
	all := make([]held, 0, len(t.tunnels))
	for id, e := range t.tunnels {
		all = append(all, held{id, e})
	}
	t.mu.Unlock()
	slices.SortFunc(all, func(a, b held) int { return bytes.Compare(a.id[:], b.id[:]) })
	for _, h := range all {
		st, err := h.e.pipe.Export()
		if err != nil {
			continue
		}
		st.Identity = h.e.identity
		each(st)
	}
}

// Settle waits until no tunnel of the Table runs any more (each parked or
// ended: its connection was closed, as before an Export in an upgrade) or
// ctx ends, and returns how many still run. It looks every millisecond: a
// closed connection's tunnels park within a few.
func (t *Table) Settle(ctx context.Context) int {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		n := t.running()
		if n == 0 || ctx.Err() != nil {
			return n
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// running counts the tunnels neither parked nor ended.
func (t *Table) running() int {
	t.mu.Lock()
	pipes := make([]*Pipe, 0, len(t.tunnels))
	for _, e := range t.tunnels {
		pipes = append(pipes, e.pipe)
	}
	t.mu.Unlock()
	n := 0
	for _, p := range pipes {
		p.mu.Lock()
		if p.state != stateParked && p.state != stateEnded && p.abortErr == nil {
			n++
		}
		p.mu.Unlock()
	}
	return n
}
