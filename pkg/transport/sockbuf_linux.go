package transport

import (
	"net"

	"golang.org/x/sys/unix"
)

// ForceSocketBuffers sets c's receive and send buffers to size, past
// net.core.rmem_max/wmem_max when the process has CAP_NET_ADMIN (as quic-go
// does for sockets it manages directly; it cannot for a wrapped socket).
func ForceSocketBuffers(c *net.UDPConn, size int) {
	rc, err := c.SyscallConn()
	if err == nil {
		_ = rc.Control(func(fd uintptr) {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size) != nil {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, size)
			}
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, size) != nil {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, size)
			}
		})
	}
}
