package resume

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/quictun/quictun/pkg/splice"
)

// Errors of Export and Import.
var (
	// ErrHandedOver is OnEnd's error for a tunnel Export gave to another
	// process: it did not end, the other process continues it.
	ErrHandedOver = errors.New("tunnel handed over to another process")
	// ErrNotParked: only a parked tunnel (no stream, no writer) can be
	// exported.
	ErrNotParked = errors.New("tunnel is not parked")
	// ErrNotExportable: the application's connection has no file
	// descriptor to hand over (not a TCP or UNIX socket).
	ErrNotExportable = errors.New("tunnel's application connection cannot be handed over")
	// ErrTooLarge: an imported tunnel holds more bytes than the cap allows.
	ErrTooLarge = errors.New("imported tunnel holds more bytes than its cap")
	// ErrBudget: an imported tunnel's bytes do not fit the daemon's Budget.
	ErrBudget = errors.New("imported tunnel's bytes exceed the resume budget")
)

// State is a parked tunnel on its way to another process (an upgrade):
// what Export takes from a Pipe and Import rebuilds one from.
type State struct {
	ID ID
	// Identity opened the tunnel (Table.Export fills it).
	Identity string
	// Window is how long the tunnel stays parked in the new process.
	Window time.Duration
	// Received is how many of the peer's bytes reached the application.
	Received uint64
	// Base is the offset of Data[0]: the peer confirmed every byte before.
	Base uint64
	// Confirmed: the peer confirmed every byte sent before the loss, so it
	// holds exactly Base of them (Pipe.Confirmed); otherwise some of Data
	// may have been sent, and the new process waits for the reply to learn
	// where to go on from.
	Confirmed bool
	// Data are the bytes read from the application that the peer has not
	// confirmed; EOF: the application's EOF follows them.
	Data []byte
	EOF  bool
	// DownDone: the peer's FIN reached the application (its write side is
	// shut down).
	DownDone bool
	// ToStream and FromStream are the Pipe's byte counts.
	ToStream, FromStream int64
	// Conn is the application's socket (a duplicate descriptor; the owner
	// of the State closes it).
	Conn *os.File
	// Meta is Config.Meta (not handed over; the caller's own record).
	Meta any
}

// fileConn is a connection whose descriptor can be duplicated (*net.TCPConn,
// *net.UnixConn).
type fileConn interface {
	File() (*os.File, error)
}

// ExtraBytes is what an exported direction may hold past its cap: the rest
// of the one read of the application the reader had made when it stopped.
const ExtraBytes = ChunkSize

// Export hands a parked tunnel over to another process: it stops reading
// the application (keeping the bytes it read), takes the offsets and the
// unconfirmed bytes and a duplicate of the application's socket, and ends
// the tunnel here without closing the connection (the duplicate keeps the
// socket open: no FIN, no RST) and with OnEnd(ErrHandedOver). A tunnel that
// is not parked (ErrNotParked) or whose socket cannot be duplicated
// (ErrNotExportable) is left as it was.
func (p *Pipe) Export() (*State, error) {
	fc, ok := p.conn.(fileConn)
	if !ok {
		return nil, ErrNotExportable
	}
	p.mu.Lock()
	parked := p.state == stateParked && p.abortErr == nil
	p.mu.Unlock()
	if !parked {
		return nil, ErrNotParked
	}
	f, err := fc.File()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotExportable, err)
	}
	p.mu.Lock()
	if p.state != stateParked || p.abortErr != nil {
		p.mu.Unlock()
		_ = f.Close()
		return nil, ErrNotParked
	}
	p.state, p.handedOver = stateEnded, true
	if p.timer != nil {
		p.timer.Stop()
	}
	downDone := p.downDone
	p.mu.Unlock()
	p.freezeOnce.Do(func() { close(p.frozen) })
	_ = p.conn.SetReadDeadline(time.Unix(1, 0)) // wakes the reader's Read
	<-p.readerDone
	base, data, eof := p.out.snapshot()
	_, confirmed := p.out.Confirmed()
	st := &State{ID: p.cfg.ID, Window: p.cfg.Window, Received: p.recv.Load(), Base: base, Confirmed: confirmed, Data: data, EOF: eof,
		DownDone: downDone, ToStream: p.ToStream.Load(), FromStream: p.FromStream.Load(), Conn: f, Meta: p.cfg.Meta}
	p.end()
	return st, nil
}

