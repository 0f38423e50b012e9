// Package hostcheck inspects the host for what QUIC needs: UDP socket buffer
// limits, UDP GSO, and the path MTU, and says how to fix what is off.
package hostcheck

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DesiredBufferBytes is the UDP socket buffer quic-go asks for.
const DesiredBufferBytes = 7 << 20

// Severity of a finding.
type Severity int

// Severities: OK needs nothing, Warn costs performance, Error breaks something.
const (
	OK Severity = iota
	Warn
	Error
)

func (s Severity) String() string {
	return [...]string{"ok", "warn", "error"}[s]
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

// Run performs every check.
func Run(o Options) []Finding {
	if o.ProcSys == "" {
		o.ProcSys = "/proc/sys"
	}
	out := []Finding{buffers(o.ProcSys), gso()}
	if o.Remote != "" {
		out = append(out, pathMTU(o.Remote))
	}
	return out
}

// Worst returns the highest severity in fs.
func Worst(fs []Finding) Severity {
	w := OK
	for _, f := range fs {
		w = max(w, f.Severity)
	}
	return w
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func buffers(procSys string) Finding {
	f := Finding{Check: "udp-buffers"}
	rmem, err1 := readInt(procSys + "/net/core/rmem_max")
	wmem, err2 := readInt(procSys + "/net/core/wmem_max")
	if err1 != nil || err2 != nil {
		f.Severity, f.Detail = Warn, "cannot read net.core.rmem_max/wmem_max"
		return f
	}
	f.Detail = fmt.Sprintf("net.core.rmem_max=%d net.core.wmem_max=%d (QUIC wants %d)", rmem, wmem, DesiredBufferBytes)
	if rmem >= DesiredBufferBytes && wmem >= DesiredBufferBytes {
		return f
	}
	if hasNetAdmin() {
		f.Detail += "; running with CAP_NET_ADMIN, so quic-go raises its own buffers (SO_RCVBUFFORCE)"
		return f
	}
	f.Severity = Warn
	f.Fix = "sysctl -w net.core.rmem_max=7500000 net.core.wmem_max=7500000 (persist in /etc/sysctl.d/60-quictun.conf)"
	return f
}

// hasNetAdmin reports whether the process has CAP_NET_ADMIN in its effective set.
func hasNetAdmin() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<unix.CAP_NET_ADMIN) != 0
		}
	}
	return false
}

func gso() Finding {
	f := Finding{Check: "udp-gso"}
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		f.Severity, f.Detail = Warn, "cannot open a UDP socket: "+err.Error()
		return f
	}
	defer func() { _ = c.Close() }()
	rc, err := c.SyscallConn()
	if err != nil {
		f.Severity, f.Detail = Warn, err.Error()
		return f
	}
	var serr error
	_ = rc.Control(func(fd uintptr) {
		_, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT)
	})
	if serr != nil {
		f.Severity = Warn
		f.Detail = "UDP GSO not available: " + serr.Error()
		f.Fix = "use a Linux kernel >= 5.0; without GSO, bulk throughput is about half"
		return f
	}
	if os.Getenv("QUIC_GO_DISABLE_GSO") == "true" {
		f.Severity, f.Detail = Warn, "GSO available but disabled by QUIC_GO_DISABLE_GSO=true"
		return f
	}
	f.Detail = "UDP GSO available"
	return f
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
		if ua, ok := c.RemoteAddr().(*net.UDPAddr); ok && ua.IP.To4() == nil {
			mtu, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU)
		} else {
			mtu, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU)
		}
	})
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
