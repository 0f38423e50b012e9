package transport

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
)

// Issuers of a session ticket presented to a server, as TicketIssuer
// reports them (quictun_server_session_tickets_total{issuer}).
const (
	// IssuerThisReplica: this server issued the ticket; its 0-RTT data is
	// accepted (the replay cache that saw it is this server's).
	IssuerThisReplica = "this_replica"
	// IssuerOtherReplica: another server sharing the session-ticket key
	// issued it; the session resumes, without 0-RTT.
	IssuerOtherReplica = "other_replica"
	// IssuerUnknown: a ticket that names no replica (issued by a server
	// from before replica IDs); resumes without 0-RTT.
	IssuerUnknown = "unknown"
)

// TicketIssuers are the issuer label values, for pre-created series.
var TicketIssuers = []string{IssuerThisReplica, IssuerOtherReplica, IssuerUnknown}

// replicaPrefix starts the entry a ticket's SessionState.Extra holds for its
// issuer (quic-go keeps its own entry there, with its own prefix).
const replicaPrefix = "quictun-replica\x00"

// replicaTag is the Extra entry naming replica: a hash, so its length is
// fixed whatever the ID (the ticket is encrypted anyway).
func replicaTag(replica string) []byte {
	sum := sha256.Sum256([]byte(replica))
	return append([]byte(replicaPrefix), sum[:8]...)
}

// TagTickets returns a copy of the server configuration conf whose session
// tickets name replica, the server instance that issues them, so that
// 0-RTT data is accepted only by the replica whose replay cache records it.
// Replicas that share a session-ticket key resume each other's sessions
// (an abbreviated handshake, no certificate), but a ticket another replica
// issued, or one that names none, has its early data refused: the client
// sends it again as 1-RTT data, one round trip later, as QUIC has it when a
// server rejects 0-RTT. Without this, a 0-RTT flight recorded on the path
// and sent to another replica within the replay window would be served
// there again: each replica's replay cache is its own.
//
// seen, if not nil, is told the issuer (IssuerThisReplica, ...) of every
// ticket the server decrypts. conf's GetConfigForClient, if any, is
// wrapped so the configurations it returns tag and check tickets too.
func TagTickets(conf *tls.Config, replica string, seen func(issuer string)) *tls.Config {
	tag := replicaTag(replica)
	c := conf.Clone()
	hookTickets(c, tag, seen)
	if get := c.GetConfigForClient; get != nil {
		c.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			hc, err := get(hello)
			if hc == nil || err != nil {
				return hc, err
			}
			hc = hc.Clone()
			hookTickets(hc, tag, seen)
			return hc, nil
		}
	}
	return c
}

// hookTickets sets c's WrapSession and UnwrapSession: tickets are c's own
// (EncryptTicket, DecryptTicket with c's ticket keys) with tag added, and a
// ticket without tag resumes without early data.
func hookTickets(c *tls.Config, tag []byte, seen func(string)) {
	c.WrapSession = func(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
		ss.Extra = append(ss.Extra, tag)
		return c.EncryptTicket(cs, ss)
	}
	c.UnwrapSession = func(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
		ss, err := c.DecryptTicket(identity, cs)
		if err != nil || ss == nil {
			return ss, err
		}
		issuer := ticketIssuer(ss.Extra, tag)
		if issuer != IssuerThisReplica {
			ss.EarlyData = false // resume, but no 0-RTT: another replay cache saw it
		}
		if seen != nil {
			seen(issuer)
		}
		return ss, nil
	}
}

// ticketIssuer says who issued a ticket with extra, for a server whose tag
// is tag.
func ticketIssuer(extra [][]byte, tag []byte) string {
	for _, e := range extra {
		if bytes.HasPrefix(e, []byte(replicaPrefix)) {
			if bytes.Equal(e, tag) {
				return IssuerThisReplica
			}
			return IssuerOtherReplica
		}
	}
	return IssuerUnknown
}
