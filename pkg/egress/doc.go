// Package egress is the server's half of a tunnel after QUIC accepted a
// stream: it reads and authenticates the stream header (a Keyring of shared
// secrets, or mutual TLS done by the connection), checks freshness and replay
// (an in-memory nonce cache with a per-connection quota), asks the allow and
// deny rules (for everyone and by client identity) whether the destination
// may be reached, dials it within per-destination and overall dial limits,
// answers the client with one reply byte and splices the two until both
// directions end; one audit line closes each authenticated tunnel.
//
// The server (package server) owns what comes before: the QUIC listener,
// connection limits, the budget of streams a connection may have before it
// has authenticated (Stream.Verified frees its slot), and the drain. A stream
// goes through Handler.Serve:
//
//	QUIC stream -> header (proto.Decode, HeaderTimeout) -> Keyring.Verify
//	  -> freshness and replay -> token -> endpoint (Parser) -> rules (policy)
//	  -> dial (DialTimeout, slots) -> reply OK -> splice.Pipe -> audit line
//
// Every failure resets the stream with a proto.Code and is counted in
// quictun_server_streams_total{result}.
package egress
