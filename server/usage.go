package server

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/ratecap"
	"github.com/quictun/quictun/pkg/splice"
	"github.com/quictun/quictun/pkg/transport"

	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/usage"
)

// ledgerAccounts gives egress the accounts of a usage.Ledger, capped by
// the rates of caps (nil: none).
type ledgerAccounts struct {
	l    *usage.Ledger
	caps *ratecap.Table
}

// Account implements egress.Accounts.
func (a ledgerAccounts) Account(identity string) egress.Account {
	acct := a.l.Get(identity)
	if a.caps == nil {
		return account{Account: acct}
	}
	return account{Account: acct, shares: a.caps.For(acct.Name())}
}

// account is an identity's usage and its rate budgets.
type account struct {
	*usage.Account
	shares *ratecap.Shares // nil: no caps configured
}

// Throttle implements egress.Account: with caps configured every tunnel
// reads through the identity's upload budget (a reload may cap an open
// tunnel), and on the TCP fallback writes through its download budget.
func (a account) Throttle(ctx context.Context, str splice.Stream, paceWrites bool) splice.Stream {
	if a.shares == nil {
		return str
	}
	var down *ratecap.Bucket
	if paceWrites {
		down = &a.shares.Down
	}
	return ratecap.NewStream(ctx, str, &a.shares.Up, down)
}

// bindCaps paces the connection's sender by its identity's download budget
// (a no-op without caps, or for a TCP connection, whose writes are paced
// per stream).
func (s *Server) bindCaps(tc tunnelConn, identity string) {
	if s.cfg.RateLimits == nil {
		return
	}
	q := tc.asQUIC()
	if q == nil {
		return
	}
	if ctl, ok := q.CongestionController().(*ratecap.Controller); ok && !ctl.Bound() {
		if identity == "" {
			identity = usage.Anonymous
		}
		ctl.Bind(&s.cfg.RateLimits.For(identity).Down)
	}
}

// rebindCaps binds, every second, the controllers of verified connections
// past their handshake that have none bound: quic-go gives a connection a
// fresh controller after a path migration.
func (s *Server) rebindCaps(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		conns := make([]liveConn, 0, len(s.conns))
		for _, lc := range s.conns {
			// Before its handshake completes, a connection verified from
			// the start (mutual TLS) does not know its identity yet:
			// identified binds it then.
			if lc.verified.Load() && transport.HandshakeComplete(lc.conn) {
				conns = append(conns, lc)
			}
		}
		s.mu.Unlock()
		for _, lc := range conns {
			s.bindCaps(lc.conn, lc.state.Identity(lc.conn))
		}
	}
}

// NewIdentityCollector exports the usage of l's identities
// (quictun_server_identity_*), by the bounded label set of l.Series.
func NewIdentityCollector(l *usage.Ledger) *metrics.IdentityCollector {
	return metrics.NewIdentityCollector(func() []metrics.IdentityUsage {
		series := l.Series()
		out := make([]metrics.IdentityUsage, 0, len(series))
		for _, u := range series {
			out = append(out, metrics.IdentityUsage{
				Identity: u.Identity, BytesUpstream: u.BytesUpstream, BytesDownstream: u.BytesDownstream,
				Tunnels: u.Tunnels, Connections: u.Connections, Refused: u.RefusedDestinations,
				ActiveTunnels: u.ActiveTunnels, ActiveConnections: u.ActiveConnections,
			})
		}
		return out
	})
}

// Usage is the server's ledger (Config.Usage; nil: none).
func (s *Server) Usage() *usage.Ledger { return s.cfg.Usage }

// runUsage runs the ledger (rates, periodic saves) until ctx is done, then
// saves it once more.
func (s *Server) runUsage(ctx context.Context) {
	logger := klog.FromContext(ctx)
	err := s.cfg.Usage.Run(ctx, usage.Hooks{
		SaveFailed: func(err error) {
			logger.Error(err, "Could not save the accounting; it is kept in memory and saved again at the next interval")
		},
		OverQuota: func(identity string, used int64, q usage.Quota) {
			logger.Info("Identity reached its quota: its new tunnels are refused (quota) until its rolling window frees some; open tunnels run on",
				"identity", identity, "usedBytes", used, "quotaBytes", q.Bytes, "window", q.Window)
		},
	})
	if err != nil {
		logger.Error(err, "Could not save the accounting at shutdown")
	}
}

