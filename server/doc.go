// Package server implements quictun-server: it accepts QUIC connections from
// quictun clients, reads the header of each stream, authenticates it, checks the
// destination against the allow-list, dials it and splices the bytes both ways.
//
// The accept path never blocks on a destination: every stream is handled in its
// own goroutine, dials are bounded by a semaphore and a timeout, and headers by a
// deadline. No flags, no os.Exit: the cmd/quictun-server/app package wires it.
package server
