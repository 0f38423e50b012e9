//go:build !windows

package client

import (
	"runtime"
	"syscall"
)

// transientSendErrors are what sendmsg returns when the network cannot take a
// datagram right now rather than because the socket is broken: no route (the
// host's address was removed and its routes with it, as in a renumbering), the
// source address is gone, the interface is down, a full device queue, a
// firewall rule.
//
// On Linux also what a route that discards answers: EINVAL for a blackhole
// route, EACCES for a prohibit one (an unreachable route gives EHOSTUNREACH),
// as a VPN's kill switch or a routing daemon may install while a path
// changes; before, the first such send ended the connection and every tunnel
// in it. Seen in a network namespace (kernel 6.18, IPv4 and IPv6, bound and
// wildcard sockets), where a GSO segment larger than the MTU got EMSGSIZE
// (quic-go's loss) and a bound socket whose IPv4 address was removed got
// ENETUNREACH. The cost: a server address that is a broadcast address (EACCES)
// fails at the handshake timeout instead of at once. Elsewhere a blackhole
// route drops without an error, and EINVAL means a bad call.
var transientSendErrors = func() []error {
	errs := []error{
		syscall.ENETUNREACH, syscall.EHOSTUNREACH, syscall.EADDRNOTAVAIL,
		syscall.ENETDOWN, syscall.EHOSTDOWN, syscall.ENOBUFS, syscall.EPERM,
	}
	if runtime.GOOS == "linux" {
		errs = append(errs, syscall.EINVAL, syscall.EACCES)
	}
	return errs
}()