// identified is called once the connection's client has proven its
// identity: it is counted among its identity's connections until it ends.
// A suspended identity's connection is kept open, its streams refused
// (egress): closing it would have its client reconnect at once, a
// handshake per attempt, for as long as the suspension lasts.
func (c *conn) identified() {
	l := c.s.cfg.Usage
	if l == nil {
		return
	}
	acct := l.Get(c.gate.state.Identity(c.tc))
	if until := acct.SuspendedUntil(time.Now()); !until.IsZero() {
		c.logger.V(2).Info("Connection of a suspended identity: its streams are refused until the suspension ends", "identity", acct.Name(), "until", until)
	}
	closed := acct.ConnOpened()
	c.accounted.Store(&closed)
	c.s.bindCaps(c.tc, acct.Name())
}

// unaccount stops counting the connection among its identity's.
func (c *conn) unaccount() {
	if f := c.accounted.Load(); f != nil {
		(*f)()
	}
}

// suspendedReason is the close reason of a suspended identity's connection.
func suspendedReason(until time.Time) string {
	return fmt.Sprintf("identity suspended by the operator until %s", until.UTC().Format(time.RFC3339))
}

// ErrNoUsage is returned by Kick on a server without accounting.
var ErrNoUsage = fmt.Errorf("server: no accounting (Config.Usage)")

// Kick closes identity's open connections at once with suspended (their
// tunnels end with them) and suspends it for d: until then the streams of
// its new connections are refused with suspended (the connections are
// kept, see identified).
// d <= 0 only closes them (and lifts a suspension). It returns the number
// of connections closed and when the suspension ends (zero: none); the
// caller writes the audit line.
func (s *Server) Kick(identity string, d time.Duration) (closed int, until time.Time, err error) {
	if s.cfg.Usage == nil {
		return 0, time.Time{}, ErrNoUsage
	}
	if identity == "" {
		identity = usage.Anonymous
	}
	until = s.cfg.Usage.Suspend(identity, d)
	reason := "identity disconnected by the operator"
	if !until.IsZero() {
		reason = suspendedReason(until)
	}
	s.mu.Lock()
	var victims []tunnelConn
	for _, lc := range s.conns {
		id := lc.state.Identity(lc.conn)
		if id == "" {
			id = usage.Anonymous
		}
		if id == identity {
			victims = append(victims, lc.conn)
		}
	}
	s.mu.Unlock()
	s.endResumable(identity)
	for _, tc := range victims {
		_ = tc.CloseWithError(proto.CodeSuspended.ApplicationErrorCode(), reason)
	}
	return len(victims), until, nil
}

// endResumable ends identity's resumable tunnels (--resume-window), parked
// ones too: without it they would wait for a re-attachment once the
// kick closed their connections, and resume after a short suspension.
func (s *Server) endResumable(identity string) {
	r := s.cfg.Resume
	if r == nil || r.Table == nil {
		return
	}
	tableIdentity := identity // the identities the streams proved, joined (egress)
	if identity == usage.Anonymous {
		tableIdentity = ""
	}
	// Counted in quictun_server_tunnels_resume_gaveup_total{reason="kicked"}.
	r.Table.EndIdentity(tableIdentity, proto.CodeSuspended, resume.GaveUpKicked)
}

// Identities is the admin API's view of the server's accounting
// (admin.Identities); nil without Config.Usage.
func (s *Server) Identities() *Identities {
	if s.cfg.Usage == nil {
		return nil
	}
	return &Identities{s: s}
}

// Identities lists the accounting by identity and kicks identities.
type Identities struct{ s *Server }

// List returns every identity's usage.
func (i *Identities) List() []usage.Usage { return i.s.cfg.Usage.Snapshot() }

// Get returns one identity's usage.
func (i *Identities) Get(identity string) (usage.Usage, bool) {
	return i.s.cfg.Usage.Identity(identity)
}

// Kick is Server.Kick.
func (i *Identities) Kick(identity string, d time.Duration) (int, time.Time, error) {
	return i.s.Kick(identity, d)
}

// RateLimits is the server's table of caps (Config.RateLimits; nil: none),
// for a reload to change.
func (s *Server) RateLimits() *ratecap.Table { return s.cfg.RateLimits }
