package route

import (
	"errors"
	"net/netip"
)

// ErrUnsupported is returned on platforms without a route watcher.
var ErrUnsupported = errors.New("route watching is supported only on Linux")

// Path is the kernel's choice for packets to a destination: the source
// address it gives them and the interface they leave by. The zero Path means
// no route.
type Path struct {
	Source    netip.Addr
	Interface int // interface index
}

// Valid reports whether p names a route.
func (p Path) Valid() bool { return p.Source.IsValid() }

func (p Path) String() string {
	if !p.Valid() {
		return "no route"
	}
	return p.Source.String()
}
