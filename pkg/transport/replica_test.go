package transport_test

import (
	"crypto/tls"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/transport"
)

// issuers records the issuers TagTickets reports.
type issuers struct {
	mu   sync.Mutex
	seen []string
}

func (i *issuers) add(issuer string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.seen = append(i.seen, issuer)
}

func (i *issuers) take() []string {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := i.seen
	i.seen = nil
	return out
}

// TestTagTickets (issue 30 R6): servers sharing a session-ticket key resume
// each other's sessions, but accept 0-RTT only with a ticket they issued
// themselves (their replay cache is the one that records its 0-RTT
// streams); a ticket that names no replica resumes without 0-RTT too. The
// same through a configuration chosen per handshake (GetConfigForClient, as
// the server's with reloadable client CAs).
func TestTagTickets(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		conf func(*transport.State) *tls.Config
	}{
		{"one configuration", func(st *transport.State) *tls.Config { return transport.ServerTLSConfig(st, nil) }},
		{"a configuration per handshake", func(st *transport.State) *tls.Config {
			c := transport.ServerTLSConfig(st, nil)
			base := c.Clone()
			c.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return base.Clone(), nil }
			return c
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, _ := newState(t)
			pin, err := transport.ParseFingerprint(st.Fingerprint())
			require.NoError(t, err)
			var seen issuers
			a, _ := serveTLS(t, st, transport.TagTickets(tc.conf(st), "replica-a", seen.add))
			b, _ := serveTLS(t, st, transport.TagTickets(tc.conf(st), "replica-b", seen.add))
			untagged, _ := serveTLS(t, st, tc.conf(st)) // a server from before replica IDs
			cache := newSignallingCache(transport.NewStickySessionCache(4))

			for _, step := range []struct {
				what         string
				addr         net.Addr
				resumed, rtt bool
				issuer       []string
			}{
				{"a, first: a full handshake", a, false, false, nil},
				{"b resumes a's ticket, without 0-RTT", b, true, false, []string{transport.IssuerOtherReplica}},
				{"b, its own ticket: 0-RTT", b, true, true, []string{transport.IssuerThisReplica}},
				{"a, b's ticket: without 0-RTT", a, true, false, []string{transport.IssuerOtherReplica}},
				{"a, its own ticket: 0-RTT", a, true, true, []string{transport.IssuerThisReplica}},
				{"a server from before replica IDs", untagged, true, true, nil},
				{"its ticket names no replica: resumed without 0-RTT", b, true, false, []string{transport.IssuerUnknown}},
			} {
				conn := dialEarly(t, step.addr, cache, pin)
				cs := conn.ConnectionState()
				assert.Equal(t, step.resumed, cs.TLS.DidResume, step.what)
				assert.Equal(t, step.rtt, cs.Used0RTT, step.what)
				assert.Equal(t, step.issuer, seen.take(), step.what)
				cache.waitStored(t) // the server's new ticket, for the next step
				_ = conn.CloseWithError(0, "")
			}
		})
	}
}
