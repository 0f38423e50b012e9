//go:build !linux || !(amd64 || arm64)

package rawsock

import "net"

// Wrap returns c: the raw system calls are Linux (amd64, arm64) only.
func Wrap(c *net.UDPConn) net.PacketConn { return c }

// UDPConn is the raw socket's type, which Wrap never returns here; it is
// declared so that code asking for one builds on every platform.
type UDPConn struct {
	*net.UDPConn
}
