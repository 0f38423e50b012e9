//go:build !windows

package client

import "syscall"

// transientSendErrors are what sendmsg returns when the network cannot take a
// datagram right now rather than because the socket is broken: no route (the
// host's address was removed and its routes with it, as in a renumbering), the
// source address is gone, the interface is down, a full device queue, a
// firewall rule.
var transientSendErrors = []error{
	syscall.ENETUNREACH, syscall.EHOSTUNREACH, syscall.EADDRNOTAVAIL,
	syscall.ENETDOWN, syscall.EHOSTDOWN, syscall.ENOBUFS, syscall.EPERM,
}
