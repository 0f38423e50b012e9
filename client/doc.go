// Package client implements quictun-client: it accepts local TCP and UNIX
// connections and carries each one as a stream over one long-lived QUIC
// connection to a quictun server.
//
// One supervisor goroutine owns the QUIC connection: it dials, waits for the
// connection to end, and redials with capped exponential backoff and jitter,
// forever, until the client is stopped. Connection handlers read the current
// connection; a local connection accepted while none is up waits for one, for a
// bounded time. A stream's header and the application's first bytes are sent
// without waiting for the server's reply.
package client
