package cli

import (
	"fmt"
	"net"
	"os"
)

// SdNotify sends state to systemd's notification socket ($NOTIFY_SOCKET,
// for Type=notify units: "READY=1", "MAINPID=N"); without one it does
// nothing. The protocol is one datagram of newline-separated assignments
// (sd_notify(3)).
func SdNotify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] == '@' {
		path = "\x00" + path[1:] // an abstract socket
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	return nil
}
