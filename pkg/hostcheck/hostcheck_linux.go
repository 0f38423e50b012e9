package hostcheck

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// BufferCheck says whether Run checks the UDP socket buffer limits (and so
// replaces quic-go's own warning about them): only on Linux.
const BufferCheck = true

func platformChecks(o Options) []Finding {
	return []Finding{buffers(o.ProcSys), gso()}
}

// routeMTU reads the MTU of the route a connected UDP socket uses.
func routeMTU(fd uintptr, ipv6 bool) (int, error) {
	if ipv6 {
		return unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU)
	}
	return unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU)
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

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
