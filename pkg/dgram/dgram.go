// Package dgram routes the QUIC datagrams (RFC 9221) a connection receives
// by their first byte, the type, to the handler registered for it: liveness
// ('H', 'E', 'T') and, with issue 12, UDP flows ('U'). One goroutine per
// connection reads; handlers run on it and must not block (a handler that
// needs to wait hands the datagram off, bounded, or drops and counts it).
package dgram

import (
	"context"
	"fmt"
)

// Conn is the part of *quic.Conn the Mux reads from.
type Conn interface {
	ReceiveDatagram(ctx context.Context) ([]byte, error)
}

// Mux dispatches datagrams by type. Register handlers before Run.
type Mux struct {
	handlers [256]func(b []byte)
	unknown  func(b []byte)
}

// NewMux returns a Mux without handlers; unknown types (and empty
// datagrams) go to unknown, which may be nil.
func NewMux(unknown func(b []byte)) *Mux { return &Mux{unknown: unknown} }

// Handle registers f for datagrams whose first byte is t. Registering a type
// twice is a programmer error and panics.
func (m *Mux) Handle(t byte, f func(b []byte)) {
	if m.handlers[t] != nil {
		panic(fmt.Sprintf("dgram: type %q registered twice", t))
	}
	m.handlers[t] = f
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
			f = m.handlers[b[0]]
		}
		if f == nil {
			f = m.unknown
		}
		if f != nil {
			f(b)
		}
	}
}
