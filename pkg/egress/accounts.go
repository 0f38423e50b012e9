package egress

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/splice"
)

// Accounts keep what each client identity uses and whether it may open
// tunnels (pkg/usage's Ledger behind the server's adapter). The Handler
// asks for an identity's Account once per tunnel, never per byte: the
// tunnel's relay counters are handed over (Account.Track) and read off the
// data path.
type Accounts interface {
	// Account returns the account of identity, as /tunnels shows it
	// ("key=NAME", "CN=NAME", both comma-separated; "" for none).
	Account(identity string) Account
}

// Account is one identity's usage. Safe for concurrent use.
type Account interface {
	// Track counts an open tunnel's bytes, up (toward the destination) and
	// down (toward the client): the relay's own counters. The returned
	// func is called once, when the tunnel ends.
	Track(up, down *atomic.Int64) (done func())
	// TrackFrom is Track for a tunnel a previous process handed over (an
	// upgrade): only the bytes past baseUp and baseDown, which that process
	// counted, and not as a new tunnel.
	TrackFrom(up, down *atomic.Int64, baseUp, baseDown int64) (done func())
	// Refused counts a destination refused for the identity.
	Refused()
	// SuspendedUntil is when the operator's suspension of the identity ends
	// (zero: it is not suspended at now).
	SuspendedUntil(now time.Time) time.Time
	// OverQuota reports whether the identity has used its quota: its new
	// tunnels are refused (CodeQuota).
	OverQuota() bool
	// Throttle returns str read (the client's upload) no faster than the
	// identity's upload cap and, with paceWrites (a connection whose
	// sender does not pace by identity: the TCP fallback), written no
	// faster than its download cap; str itself without caps. Waits end
	// with ctx.
	Throttle(ctx context.Context, str splice.Stream, paceWrites bool) splice.Stream
}

// account returns the Account of the stream's identities (nil without
// Config.Accounts).
func (s *stream) account() Account {
	if s.e.cfg.Accounts == nil {
		return nil
	}
	if s.acct == nil {
		s.acct = s.e.cfg.Accounts.Account(strings.Join(s.identities, ","))
	}
	return s.acct
}

// suspended refuses the tunnel of a suspended identity, or of one over its
// quota (the -v 0 line is the server's, once per crossing).
func (s *stream) suspended() *failure {
	a := s.account()
	if a == nil {
		return nil
	}
	if until := s.suspendedUntil(); !until.IsZero() {
		return failed(proto.CodeSuspended, "Refused stream: the operator suspended its identity", "until", until.UTC())
	}
	if a.OverQuota() {
		return &failure{code: proto.CodeQuota, lvl: 2, msg: "Refused stream: its identity has used its quota (--quota)"}
	}
	return nil
}

// suspendedUntil is when the operator's suspension of the stream's
// identities ends (zero: not suspended, or no accounts).
func (s *stream) suspendedUntil() time.Time {
	if a := s.account(); a != nil {
		return a.SuspendedUntil(time.Now())
	}
	return time.Time{}
}

// throttle caps a tunnel's stream by its identity's rates (Account.Throttle).
func (s *stream) throttle(str splice.Stream) splice.Stream {
	if a := s.account(); a != nil {
		return a.Throttle(s.st.Conn.Context(), str, transportOf(s.st.Conn) != "quic")
	}
	return str
}

// track counts a tunnel's bytes in its identity's account until the
// returned func.
func (s *stream) track(up, down *atomic.Int64) func() {
	if a := s.account(); a != nil {
		return a.Track(up, down)
	}
	return func() {}
}
