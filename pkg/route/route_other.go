//go:build !linux

package route

import (
	"net/netip"
	"time"
)

// Supported reports whether this platform has a route watcher.
const Supported = false

// Lookup returns ErrUnsupported on this platform.
func Lookup(netip.Addr) (Path, error) { return Path{}, ErrUnsupported }

// Watcher is not available on this platform.
type Watcher struct{}

// NewWatcher returns ErrUnsupported on this platform.
func NewWatcher() (*Watcher, error) { return nil, ErrUnsupported }

// Wait returns ErrUnsupported.
func (*Watcher) Wait(time.Duration, time.Duration) (time.Time, error) {
	return time.Time{}, ErrUnsupported
}

// Close does nothing.
func (*Watcher) Close() error { return nil }
