package endpoint

import (
	"fmt"
	"net"
	"net/netip"
	"path"
)

// AuthorizeListen reports whether the rules admit listening at ep (a
// reverse forward: the server listens on behalf of a client), and names the
// rule that does. A tcp: or udp: address must be an IP address (a name
// would bind whatever it resolves to), which a prefix rule of its network
// must match with the port; 0.0.0.0 and :: are matched as themselves
// (tcp:0.0.0.0:8022 admits listening on every IPv4 address at 8022,
// tcp:127.0.0.1:8000-8100 only loopback). A unix: path must match a path
// rule. Deny rules win. Nothing is reserved here, unlike Authorize: the
// rules name exactly what a client may bind, and an empty list admits
// nothing. Errors wrap ErrForbidden (ErrDenied for a deny rule).
func (a *AllowList) AuthorizeListen(ep Endpoint) (string, error) {
	if ep.Network == NetworkUnix {
		for i := range a.deny {
			if ru := &a.deny[i]; ru.network == NetworkUnix {
				if ok, _ := path.Match(ru.pattern, ep.Address); ok {
					return "", fmt.Errorf("%w %s: %s", ErrDenied, ru.name, ep)
				}
			}
		}
		for i := range a.rules {
			if ru := &a.rules[i]; ru.network == NetworkUnix {
				if ok, _ := path.Match(ru.pattern, ep.Address); ok {
					return ru.name, nil
				}
			}
		}
		return "", fmt.Errorf("%w: no rule allows listening at %s", ErrForbidden, ep)
	}
	host, portStr, err := net.SplitHostPort(ep.Address)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrForbidden, err)
	}
	port, err := parsePort(portStr)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrForbidden, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return "", fmt.Errorf("%w: listen at an IP address, not the name %q", ErrForbidden, host)
	}
	ip = ip.Unmap().WithZone("")
	for i := range a.deny {
		ru := &a.deny[i]
		if ru.network == ep.Network && ru.prefix.IsValid() && ru.portMatch(port) && ru.prefix.Contains(ip) {
			return "", fmt.Errorf("%w %s: %s", ErrDenied, ru.name, ep)
		}
	}
	if name, ok := a.matchIP(ep.Network, ip, port); ok {
		return name, nil
	}
	return "", fmt.Errorf("%w: no rule allows listening at %s", ErrForbidden, ep)
}
