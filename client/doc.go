// Package client implements quictun-client: it accepts local TCP and UNIX
// connections and carries each one as a stream over a long-lived QUIC (or,
// where UDP is blocked, TCP) connection to a quictun server.
//
// The client keeps a table of links: for each server, a QUIC link per
// connection slot (--connections) and a TCP link, dialed while no QUIC link
// to that server answers (fallback.go). One goroutine owns each link: it
// dials, waits for the connection to end, and redials with capped
// exponential backoff and jitter, until the client is stopped. A new local
// connection is placed in one step over the table (pick, servers.go); one
// accepted while no link is up waits for one, for a bounded time. A
// stream's header and the application's first bytes are sent without
// waiting for the server's reply.
package client
