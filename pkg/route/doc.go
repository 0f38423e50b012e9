// Package route asks the kernel which way packets to a destination leave the
// host (the source address and interface of its route), and watches the
// routing table, addresses and links for changes, so a client can move its
// QUIC connection to a new path before the old one goes dark. Only Linux
// (rtnetlink, through golang.org/x/sys/unix) is supported; elsewhere Lookup
// and NewWatcher return ErrUnsupported.
package route
