//go:build !linux

package transport

import "net"

// ForceSocketBuffers asks for receive and send buffers of size on c; only
// Linux can force them past the system's limit (SO_RCVBUFFORCE), so here the
// system may grant less (hostcheck's "platform" finding says so at start).
func ForceSocketBuffers(c *net.UDPConn, size int) {
	_ = c.SetReadBuffer(size)
	_ = c.SetWriteBuffer(size)
}
