// Package usage keeps what each client identity of a server has used: bytes
// up and down, tunnels, connections and refused destinations, their current
// rates, and whether the operator suspended the identity (a kick). It is
// the server's ledger: the data path hands it per-tunnel atomic counters
// once per tunnel (Account.Track) and never calls it per byte; a
// once-a-second tick (Ledger.Run) folds those counters into per-identity
// totals and rates, off the hot path, and writes the totals atomically to a
// state file every SaveInterval, from which New reloads them after a
// restart.
//
// An identity is what a tunnel's client proved to be, as the server's
// /tunnels and audit line show it: "key=NAME" of its shared secret,
// "CN=NAME" of its client certificate, both comma-separated when it has
// both, or Anonymous without either.
package usage
