package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
)

// ErrForbidden is returned (wrapped) by AllowList.Authorize and
// AllowList.CheckDial for every refused destination: when no rule allows it,
// when a host name resolves to at least one address that is not allowed, and
// (through the errors below, which all wrap it) for denied, reserved, own or
// unresolvable destinations. RefusalReason names which.
var ErrForbidden = errors.New("destination forbidden")

// ErrResolve is returned (wrapped) by AllowList.Authorize when a host name
// could not be resolved or resolved to no address. It wraps ErrForbidden: a
// name that does not resolve is refused like a forbidden one, so a client
// cannot tell an internal name that exists from one that does not.
var ErrResolve = fmt.Errorf("%w: resolve destination", ErrForbidden)

// ErrDenied is returned (wrapped) when a deny rule matches the destination
// or one of its addresses. Deny rules win over allow rules.
var ErrDenied = fmt.Errorf("%w by a deny rule", ErrForbidden)

// ErrReserved is returned (wrapped) for addresses no rule can allow (the
// unspecified addresses 0.0.0.0/8 and ::, which reach the server host itself)
// and for cloud metadata addresses (see MetadataAddrs), multicast addresses
// (224.0.0.0/4, ff00::/8) and the limited broadcast address 255.255.255.255
// that no allow rule names exactly. NAT64 forms (64:ff9b::/96) of these
// addresses are refused too.
var ErrReserved = fmt.Errorf("%w: reserved address", ErrForbidden)

// ErrSelf is returned (wrapped) for an address and port the server itself
// listens on (see WithSelf), whatever the rules say.
var ErrSelf = fmt.Errorf("%w: the server's own listener", ErrForbidden)

// ErrInvalidRule is returned (wrapped, naming the rule) by ParseAllowList and
// ParseRules.
var ErrInvalidRule = errors.New("invalid rule")

// Refusal reasons, as returned by RefusalReason (metric label values).
const (
	ReasonNotAllowed = "not_allowed" // no allow rule matches
	ReasonDenied     = "denied"      // a deny rule matches (ErrDenied)
	ReasonReserved   = "reserved"    // unspecified, metadata, multicast or broadcast address (ErrReserved)
	ReasonSelf       = "self"        // the server's own listener (ErrSelf)
	ReasonUnresolved = "unresolved"  // the name does not resolve (ErrResolve)
)

// RefusalReasons lists every value RefusalReason returns for a refusal, e.g.
// to pre-create metric label values.
func RefusalReasons() []string {
	return []string{ReasonNotAllowed, ReasonDenied, ReasonReserved, ReasonSelf, ReasonUnresolved}
}

// RefusalReason returns why err refused a destination (one of
// RefusalReasons), or "" when err does not wrap ErrForbidden.
func RefusalReason(err error) string {
	switch {
	case errors.Is(err, ErrSelf):
		return ReasonSelf
	case errors.Is(err, ErrDenied):
		return ReasonDenied
	case errors.Is(err, ErrReserved):
		return ReasonReserved
	case errors.Is(err, ErrResolve):
		return ReasonUnresolved
	case errors.Is(err, ErrForbidden):
		return ReasonNotAllowed
	}
	return ""
}

// MetadataAddrs are the cloud instance-metadata and credential endpoints that
// a broad rule does not admit: only a rule naming the address itself
// ("tcp:169.254.169.254:80") does. AWS, GCP, Azure, OCI and others use
// 169.254.169.254 (AWS also fd00:ec2::254 over IPv6 and 169.254.170.2 for
// ECS task credentials); Alibaba Cloud uses 100.100.100.200.
func MetadataAddrs() []netip.Addr { return slices.Clone(metadataAddrs[:]) }

// metadataAddrs are MetadataAddrs, made once: every tunnel's destination is
// checked against them.
var metadataAddrs = [...]netip.Addr{
	netip.AddrFrom4([4]byte{169, 254, 169, 254}),
	netip.AddrFrom4([4]byte{169, 254, 170, 2}),
	netip.AddrFrom4([4]byte{100, 100, 100, 200}),
	netip.MustParseAddr("fd00:ec2::254"),
}

// nat64 is the NAT64 well-known prefix (RFC 6052): 64:ff9b::a9fe:a9fe reaches
// 169.254.169.254 through a NAT64 gateway.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// thisNetwork is 0.0.0.0/8: connecting to 0.0.0.0 reaches the local host.
var thisNetwork = netip.MustParsePrefix("0.0.0.0/8")

