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
//	1      1     flags (bit 0: MAC present, bit 1: key ID present, bit 2: kind present)
//	2      8     unix time in seconds when the header was made
//	10     16    nonce, random, single use
//	26     2     token length n (1..MaxTokenLen)
//	28     n     token (names the destination, e.g. "tcp:127.0.0.1:22")
//	28+n   4     key ID (KeyIDOf the secret) when flag bit 1 is set
//	..     1     kind (2 UDP flow, 3 reserved: reverse bind) when flag bit 2 is set;
//	             without it the stream is TCP (kind 1, never written)
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
// at most MaxKeys, for the latter, as sent by clients from before key IDs). A
// server from before key IDs refuses the unknown flag bit with bad_header
// rather than misreading the header: upgrade servers before clients. The
// same holds for the kind: a TCP stream carries none, so TCP tunnels work
// with any server that knows key IDs; a server that does not know a kind
// (or the kind flag) refuses the stream (CodeUnsupported, or bad_header from
// older servers) instead of treating a UDP flow as TCP.
package proto
