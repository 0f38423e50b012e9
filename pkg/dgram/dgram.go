// Package dgram routes the QUIC datagrams (RFC 9221) a connection receives
// by their first byte, the type, to the handler registered for it: liveness
// ('H', 'E', 'T') and, with issue 12, UDP flows ('U'). One goroutine per
// connection reads; handlers run on it and must not block (a handler that
// needs to wait hands the datagram off, bounded, or drops and counts it).
package dgram

import (
	"context"
	"fmt"

	"github.com/quic-go/quic-go"
)

// Conn is the part of *quic.Conn the Mux reads from.
type Conn interface {
	ReceiveDatagram(ctx context.Context) ([]byte, error)
}

// Mux dispatches datagrams by type. Register handlers before Run.
type Mux struct {
	// handlers is searched in order: a connection registers a handful of
	// types, and a table of all 256 would cost 2 KiB per idle connection.
	handlers []handler
	unknown  func(b []byte)
}

type handler struct {
	t byte
	f func(b []byte)
}

// lookup returns the handler of type t, or nil.
func (m *Mux) lookup(t byte) func(b []byte) {
	for _, h := range m.handlers {
		if h.t == t {
			return h.f
		}
	}
	return nil
}

// NewMux returns a Mux without handlers; unknown types (and empty
// datagrams) go to unknown, which may be nil.
func NewMux(unknown func(b []byte)) *Mux { return &Mux{unknown: unknown} }

// Handle registers f for datagrams whose first byte is t. Registering a type
// twice is a programmer error and panics.
func (m *Mux) Handle(t byte, f func(b []byte)) {
	if m.lookup(t) != nil {
		panic(fmt.Sprintf("dgram: type %q registered twice", t))
	}
	m.handlers = append(m.handlers, handler{t, f})
}

// Run receives until ctx is done or the connection ends, and returns then.
func (m *Mux) Run(ctx context.Context, c Conn) {
	for {
		b, err := c.ReceiveDatagram(ctx)
		if err != nil {
			return
		}
		var f func([]byte)
		if len(b) > 0 {
			f = m.lookup(b[0])
		}
		if f == nil {
			f = m.unknown
		}
		if f != nil {
			f(b)
		}
	}
}

// Registrar adds its handlers to a Mux (liveness.Receiver, udpflow.Table).
type Registrar interface {
	Register(m *Mux)
}

// StatsConn is the part of *quic.Conn Serve uses.
type StatsConn interface {
	Conn
	ConnectionStats() quic.ConnectionStats
}

// Serve is a connection's datagram goroutine: it routes c's datagrams to
// the handlers rs register (other types to unknown, which may be nil) until
// ctx is done or the connection ends. quic-go keeps the datagrams that
// arrive while this goroutine is behind in a bounded queue and discards
// more (third_party/quic-go patch 0006 counts them); each time the count
// grows, dropped (which may be nil) is called with how many more.
func Serve(ctx context.Context, c StatsConn, unknown func([]byte), dropped func(n int), rs ...Registrar) {
	m := NewMux(unknown)
	for _, r := range rs {
		r.Register(m)
	}
	var seen uint64
	m.Run(ctx, receiveFunc(func(ctx context.Context) ([]byte, error) {
		b, err := c.ReceiveDatagram(ctx)
		if n := c.ConnectionStats().DatagramsDropped; n > seen && dropped != nil {
			dropped(int(n - seen))
			seen = n
		}
		return b, err
	}))
}

type receiveFunc func(ctx context.Context) ([]byte, error)

func (f receiveFunc) ReceiveDatagram(ctx context.Context) ([]byte, error) { return f(ctx) }