// forms returns ip and, for an address in the NAT64 prefix, the IPv4 address
// it embeds: the first n of f (an array, not a slice: every tunnel's
// destination goes through forms several times, and a slice of its own
// would be an allocation each time).
func forms(ip netip.Addr) (f [2]netip.Addr, n int) {
	f[0] = ip
	if ip.Is6() && nat64.Contains(ip) {
		b := ip.As16()
		f[1] = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
		return f, 2
	}
	return f, 1
}

func isUnspecified(ip netip.Addr) bool {
	fs, n := forms(ip)
	for _, f := range fs[:n] {
		if f.IsUnspecified() || thisNetwork.Contains(f) {
			return true
		}
	}
	return false
}

func isMetadata(ip netip.Addr) bool {
	fs, n := forms(ip)
	for _, f := range fs[:n] {
		for _, m := range metadataAddrs {
			if f == m {
				return true
			}
		}
	}
	return false
}

// broadcast is the limited broadcast address: a datagram to it reaches every
// host of the server's segments (with SO_BROADCAST, which a flow's socket
// does not set, but a rule should not rely on that).
var broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// exactOnly names why ip is reached only through a rule naming it exactly
// ("" when a broad rule may): a metadata address, or one that reaches a
// group of hosts rather than one, multicast (224.0.0.0/4, ff00::/8) or the
// limited broadcast address. A subnet's directed broadcast (10.0.0.255 of
// 10.0.0.0/24) depends on the netmask, which the rules do not know: deny it
// (--deny) where it matters.
func exactOnly(ip netip.Addr) string {
	if isMetadata(ip) {
		return "a metadata address"
	}
	fs, n := forms(ip)
	for _, f := range fs[:n] {
		switch {
		case f.IsMulticast():
			return "a multicast address"
		case f == broadcast:
			return "the broadcast address"
		}
	}
	return ""
}

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

	// tcp and udp: exactly one of prefix (valid) and host (non-empty) is set.
	prefix         netip.Prefix
	host           string
	portLo, portHi uint16

	// unix: a path.Match pattern on the cleaned absolute path.
	pattern string
}

func (r *rule) portMatch(p uint16) bool { return p >= r.portLo && p <= r.portHi }

// AllowList is an ordered list of destination rules (allow rules, and deny
// rules that win over them) plus the server's own listeners, which are always
// refused. The first allow rule that matches names the decision. It is
// immutable after construction and safe for concurrent use.
type AllowList struct {
	rules []rule
	deny  []rule

	// self: the server's own listeners (unmapped); selfPorts: ports of
	// wildcard listeners, refused on every local address (localAddrs).
	self       []netip.AddrPort
	selfPorts  []uint16
	localAddrs func() ([]netip.Addr, error)
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
//	udp:10.0.0.53:53          UDP flows, in any of the tcp forms (a tcp rule allows no UDP)
//	unix:/run/app.sock        one socket
//	unix:/run/apps/*          a path.Match pattern on the cleaned path ('*' does not cross '/')
//
// A CIDR prefix must not have host bits set. An empty list allows nothing.
// Whatever the rules, Authorize refuses unspecified addresses, and metadata,
// multicast and broadcast addresses not named exactly (ErrReserved); see
// also ParseRules (deny rules) and WithSelf.
// Errors wrap ErrInvalidRule and name the bad rule; all bad rules are
// reported.
func ParseAllowList(rules []string) (*AllowList, error) { return ParseRules(rules, nil) }

// ParseRules parses allow rules and deny rules (same forms as ParseAllowList;
// unnamed deny rules are called "deny0", "deny1", …). A deny rule wins over
// every allow rule: with allow "tcp:0.0.0.0/0:*" and deny
// "tcp:169.254.0.0/16:*", link-local IPv4 is refused. A deny rule with a
// prefix applies to IP destinations and to every address a name resolves to
// (and to the IPv4 address embedded in a NAT64 address); one with a host name
// applies to that name; a unix deny rule applies to matching paths. Errors
// wrap ErrInvalidRule and name every bad rule.
func ParseRules(allow, deny []string) (*AllowList, error) {
	a := &AllowList{rules: make([]rule, 0, len(allow)), deny: make([]rule, 0, len(deny))}
	var errs []error
	for i, s := range allow {
		r, err := parseRule("allow", "rule", i, s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		a.rules = append(a.rules, r)
	}
	for i, s := range deny {
		r, err := parseRule("deny", "deny", i, s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		a.deny = append(a.deny, r)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return a, nil
}

// WithSelf returns a copy of a that also refuses tcp and udp to the given addresses
// of the server's own listeners (its QUIC and admin listeners), whatever the
// rules say. An unspecified address (0.0.0.0:9090, [::]:9090) stands for
// every local address at that port: loopback, unspecified, and each address
// local returns (nil: the host's interface addresses, looked up when a
// destination uses such a port; if the lookup fails the port is refused on
// every address). Addresses with port 0 are ignored.
func (a *AllowList) WithSelf(local func() ([]netip.Addr, error), addrs ...netip.AddrPort) *AllowList {
	b := *a
	b.self = append([]netip.AddrPort(nil), a.self...)
	b.selfPorts = append([]uint16(nil), a.selfPorts...)
	if local != nil {
		b.localAddrs = local
	}
	for _, ap := range addrs {
		if ap.Port() == 0 || !ap.Addr().IsValid() {
			continue
		}
		ip := ap.Addr().Unmap().WithZone("")
		if ip.IsUnspecified() {
			b.selfPorts = append(b.selfPorts, ap.Port())
			continue
		}
		b.self = append(b.self, netip.AddrPortFrom(ip, ap.Port()))
	}
	return &b
}

// WithAllowOf returns a copy of a whose allow rules are those of b: a's deny
// rules and own listeners (WithSelf) still refuse, b's are ignored. It
// shares the rules of both (immutable), so it is cheap enough per stream:
// an allow-list given at run time (an auth hook's answer) made to obey the
// server's --deny and listeners.
func (a *AllowList) WithAllowOf(b *AllowList) *AllowList {
	c := *a
	c.rules = b.rules
	return &c
}

// interfaceAddrs returns the addresses of the host's interfaces.
func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap().WithZone(""))
		}
	}
	return out, nil
}

