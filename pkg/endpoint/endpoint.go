package endpoint

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
)

// Networks understood by Parse.
const (
	// NetworkTCP is the network of a "tcp:HOST:PORT" endpoint.
	NetworkTCP = "tcp"
	// NetworkUnix is the network of a "unix:/abs/path" endpoint.
	NetworkUnix = "unix"
	// NetworkUDP is the network of a "udp:HOST:PORT" endpoint (a UDP flow).
	NetworkUDP = "udp"
)

// MaxLen is the longest endpoint string Parse accepts, in bytes.
const MaxLen = 512

// maxHostLen is the longest DNS name accepted (RFC 1035, without the root dot).
const maxHostLen = 253

// ErrInvalidEndpoint is returned (wrapped, with the offending input) by Parse
// when a string is not a valid "tcp:HOST:PORT", "udp:HOST:PORT" or "unix:/path" endpoint.
var ErrInvalidEndpoint = errors.New("invalid endpoint")

// Endpoint is a destination the server can dial. The zero value is not a
// valid endpoint. Endpoints returned by Parse are normalised: host names are
// lower case, IP addresses are in canonical form, and unix paths are cleaned,
// so two Endpoints naming the same destination compare equal with ==.
type Endpoint struct {
	// Network is NetworkTCP, NetworkUDP or NetworkUnix.
	Network string
	// Address is "host:port" (IPv6 literals in brackets) for tcp and udp, or an
	// absolute, cleaned path for unix.
	Address string
}

// String returns the endpoint as "network:address"; Parse(e.String()) == e
// for every e returned by Parse.
func (e Endpoint) String() string {
	return e.Network + ":" + e.Address
}

// Parse parses "tcp:HOST:PORT" or "udp:HOST:PORT" (HOST is a DNS name, an
// IPv4 address or a bracketed IPv6 address such as "[::1]") or
// "unix:/absolute/path". The port
// must be in 1-65535; unix paths must be absolute and are cleaned. Errors wrap
// ErrInvalidEndpoint.
func Parse(s string) (Endpoint, error) {
	if len(s) > MaxLen {
		return Endpoint{}, fmt.Errorf("%w: longer than %d bytes", ErrInvalidEndpoint, MaxLen)
	}
	network, rest, ok := strings.Cut(s, ":")
	if !ok {
		return Endpoint{}, fmt.Errorf("%w %q: missing network prefix (tcp:, udp: or unix:)", ErrInvalidEndpoint, s)
	}
	switch network {
	case NetworkTCP, NetworkUDP:
		host, port, err := splitHostPort(rest)
		if err != nil {
			return Endpoint{}, fmt.Errorf("%w %q: %w", ErrInvalidEndpoint, s, err)
		}
		return Endpoint{Network: network, Address: net.JoinHostPort(host, strconv.Itoa(int(port)))}, nil
	case NetworkUnix:
		p, err := cleanUnixPath(rest)
		if err != nil {
			return Endpoint{}, fmt.Errorf("%w %q: %w", ErrInvalidEndpoint, s, err)
		}
		return Endpoint{Network: NetworkUnix, Address: p}, nil
	default:
		return Endpoint{}, fmt.Errorf("%w %q: unknown network %q (want tcp, udp or unix)", ErrInvalidEndpoint, s, network)
	}
}

// splitHostPort splits and validates "host:port", returning the normalised
// host (canonical IP or lower-case name, without brackets) and the port.
func splitHostPort(hp string) (string, uint16, error) {
	host, portStr, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := parsePort(portStr)
	if err != nil {
		return "", 0, err
	}
	h, err := normaliseHost(host)
	if err != nil {
		return "", 0, err
	}
	return h, port, nil
}

// parsePort parses a decimal port in 1-65535 without sign or leading zeros.
func parsePort(s string) (uint16, error) {
	if s == "" || len(s) > 5 || s[0] < '1' || s[0] > '9' {
		return 0, fmt.Errorf("bad port %q (want 1-65535)", s)
	}
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("bad port %q (want 1-65535)", s)
	}
	return uint16(n), nil
}

// normaliseHost returns the canonical form of an IP literal, or the
// lower-cased form of a valid DNS name.
func normaliseHost(host string) (string, error) {
	if host == "" {
		return "", errors.New("empty host")
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return "", fmt.Errorf("zoned address %q not supported", host)
		}
		var buf [64]byte // no allocation when host is canonical already (the usual case)
		if canon := ip.AppendTo(buf[:0]); string(canon) != host {
			return string(canon), nil
		}
		return host, nil
	}
	if strings.ContainsAny(host, ":%") {
		return "", fmt.Errorf("bad IP address %q", host)
	}
	if err := validHostname(host); err != nil {
		return "", err
	}
	return strings.ToLower(host), nil
}

// validHostname checks RFC 1123 host-name syntax (letters, digits, '-' and
// '_' in labels of 1-63 bytes). A name whose last label is numeric or starts
// with "0x" is refused, because some resolvers parse such names as IPv4
// addresses in odd notations ("0x7f.1", "2130706433").
func validHostname(h string) error {
	if len(h) > maxHostLen {
		return fmt.Errorf("host name longer than %d bytes", maxHostLen)
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("bad host name %q: empty or too long label", h)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("bad host name %q: label starts or ends with '-'", h)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("bad host name %q: invalid character %q", h, c)
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.HasPrefix(strings.ToLower(last), "0x") || strings.Trim(last, "0123456789") == "" {
		return fmt.Errorf("bad host name %q: numeric top-level label (not a valid IP address either)", h)
	}
	return nil
}

// cleanUnixPath checks that p is an absolute path without NUL bytes and
// returns it cleaned.
func cleanUnixPath(p string) (string, error) {
	if p == "" {
		return "", errors.New("empty path")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errors.New("path contains a NUL byte")
	}
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("path %q is not absolute", p)
	}
	return filepath.Clean(p), nil
}
