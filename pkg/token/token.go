package token

import (
	"context"
	"errors"
	"net"
	"net/netip"
)

// MaxTokenLen is the longest token accepted by sources and parsers, in bytes.
const MaxTokenLen = 1024

var (
	// ErrUnknownPlugin is returned by NewSource and NewParser for an unknown
	// plugin name or parser key.
	ErrUnknownPlugin = errors.New("unknown token plugin")
	// ErrNoToken is returned by a Source when it has no token for a client
	// (no matching File entry, or an Http response without a token).
	ErrNoToken = errors.New("no token")
	// ErrTokenTooLong is returned when a token is longer than MaxTokenLen.
	ErrTokenTooLong = errors.New("token too long")
	// ErrInvalidToken is returned by a Parser for a token that does not
	// decode to a valid endpoint.
	ErrInvalidToken = errors.New("invalid token")
	// ErrBadResponse is returned by the Http source for a non-200 status, a
	// body over 64 KiB, or a body that is not the expected JSON.
	ErrBadResponse = errors.New("bad token service response")
	// ErrBadSource is returned by NewSource when the source argument is
	// unusable (empty fixed token, malformed token file, bad URL).
	ErrBadSource = errors.New("bad token source")
)

// Source chooses the destination token the client sends for a local
// connection. Implementations are safe for concurrent use.
type Source interface {
	// Token returns the token for a local connection accepted from
	// clientAddr (which may be a *net.UnixAddr without an IP).
	Token(ctx context.Context, clientAddr net.Addr) (string, error)
}

// clientIP extracts the IP of a client address, unmapped; ok is false when
// the address carries no IP (e.g. a unix socket peer).
func clientIP(a net.Addr) (netip.Addr, bool) {
	if a == nil {
		return netip.Addr{}, false
	}
	switch v := a.(type) {
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(v.IP)
		return ip.Unmap(), ok
	case *net.UDPAddr:
		ip, ok := netip.AddrFromSlice(v.IP)
		return ip.Unmap(), ok
	case *net.IPAddr:
		ip, ok := netip.AddrFromSlice(v.IP)
		return ip.Unmap(), ok
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if ip, err := netip.ParseAddr(a.String()); err == nil {
		return ip.Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}
