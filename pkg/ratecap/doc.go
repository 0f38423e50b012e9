// Package ratecap enforces per-identity rate caps on a server that a client
// cannot dodge: the download cap in the server's own sender, by a
// congestion controller decorator (Controller) that paces the packets of
// all connections of one identity from one shared budget (Share), whatever
// controller runs beneath it and whatever the client's; the upload cap by
// reading that identity's streams no faster than its budget (Stream), so
// QUIC flow control holds the client back. Table keeps the caps by
// identity (and a default) and hands out each identity's shared budgets;
// a reload changes the rates of those in use.
package ratecap