// isSelf reports whether ip:port is one of the server's own listeners.
func (a *AllowList) isSelf(ip netip.Addr, port uint16) bool {
	for _, s := range a.self {
		if s.Addr() == ip && s.Port() == port {
			return true
		}
	}
	for _, p := range a.selfPorts {
		if p != port {
			continue
		}
		if ip.IsLoopback() || isUnspecified(ip) {
			return true
		}
		local := a.localAddrs
		if local == nil {
			local = interfaceAddrs
		}
		addrs, err := local()
		if err != nil {
			return true // cannot tell: refuse
		}
		for _, l := range addrs {
			if l == ip {
				return true
			}
		}
	}
	return false
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
// "loopback4") and ::1 (rule "loopback6") on any port, udp to the same
// ("loopback4-udp", "loopback6-udp"), and no unix sockets. The server adds
// its own listeners with WithSelf, so they stay refused.
func DefaultAllowList() *AllowList {
	return MustParseAllowList("loopback4=tcp:127.0.0.0/8:*", "loopback6=tcp:[::1]:*",
		"loopback4-udp=udp:127.0.0.0/8:*", "loopback6-udp=udp:[::1]:*")
}

// parseRule parses rule i of kind, "[NAME=]tcp:HOST:PORTS", "udp:..." or
// "unix:PATTERN"; an unnamed rule is named namePrefix+i.
func parseRule(kind, namePrefix string, i int, s string) (rule, error) {
	bad := func(format string, args ...any) (rule, error) {
		return rule{}, fmt.Errorf("%w: %s rule %d %q: %s", ErrInvalidRule, kind, i, s, fmt.Sprintf(format, args...))
	}
	if len(s) > MaxLen+maxRuleNameLen+1 {
		return bad("too long")
	}
	r := rule{name: namePrefix + strconv.Itoa(i)}
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
		return bad("missing network prefix (tcp:, udp: or unix:)")
	}
	var err error
	switch network {
	case NetworkTCP, NetworkUDP:
		r.network = network
		err = r.parseHostPorts(rest)
	case NetworkUnix:
		r.network = NetworkUnix
		err = r.parseUnixPattern(rest)
	default:
		err = fmt.Errorf("unknown network %q (want tcp, udp or unix)", network)
	}
	if err != nil {
		return bad("%v", err)
	}
	return r, nil
}

