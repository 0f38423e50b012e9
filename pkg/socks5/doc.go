// Package socks5 is the server side of the SOCKS version 5 handshake
// (RFC 1928) with username/password authentication (RFC 1929), and the UDP
// request header of UDP ASSOCIATE: what a local SOCKS entry point needs to
// learn the destination an application asks for and to answer it.
//
// It only encodes and decodes; it never dials. The caller reads the greeting
// and request, decides (quictun sends the destination to its server, whose
// allow-list has the last word) and writes one reply:
//
//	method, err := socks5.Negotiate(rw, auth) // greeting, method choice, RFC 1929 sub-negotiation
//	req, err := socks5.ReadRequest(r)           // CONNECT / UDP ASSOCIATE and the destination
//	err = socks5.WriteReply(w, socks5.ReplyNotAllowed, nil)
//
// Every read is bounded by the protocol's own length fields (at most 255
// bytes per field, 262 bytes per request), so a peer cannot make it allocate
// more; malformed input returns an error wrapping ErrProtocol, and the caller
// closes the connection (after a reply when the request itself was readable).
//
// Why not a library: the module proxy this project builds from offers only
// github.com/armon/go-socks5 (2016, unmaintained, no UDP ASSOCIATE, and it
// owns the dial, which must here go through the tunnel). This package has the
// standard library as its only import and is fuzzed (FuzzReadRequest,
// FuzzParseUDP).
package socks5
