// Package proto defines the quictun wire protocol carried on each QUIC stream.
//
// A tunnel is one bidirectional QUIC stream. The client writes a Header as the
// very first bytes of the stream and then, without waiting for anything, the
// application's bytes. The server answers with a one-byte Reply (CodeOK) once it
// has dialed the destination, followed by the destination's bytes. Every failure
// is reported by resetting the stream (RESET_STREAM and STOP_SENDING) with a Code
// as the application error code, never as a Go error string.
//
// Header layout (version 1), all integers big-endian:
//
//	offset size  field
//	0      1     version (1)
//	1      1     flags (bit 0: MAC present, bit 1: key ID present, bit 2: kind present,
//	             bit 3: resume ID present)
//	2      8     unix time in seconds when the header was made
//	10     16    nonce, random, single use
//	26     2     token length n (1..MaxTokenLen)
//	28     n     token (names the destination, e.g. "tcp:127.0.0.1:22")
//	28+n   4     key ID (KeyIDOf the secret) when flag bit 1 is set
//	..     1     kind (2 UDP flow, 3 reverse bind, 4 hello, 5 check, 6 resume) when
//	             flag bit 2 is set; without it the stream is TCP (kind 1, never written)
//	..     16    resume ID, random, when flag bit 3 is set (a resumable tunnel)
//	..     32    HMAC-SHA256(secret, every byte before it) when flag bit 0 is set
//
// The MAC authenticates the client with a shared secret without an extra round
// trip; the nonce and timestamp let the server reject replays of 0-RTT data and
// stale or reused headers on every stream (a header more than the server's
// replay window, 2 minutes, away from its clock is refused with CodeReplay).
//
// The key ID lets a server hold several secrets (a Keyring) and pick the one
// a header was made with, so secrets rotate without downtime and each names
// its holders in logs and rules. Compatibility: clients write a key ID with
// every MAC; servers accept headers with and without one (trying each key,
// the first MaxLegacyKeys only, for the latter, as sent by clients from before key IDs). A
// server from before key IDs refuses the unknown flag bit with bad_header
// rather than misreading the header: upgrade servers before clients. The
// same holds for the kind: a TCP stream carries none, so TCP tunnels work
// with any server that knows key IDs; a server that does not know a kind
// (or the kind flag) refuses the stream (CodeUnsupported, or bad_header from
// older servers) instead of treating a UDP flow as TCP.
//
// The hello (KindHello, token HelloToken) is the first stream a client with a
// shared secret opens on every new connection, at once (as 0-RTT data when
// resuming) and without waiting for its answer: it proves the secret before
// any tunnel, so the server can close connections that prove nothing within
// its --auth-timeout of the handshake, and the client learns at once whether
// its credentials are accepted. The client ends the stream after the header;
// the server checks it as any header (MAC, freshness, replay) and answers
// CodeOK and ends the stream, or resets it with the code of the failure
// (auth_failed also closes the connection). A hello is no tunnel: it is not
// dialed, audited, listed in /tunnels or counted in streams_total.
// Compatibility: a server that knows kinds but not the hello verifies the MAC
// before it looks at the kind, so it marks the connection authenticated and
// answers CodeUnsupported (and counts and audits that stream as refused);
// the client takes that as "credentials accepted". A server from before kinds
// answers bad_header, which tells nothing: the client then behaves as before
// the hello. A client from before the hello sends none: a new server then
// closes such a connection with CodeTimeout if it has presented no valid
// header within --idle-auth-timeout of its handshake (the client reconnects).
//
// The check (KindCheck, the token a destination) asks whether the server's
// rules admit that destination for this client, without dialing it: a client
// sends one per fixed destination (its forwards, a Fixed token source) on
// each new connection, after the handshake, so a forward that can never work
// is reported when the client connects rather than at its first use. The
// server checks the header as a tunnel's (MAC, freshness, the rules,
// resolving a name as for a tunnel, then replay), and answers CodeOK and
// ends the stream, or resets it with CodeRefused. A check is no tunnel: it
// is not dialed, audited, listed or counted in streams_total; a refusal is
// logged and counted in refused_destinations_total as a tunnel's is, takes
// no place in the replay cache and does not verify the connection.
// Compatibility: a server from before
// the check answers CodeUnsupported (and counts and audits that stream as
// refused) or bad_header; the client then stops checking on that connection.
//
// A server shutting down closes its connections with CodeShutdown and a
// reason that may ask its clients to spread their reconnects over a time
// (shutdown.go).
//
// Reverse forwards (KindReverse, and the streams the server opens toward the
// client for them) are described in bind.go.
//
// Resumable tunnels (--resume-window, pkg/resume): a client asks for one with
// a resume ID in the tunnel's header (flag bit 3, covered by the MAC); nothing
// else changes on the stream. Each end confirms the bytes it received with
// QUIC datagrams of type 'R' (pairs of resume ID and offset, pkg/resume
// AppendAcks). After a lost connection the client opens a stream of
// KindResume whose token is "resume/1/<ID in hex>/<bytes received>"; the
// server checks it as any header (MAC, freshness, replay) and that the
// identity that opened the tunnel sent it, and answers CodeOK followed by
// the 8-byte count of bytes it received, or resets it with
// CodeResumeRefused; both ends then resend from the other's count and go on.
// A client whose bytes the server had all confirmed (acks) before the loss
// knows that count: it may send its bytes right after the request, without
// waiting for the reply, and read the reply first; a reply with another
// count ends the tunnel (reset both ways). Servers are unchanged by this: the
// bytes after a resume request's header always start at the count it replies.
// A running tunnel's stream reset with CodeResumeRefused means the peer moved
// the tunnel to another stream (it is parked, not ended). Compatibility: a
// server from before resumable tunnels refuses the flag with bad_header, so
// a client sets it only with --resume-window (upgrade servers first); a
// server with --resume-window 0 opens a plain tunnel and refuses resume
// requests.
package proto
