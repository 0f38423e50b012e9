// Package hostcheck inspects the host for what QUIC needs: UDP socket buffer
// limits, UDP GSO, and the path MTU, and says how to fix what is off. The
// checks are Linux's (hostcheck_linux.go); elsewhere (hostcheck_other.go) one
// "platform" finding names the Linux-only features this build runs without.
package hostcheck

import (
	"errors"
	"fmt"
	"net"
)

// DesiredBufferBytes is the UDP socket buffer quic-go asks for.
const DesiredBufferBytes = 7 << 20

// Severity of a finding.
type Severity int

// Severities: OK needs nothing, Info is worth knowing but has nothing to fix
// (a feature this platform lacks), Warn costs performance, Error breaks
// something.
const (
	OK Severity = iota
	Info
	Warn
	Error
)

func (s Severity) String() string {
	return [...]string{"ok", "info", "warn", "error"}[s]
}

// Finding is one checked item.
type Finding struct {
	Check    string
	Severity Severity
	Detail   string
	Fix      string
}

// Options say what to check.
type Options struct {
	// ProcSys is the root of /proc/sys (tests point it elsewhere).
	ProcSys string
	// Remote, when set, is the peer's UDP address for the path MTU check.
	Remote string
}

// Run performs every check: the platform's (socket buffers and GSO on Linux,
// the Linux-only features missing elsewhere), then the path MTU to o.Remote.
func Run(o Options) []Finding {
	if o.ProcSys == "" {
		o.ProcSys = "/proc/sys"
	}
	out := platformChecks(o)
	if o.Remote != "" {
		out = append(out, pathMTU(o.Remote))
	}
	return out
}

// errNoRouteMTU is routeMTU's error where the OS does not report a route's MTU.
var errNoRouteMTU = errors.New("this OS does not report a route's MTU (IP_MTU is Linux's)")

// Worst returns the highest severity in fs.
func Worst(fs []Finding) Severity {
	w := OK
	for _, f := range fs {
		w = max(w, f.Severity)
	}
	return w
}

func pathMTU(remote string) Finding {
	f := Finding{Check: "path-mtu"}
	c, err := net.Dial("udp", remote)
	if err != nil {
		f.Severity, f.Detail = Error, fmt.Sprintf("no route to %s: %v", remote, err)
		f.Fix = "check --server-endpoint, DNS and routing"
		return f
	}
	defer func() { _ = c.Close() }()
	rc, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		f.Severity, f.Detail = Warn, err.Error()
		return f
	}
	var mtu int
	var serr error
	_ = rc.Control(func(fd uintptr) {
		ua, ok := c.RemoteAddr().(*net.UDPAddr)
		mtu, serr = routeMTU(fd, ok && ua.IP.To4() == nil)
	})
	if errors.Is(serr, errNoRouteMTU) {
		f.Detail = fmt.Sprintf("route to %s exists; its MTU is not checked: %v", remote, serr)
		return f
	}
	if serr != nil {
		f.Severity, f.Detail = Warn, "cannot read the path MTU: "+serr.Error()
		return f
	}
	f.Detail = fmt.Sprintf("route MTU to %s is %d", remote, mtu)
	// QUIC needs 1200-byte UDP payloads: 1228 bytes of IPv4 or 1248 of IPv6 packet.
	if mtu < 1280 {
		f.Severity = Error
		f.Fix = "QUIC needs an MTU of at least 1280 on the path; raise the interface/tunnel MTU"
	}
	return f
}
