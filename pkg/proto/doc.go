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
//	1      1     flags (bit 0: MAC present)
//	2      8     unix time in seconds when the header was made
//	10     16    nonce, random, single use
//	26     2     token length n (1..MaxTokenLen)
//	28     n     token (names the destination, e.g. "tcp:127.0.0.1:22")
//	28+n   32    HMAC-SHA256(secret, bytes 0..28+n) when flag bit 0 is set
//
// The MAC authenticates the client with a shared secret without an extra round
// trip; the nonce and timestamp let the server reject replays of 0-RTT data and
// stale or reused headers on every stream (a header more than the server's
// replay window, 2 minutes, away from its clock is refused with CodeReplay).
package proto