// Import rebuilds an exported tunnel (Export, in another process): parked,
// its window timer armed, reading the application again (unless its EOF
// was read), its bytes held for resending from the peer's offset. Import
// takes st.Conn (the Pipe's connection from now on: importConn). Bytes
// past cfg's cap (plus ExtraBytes) are refused (ErrTooLarge), so are bytes
// the Budget cannot hold (ErrBudget): then nothing is held and the
// application's connection is reset.
func Import(st *State, cfg Config) (*Pipe, error) {
	sc, err := importConn(st.Conn)
	if err != nil {
		return nil, fmt.Errorf("import tunnel socket: %w", err)
	}
	cfg.ID, cfg.Window = st.ID, st.Window
	p := newPipe(sc, cfg)
	if err := p.out.restore(st.Base, st.Data, st.EOF, st.Confirmed); err != nil {
		resetConn(sc)
		return nil, err
	}
	p.recv.Store(st.Received)
	p.ToStream.Store(st.ToStream)
	p.FromStream.Store(st.FromStream)
	p.mu.Lock()
	p.attached = true // it was: every Serve here re-attaches (offsets checked)
	p.downDone = st.DownDone
	p.parkLocked(true)
	p.mu.Unlock()
	if st.EOF {
		close(p.readerDone)
	} else {
		go p.read()
	}
	return p, nil
}

// netFileConn makes f the tunnel's connection with net.FileConn (a
// duplicate descriptor); it closes f.
func netFileConn(f *os.File) (splice.Conn, error) {
	nc, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		return nil, err
	}
	sc, ok := nc.(splice.Conn)
	if !ok {
		_ = nc.Close()
		return nil, fmt.Errorf("%w: %T", ErrNotExportable, nc)
	}
	return sc, nil
}

// lingerer is a connection whose Close can reset it (SetLinger(0)):
// *net.TCPConn, an imported tunnel's sockConn.
type lingerer interface {
	SetLinger(sec int) error
}

// resetConn closes c with a reset: the application must not take a
// tunnel that could not be continued for a clean end.
func resetConn(c splice.Conn) {
	if l, ok := c.(lingerer); ok {
		_ = l.SetLinger(0)
	}
	_ = c.Close()
}

// snapshot returns base, a copy of the bytes from base to end, and eof.
// Only once no writer and no reader runs.
func (b *Buffer) snapshot() (base uint64, data []byte, eof bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	data = make([]byte, 0, b.end-b.base)
	for off := b.base; off < b.end; {
		pos := off - b.start
		idx, o := int(pos/ChunkSize), int(pos%ChunkSize)
		n := min(uint64(ChunkSize-o), b.end-off)
		data = append(data, (*b.chunks[idx])[o:o+int(n)]...)
		off += n
	}
	return b.base, data, b.eof
}

// restore fills an empty Buffer with an exported direction: data from
// offset base on, eof after it; within the cap (plus ExtraBytes) and the
// Budget, or nothing is held. confirmed: none of data was sent (State).
func (b *Buffer) restore(base uint64, data []byte, eof, confirmed bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	limit := (b.cap+ChunkSize-1)/ChunkSize*ChunkSize + ExtraBytes
	if len(data) > limit {
		return fmt.Errorf("%w: %d bytes > %d", ErrTooLarge, len(data), limit)
	}
	b.start, b.base, b.sent, b.end, b.eof = base, base, base, base, eof
	b.sentUnknown = !confirmed // else the previous process may have sent past base
	need := int64((len(data) + ChunkSize - 1) / ChunkSize * ChunkSize)
	if need > 0 {
		if ok, _ := b.budget.take(need); !ok {
			return fmt.Errorf("%w: %d bytes", ErrBudget, len(data))
		}
		b.budget.used.Add(-need) // appendLocked takes them chunk by chunk
	}
	b.appendLocked(data)
	return nil
}