// parseHostPorts sets r's ports and its prefix or host name from the
// "HOST:PORTS" of a tcp or udp rule (HOST: an IP address, a CIDR prefix, a
// host name; an IPv6 one in brackets).
func (r *rule) parseHostPorts(rest string) error {
	colon := strings.LastIndexByte(rest, ':')
	if colon < 0 {
		return fmt.Errorf("want %s:HOST:PORT", r.network)
	}
	hostPart, portPart := rest[:colon], rest[colon+1:]
	lo, hi, err := parsePortRange(portPart)
	if err != nil {
		return err
	}
	r.portLo, r.portHi = lo, hi
	if strings.HasPrefix(hostPart, "[") {
		end := strings.IndexByte(hostPart, ']')
		if end < 0 {
			return errors.New("missing ']'")
		}
		hostPart = hostPart[1:end] + hostPart[end+1:]
	}
	switch {
	case hostPart == "":
		return errors.New("empty host")
	case strings.Contains(hostPart, "/"):
		p, err := netip.ParsePrefix(hostPart)
		if err != nil {
			return err
		}
		if p != p.Masked() {
			return fmt.Errorf("prefix %s has host bits set (did you mean %s?)", p, p.Masked())
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		r.prefix = p
		return nil
	}
	if ip, err := netip.ParseAddr(hostPart); err == nil {
		if ip.Zone() != "" {
			return errors.New("zoned address not supported")
		}
		ip = ip.Unmap()
		r.prefix = netip.PrefixFrom(ip, ip.BitLen())
		return nil
	}
	if strings.ContainsAny(hostPart, ":%") {
		return fmt.Errorf("bad IP address %q", hostPart)
	}
	if err := validHostname(hostPart); err != nil {
		return err
	}
	r.host = strings.ToLower(hostPart)
	return nil
}

// parseUnixPattern sets r's path pattern from a unix rule's PATTERN.
func (r *rule) parseUnixPattern(rest string) error {
	p, err := cleanUnixPath(rest)
	if err != nil {
		return err
	}
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("pattern %q: %w", p, err)
	}
	r.pattern = p
	return nil
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

// Rules returns the allow rules as "name=spec", in order, e.g. for logging
// the effective configuration.
func (a *AllowList) Rules() []string { return specs(a.rules) }

// DenyRules returns the deny rules as "name=spec", in order.
func (a *AllowList) DenyRules() []string { return specs(a.deny) }

func specs(rules []rule) []string {
	out := make([]string, len(rules))
	for i := range rules {
		out[i] = rules[i].name + "=" + rules[i].spec
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
// the name of the deciding allow rule.
//
// For tcp to an IP literal, the address (unmapped if it is IPv4-mapped IPv6)
// is matched against the CIDR rules and dial is that address. For tcp to a
// host name, an exact host-name rule allows it as is (dial == dest: the
// caller must check each address its dialer connects to with CheckDial);
// otherwise the name is resolved with r (nil means net.DefaultResolver),
// EVERY resolved address must be allowed, and dial is the first resolved
// address with dest's port, so the dialer cannot resolve the name again to
// something else (DNS rebinding). The name is not resolved when no CIDR rule
// covers the port. For unix, the path must be absolute; it is cleaned and
// matched against the patterns (symbolic links are not resolved).
//
// Whatever the allow rules say, these are refused: a destination matching a
// deny rule (ErrDenied); the unspecified addresses, and metadata addresses
// (MetadataAddrs), multicast addresses and 255.255.255.255 unless an allow
// rule names that exact address (ErrReserved);
// the server's own listeners (ErrSelf, see WithSelf).
//
// Every error wraps ErrForbidden (refused, including an invalid dest); a
// name that does not resolve wraps ErrResolve too. RefusalReason says why.
func (a *AllowList) Authorize(ctx context.Context, r Resolver, dest Endpoint) (dial Endpoint, rule string, err error) {
	d, err := Parse(dest.String())
	if err != nil {
		return Endpoint{}, "", fmt.Errorf("%w: %w", ErrForbidden, err)
	}
	if d.Network == NetworkUnix {
		for i := range a.deny {
			if ru := &a.deny[i]; ru.network == NetworkUnix {
				if ok, _ := path.Match(ru.pattern, d.Address); ok {
					return Endpoint{}, "", fmt.Errorf("%w %s: %s", ErrDenied, ru.name, d)
				}
			}
		}
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
	nw := d.Network
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap()
		name, err := a.checkIP(nw, ip, port)
		if err != nil {
			return Endpoint{}, "", fmt.Errorf("%s: %w", d, err)
		}
		return ipEndpoint(nw, ip, port), name, nil
	}

	for i := range a.deny {
		if ru := &a.deny[i]; ru.network == nw && ru.host == host && ru.portMatch(port) {
			return Endpoint{}, "", fmt.Errorf("%w %s: %s", ErrDenied, ru.name, d)
		}
	}
	for i := range a.rules {
		ru := &a.rules[i]
		if ru.network == nw && ru.host == host && ru.portMatch(port) {
			return d, ru.name, nil
		}
	}
	if !a.anyPrefixForPort(nw, port) {
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
		name, err := a.checkIP(nw, ip, port)
		if err != nil {
			return Endpoint{}, "", fmt.Errorf("%s resolves to %s: %w", d, ip, err)
		}
		if i == 0 {
			firstName = name
		}
	}
	return ipEndpoint(nw, ips[0].Unmap().WithZone(""), port), firstName, nil
}

// CheckDial checks an address a dialer is about to connect to, after its own
// name resolution (e.g. for a destination an exact host-name rule allowed,
// which is dialed by name): it refuses what no allow rule can override
// (unspecified, deny rules, the server's own listeners) and metadata,
// multicast and broadcast addresses no allow rule names exactly. It does not require an allow rule to
// match. network is the dialer's ("tcp4", "udp6", …: the rules of its family
// apply). Errors wrap ErrForbidden, as for Authorize.
func (a *AllowList) CheckDial(network string, addr netip.AddrPort) error {
	nw := NetworkTCP
	if strings.HasPrefix(network, NetworkUDP) {
		nw = NetworkUDP
	}
	ip := addr.Addr().Unmap().WithZone("")
	if err := a.refuse(nw, ip, addr.Port()); err != nil {
		return fmt.Errorf("%s: %w", netip.AddrPortFrom(ip, addr.Port()), err)
	}
	if what := exactOnly(ip); what != "" {
		if _, ok := a.namesExactly(nw, ip, addr.Port()); !ok {
			return fmt.Errorf("%w: %s is %s", ErrReserved, ip, what)
		}
	}
	return nil
}

// checkIP decides for one (unmapped, unzoned) address.
func (a *AllowList) checkIP(nw string, ip netip.Addr, port uint16) (string, error) {
	if err := a.refuse(nw, ip, port); err != nil {
		return "", err
	}
	name, ok := a.matchIP(nw, ip, port)
	if !ok {
		return "", fmt.Errorf("%w: no rule allows %s", ErrForbidden, netip.AddrPortFrom(ip, port))
	}
	if what := exactOnly(ip); what != "" {
		exact, ok := a.namesExactly(nw, ip, port)
		if !ok {
			return "", fmt.Errorf("%w: %s is %s (allow it with a rule naming it exactly)", ErrReserved, ip, what)
		}
		name = exact
	}
	return name, nil
}

// refuse returns the refusal no allow rule can override, or nil.
// The server's own listeners are refused on every network.
func (a *AllowList) refuse(nw string, ip netip.Addr, port uint16) error {
	if isUnspecified(ip) {
		return fmt.Errorf("%w: %s is unspecified", ErrReserved, ip)
	}
	if a.isSelf(ip, port) {
		return ErrSelf
	}
	for i := range a.deny {
		ru := &a.deny[i]
		if ru.network != nw || !ru.prefix.IsValid() || !ru.portMatch(port) {
			continue
		}
		fs, n := forms(ip)
		for _, f := range fs[:n] {
			if ru.prefix.Contains(f) {
				return fmt.Errorf("%w %s", ErrDenied, ru.name)
			}
		}
	}
	return nil
}

// matchIP returns the name of the first CIDR rule matching ip and port.
func (a *AllowList) matchIP(nw string, ip netip.Addr, port uint16) (string, bool) {
	for i := range a.rules {
		ru := &a.rules[i]
		if ru.network == nw && ru.prefix.IsValid() && ru.portMatch(port) && ru.prefix.Contains(ip) {
			return ru.name, true
		}
	}
	return "", false
}

// namesExactly returns the first allow rule that names ip itself (a /32 or
// /128) for port.
func (a *AllowList) namesExactly(nw string, ip netip.Addr, port uint16) (string, bool) {
	for i := range a.rules {
		ru := &a.rules[i]
		if ru.network == nw && ru.prefix.IsValid() && ru.portMatch(port) &&
			ru.prefix.Bits() == ip.BitLen() && ru.prefix.Addr() == ip {
			return ru.name, true
		}
	}
	return "", false
}

func (a *AllowList) anyPrefixForPort(nw string, port uint16) bool {
	for i := range a.rules {
		ru := &a.rules[i]
		if ru.network == nw && ru.prefix.IsValid() && ru.portMatch(port) {
			return true
		}
	}
	return false
}

func ipEndpoint(nw string, ip netip.Addr, port uint16) Endpoint {
	return Endpoint{Network: nw, Address: netip.AddrPortFrom(ip, port).String()}
}
