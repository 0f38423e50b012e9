// Package lograte decides which of many similar events are logged at the
// default level (-v 0): the first of each kind, then at most one per kind per
// interval, with the number left out in between. An operator sees every
// distinct problem (a refused destination, a client with a wrong secret) at
// once, and a client repeating it cannot flood the log.
//
// The package imports only the standard library.
package lograte
