//go:build !linux || !(amd64 || arm64)

package rawsock

import "net"

// Wrap returns c: the raw system calls are Linux (amd64, arm64) only.
func Wrap(c *net.UDPConn) net.PacketConn { return c }
