package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path"
	"strconv"
	"strings"
)

// ErrForbidden is returned (wrapped) by AllowList.Authorize when no rule
// allows the destination, or when a host name resolves to at least one
// address that no rule allows.
var ErrForbidden = errors.New("destination forbidden")

// ErrResolve is returned (wrapped) by AllowList.Authorize when a host name
// could not be resolved or resolved to no address.
var ErrResolve = errors.New("resolve destination")

// ErrInvalidRule is returned (wrapped, naming the rule) by ParseAllowList.
var ErrInvalidRule = errors.New("invalid allow rule")

// maxRuleNameLen bounds rule names, which are used as metric label values.
const maxRuleNameLen = 64

// Resolver resolves host names to IP addresses. *net.Resolver satisfies it.
type Resolver interface {
	// LookupNetIP looks up host; network is "ip", "ip4" or "ip6".
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// rule is one parsed allow-list entry.
type rule struct {
	name    string
	spec    string // the rule without its name, as given
	network string

	// tcp: exactly one of prefix (valid) and host (non-empty) is set.
	prefix         netip.Prefix
	host           string
	portLo, portHi uint16

	// unix: a path.Match pattern on the cleaned absolute path.
	pattern string
}

func (r *rule) portMatch(p uint16) bool { return p >= r.portLo && p <= r.portHi }

// AllowList is an ordered list of destination rules. The first rule that
// matches names the decision. It is immutable after construction and safe for
// concurrent use.
type AllowList struct {
	rules []rule
}

// ParseAllowList parses allow-list rules, each optionally prefixed with a name
// ("ssh=tcp:127.0.0.1:22"); unnamed rules are called "rule0", "rule1", … after
// their index. Names are used as metric label values and may contain letters,
// digits, '_', '-' and '.'. Rule forms:
//
//	tcp:127.0.0.1:22          one address, one port
//	tcp:10.0.0.0/8:5432       a CIDR prefix ("tcp:[fd00::]/8:*" or "tcp:fd00::/8:*" for IPv6)
//	tcp:10.0.0.0/8:*          any port
//	tcp:10.0.0.1:1000-2000    a port range (inclusive)
//	tcp:[::1]:*               an IPv6 address
//	tcp:db.internal:5432      an exact host name (trusted as a name, not resolved here)
//	unix:/run/app.sock        one socket
//	unix:/run/apps/*          a path.Match pattern on the cleaned path ('*' does not cross '/')
//
// A CIDR prefix must not have host bits set. An empty list allows nothing.
// Errors wrap ErrInvalidRule and name the bad rule; all bad rules are
// reported.
func ParseAllowList(rules []string) (*AllowList, error) {
	a := &AllowList{rules: make([]rule, 0, len(rules))}
	var errs []error
	for i, s := range rules {
		r, err := parseRule(i, s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		a.rules = append(a.rules, r)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return a, nil
}

// MustParseAllowList is ParseAllowList for rules known to be valid at compile
// time; it panics on error.
func MustParseAllowList(rules ...string) *AllowList {
	a, err := ParseAllowList(rules)
	if err != nil {
		panic(err)
	}
	return a
}

// DefaultAllowList allows loopback only: tcp to 127.0.0.0/8 (rule
// "loopback4") and ::1 (rule "loopback6") on any port, and no unix sockets.
func DefaultAllowList() *AllowList {
	return MustParseAllowList("loopback4=tcp:127.0.0.0/8:*", "loopback6=tcp:[::1]:*")
}

func parseRule(i int, s string) (rule, error) {
	bad := func(format string, args ...any) (rule, error) {
		return rule{}, fmt.Errorf("%w %d %q: %s", ErrInvalidRule, i, s, fmt.Sprintf(format, args...))
	}
	if len(s) > MaxLen+maxRuleNameLen+1 {
		return bad("too long")
	}
	r := rule{name: "rule" + strconv.Itoa(i)}
	spec := strings.TrimSpace(s)
	if name, rest, ok := strings.Cut(spec, "="); ok && !strings.Contains(name, ":") {
		if err := validRuleName(name); err != nil {
			return bad("%v", err)
		}
		r.name, spec = name, rest
	}
	r.spec = spec
	network, rest, ok := strings.Cut(spec, ":")
	if !ok {
		return bad("missing network prefix (tcp: or unix:)")
	}
	switch network {
	case NetworkTCP:
		r.network = NetworkTCP
		colon := strings.LastIndexByte(rest, ':')
		if colon < 0 {
			return bad("want tcp:HOST:PORT")
		}
		hostPart, portPart := rest[:colon], rest[colon+1:]
		lo, hi, err := parsePortRange(portPart)
		if err != nil {
			return bad("%v", err)
		}
		r.portLo, r.portHi = lo, hi
		if strings.HasPrefix(hostPart, "[") {
			end := strings.IndexByte(hostPart, ']')
			if end < 0 {
				return bad("missing ']'")
			}
			hostPart = hostPart[1:end] + hostPart[end+1:]
		}
		switch {
		case hostPart == "":
			return bad("empty host")
		case strings.Contains(hostPart, "/"):
			p, err := netip.ParsePrefix(hostPart)
			if err != nil {
				return bad("%v", err)
			}
			if p != p.Masked() {
				return bad("prefix %s has host bits set (did you mean %s?)", p, p.Masked())
			}
			if p.Addr().Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			r.prefix = p
		default:
			if ip, err := netip.ParseAddr(hostPart); err == nil {
				if ip.Zone() != "" {
					return bad("zoned address not supported")
				}
				ip = ip.Unmap()
				r.prefix = netip.PrefixFrom(ip, ip.BitLen())
				break
			}
			if strings.ContainsAny(hostPart, ":%") {
				return bad("bad IP address %q", hostPart)
			}
			if err := validHostname(hostPart); err != nil {
				return bad("%v", err)
			}
			r.host = strings.ToLower(hostPart)
		}
	case NetworkUnix:
		r.network = NetworkUnix
		p, err := cleanUnixPath(rest)
		if err != nil {
			return bad("%v", err)
		}
		if _, err := path.Match(p, ""); err != nil {
			return bad("pattern %q: %v", p, err)
		}
		r.pattern = p
	default:
		return bad("unknown network %q (want tcp or unix)", network)
	}
	return r, nil
}

func validRuleName(n string) error {
	if n == "" || len(n) > maxRuleNameLen {
		return fmt.Errorf("rule name must be 1-%d bytes", maxRuleNameLen)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("rule name %q: invalid character %q", n, c)
		}
	}
	return nil
}

// parsePortRange parses "*", "N" or "N-M".
func parsePortRange(s string) (uint16, uint16, error) {
	if s == "*" {
		return 1, 65535, nil
	}
	if a, b, ok := strings.Cut(s, "-"); ok {
		lo, err := parsePort(a)
		if err != nil {
			return 0, 0, err
		}
		hi, err := parsePort(b)
		if err != nil {
			return 0, 0, err
		}
		if lo > hi {
			return 0, 0, fmt.Errorf("empty port range %q", s)
		}
		return lo, hi, nil
	}
	p, err := parsePort(s)
	return p, p, err
}

// Rules returns the rules as "name=spec", in order, e.g. for logging the
// effective configuration.
func (a *AllowList) Rules() []string {
	out := make([]string, len(a.rules))
	for i := range a.rules {
		out[i] = a.rules[i].name + "=" + a.rules[i].spec
	}
	return out
}

// Names returns the rule names in order (possibly with duplicates), e.g. to
// pre-create metric label values.
func (a *AllowList) Names() []string {
	out := make([]string, len(a.rules))
	for i := range a.rules {
		out[i] = a.rules[i].name
	}
	return out
}

// Authorize decides whether dest may be dialed, and returns what to dial and
// the name of the deciding rule.
//
// For tcp to an IP literal, the address (unmapped if it is IPv4-mapped IPv6)
// is matched against the CIDR rules and dial is that address. For tcp to a
// host name, an exact host-name rule allows it as is (dial == dest); otherwise
// the name is resolved with r (nil means net.DefaultResolver), EVERY resolved
// address must match a rule, and dial is the first resolved address with
// dest's port, so the dialer cannot resolve the name again to something else
// (DNS rebinding). The name is not resolved when no CIDR rule covers the
// port. For unix, the path must be absolute; it is cleaned and matched against
// the patterns (symbolic links are not resolved).
//
// Errors wrap ErrForbidden (refused, including an invalid dest) or ErrResolve
// (lookup failed; the destination is refused too).
func (a *AllowList) Authorize(ctx context.Context, r Resolver, dest Endpoint) (dial Endpoint, rule string, err error) {
	d, err := Parse(dest.String())
	if err != nil {
		return Endpoint{}, "", fmt.Errorf("%w: %w", ErrForbidden, err)
	}
	if d.Network == NetworkUnix {
		for i := range a.rules {
			ru := &a.rules[i]
			if ru.network != NetworkUnix {
				continue
			}
			if ok, _ := path.Match(ru.pattern, d.Address); ok {
				return d, ru.name, nil
			}
		}
		return Endpoint{}, "", fmt.Errorf("%w: %s", ErrForbidden, d)
	}

	host, portStr, err := net.SplitHostPort(d.Address)
	if err != nil { // unreachable: Parse normalised the address
		return Endpoint{}, "", fmt.Errorf("%w: %w", ErrForbidden, err)
	}
	port, err := parsePort(portStr)
	if err != nil { // unreachable, as above
		return Endpoint{}, "", fmt.Errorf("%w: %w", ErrForbidden, err)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap()
		name, ok := a.matchIP(ip, port)
		if !ok {
			return Endpoint{}, "", fmt.Errorf("%w: %s", ErrForbidden, d)
		}
		return tcpEndpoint(ip, port), name, nil
	}

	for i := range a.rules {
		ru := &a.rules[i]
		if ru.network == NetworkTCP && ru.host == host && ru.portMatch(port) {
			return d, ru.name, nil
		}
	}
	if !a.anyPrefixForPort(port) {
		return Endpoint{}, "", fmt.Errorf("%w: %s", ErrForbidden, d)
	}
	if r == nil {
		r = net.DefaultResolver
	}
	ips, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return Endpoint{}, "", fmt.Errorf("%w %s: %w", ErrResolve, host, err)
	}
	if len(ips) == 0 {
		return Endpoint{}, "", fmt.Errorf("%w %s: no addresses", ErrResolve, host)
	}
	var firstName string
	for i, ip := range ips {
		ip = ip.Unmap().WithZone("")
		name, ok := a.matchIP(ip, port)
		if !ok {
			return Endpoint{}, "", fmt.Errorf("%w: %s resolves to %s", ErrForbidden, d, ip)
		}
		if i == 0 {
			firstName = name
		}
	}
	return tcpEndpoint(ips[0].Unmap().WithZone(""), port), firstName, nil
}

// matchIP returns the name of the first CIDR rule matching ip and port.
func (a *AllowList) matchIP(ip netip.Addr, port uint16) (string, bool) {
	for i := range a.rules {
		ru := &a.rules[i]
		if ru.network == NetworkTCP && ru.prefix.IsValid() && ru.portMatch(port) && ru.prefix.Contains(ip) {
			return ru.name, true
		}
	}
	return "", false
}

func (a *AllowList) anyPrefixForPort(port uint16) bool {
	for i := range a.rules {
		ru := &a.rules[i]
		if ru.network == NetworkTCP && ru.prefix.IsValid() && ru.portMatch(port) {
			return true
		}
	}
	return false
}

func tcpEndpoint(ip netip.Addr, port uint16) Endpoint {
	return Endpoint{Network: NetworkTCP, Address: netip.AddrPortFrom(ip, port).String()}
}
