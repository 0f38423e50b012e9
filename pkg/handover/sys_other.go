//go:build !linux

package handover

import (
	"errors"
	"fmt"
	"os"
)

// ErrUnsupported: upgrades hand sockets over with SCM_RIGHTS on a
// SOCK_SEQPACKET pair, built for Linux only.
var errUnsupported = fmt.Errorf("handover: %w on this platform (Linux only)", errors.ErrUnsupported)

// Pair is not available here.
func Pair() (*Conn, *os.File, error) { return nil, nil, errUnsupported }

// FromEnv refuses a handover here (nil, nil: not started for one).
func FromEnv() (*Conn, error) {
	if _, ok := os.LookupEnv(EnvFD); !ok {
		return nil, nil
	}
	_ = os.Unsetenv(EnvFD)
	return nil, errUnsupported
}

func (c *Conn) send(byte, []byte, ...int) error { return errUnsupported }

func (c *Conn) recvMsg(int) (byte, []byte, []*os.File, error) { return 0, nil, nil, errUnsupported }

func rawFD(*os.File) (int, error) { return 0, errUnsupported }
