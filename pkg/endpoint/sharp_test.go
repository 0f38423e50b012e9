package endpoint

import (
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 11 item 7: broad rules must not admit unspecified or metadata
// addresses, and a name that does not resolve is refused like any other
// forbidden destination.
func TestBroadRulesRefuseReservedAddresses(t *testing.T) {
	t.Parallel()
	a := MustParseAllowList("tcp:0.0.0.0/0:443", "tcp:[::]/0:443")
	res := &fakeResolver{hosts: map[string][]string{
		"zero.evil":   {"0.0.0.0"},
		"meta.evil":   {"169.254.169.254"},
		"meta64.evil": {"64:ff9b::a9fe:a9fe"},
		"ok.example":  {"93.184.216.34"},
	}}
	for dest, ok := range map[string]bool{
		"tcp:93.184.216.34:443":              true,
		"tcp:ok.example:443":                 true,
		"tcp:[2001:db8::1]:443":              true,
		"tcp:0.0.0.0:443":                    false,
		"tcp:[::]:443":                       false,
		"tcp:[::ffff:0.0.0.0]:443":           false,
		"tcp:0.1.2.3:443":                    false,
		"tcp:169.254.169.254:443":            false,
		"tcp:[::ffff:169.254.169.254]:443":   false,
		"tcp:[64:ff9b::a9fe:a9fe]:443":       false,
		"tcp:[64:ff9b::169.254.169.254]:443": false,
		"tcp:[fd00:ec2::254]:443":            false,
		"tcp:100.100.100.200:443":            false,
		"tcp:169.254.170.2:443":              false,
		"tcp:zero.evil:443":                  false,
		"tcp:meta.evil:443":                  false,
		"tcp:meta64.evil:443":                false,
		"tcp:nx.example:443":                 false,
	} {
		t.Run(dest, func(t *testing.T) {
			t.Parallel()
			d, err := Parse(dest)
			require.NoError(t, err)
			dial, _, err := a.Authorize(context.Background(), res, d)
			if ok {
				require.NoError(t, err)
				assert.NotEmpty(t, dial.Address)
				return
			}
			require.ErrorIs(t, err, ErrForbidden, "want refused (not a dial or resolve failure)")
		})
	}
}

func TestMetadataAllowedOnlyByExactRule(t *testing.T) {
	t.Parallel()
	a := MustParseAllowList("tcp:169.254.0.0/16:*", "imds=tcp:169.254.169.254:80", "tcp:[64:ff9b::a9fe:a9fe]:80")
	for dest, want := range map[string]string{
		"tcp:169.254.169.254:80":      "imds",
		"tcp:169.254.169.254:443":     ReasonReserved, // the exact rule covers port 80 only
		"tcp:169.254.1.1:443":         "rule0",
		"tcp:[64:ff9b::a9fe:a9fe]:80": "rule2",
		"tcp:0.0.0.0:80":              ReasonReserved,
	} {
		d, err := Parse(dest)
		require.NoError(t, err)
		_, rule, err := a.Authorize(context.Background(), nil, d)
		if r := RefusalReason(err); r != "" {
			assert.Equal(t, want, r, dest)
			continue
		}
		require.NoError(t, err, dest)
		assert.Equal(t, want, rule, dest)
	}
}

func TestDenyRules(t *testing.T) {
	t.Parallel()
	// "Anything on 443 but link-local and metadata", and all of /run but the docker socket.
	a, err := ParseRules(
		[]string{"web=tcp:0.0.0.0/0:443", "web6=tcp:[::]/0:443", "imds=tcp:169.254.169.254:443", "db=tcp:db.internal:5432", "run=unix:/run/*"},
		[]string{"ll=tcp:169.254.0.0/16:*", "tcp:fe80::/10:*", "tcp:db.internal:*", "unix:/run/docker.sock"})
	require.NoError(t, err)
	assert.Equal(t, []string{"ll=tcp:169.254.0.0/16:*", "deny1=tcp:fe80::/10:*", "deny2=tcp:db.internal:*", "deny3=unix:/run/docker.sock"}, a.DenyRules())
	res := &fakeResolver{hosts: map[string][]string{
		"ok.example":    {"93.184.216.34"},
		"mixed.example": {"93.184.216.34", "169.254.1.1"},
	}}
	for dest, want := range map[string]string{
		"tcp:93.184.216.34:443":        "",
		"tcp:ok.example:443":           "",
		"unix:/run/app.sock":           "",
		"tcp:169.254.1.1:443":          ReasonDenied,
		"tcp:169.254.169.254:443":      ReasonDenied, // deny wins over the exact allow rule
		"tcp:[64:ff9b::a9fe:101]:443":  ReasonDenied, // NAT64 form of 169.254.1.1
		"tcp:[fe80::1]:443":            ReasonDenied,
		"tcp:mixed.example:443":        ReasonDenied,
		"tcp:db.internal:5432":         ReasonDenied,
		"unix:/run/docker.sock":        ReasonDenied,
		"unix:/run/x/../docker.sock":   ReasonDenied,
		"tcp:93.184.216.34:80":         ReasonNotAllowed,
		"tcp:nx.example:443":           ReasonUnresolved,
		"tcp:[::ffff:169.254.1.1]:443": ReasonDenied,
	} {
		d, err := Parse(dest)
		require.NoError(t, err)
		_, _, err = a.Authorize(context.Background(), res, d)
		assert.Equal(t, want, RefusalReason(err), "%s: %v", dest, err)
		if want != "" {
			assert.ErrorIs(t, err, ErrForbidden, dest)
		}
	}

	_, err = ParseRules([]string{"tcp:127.0.0.1:22"}, []string{"tcp:10.0.0.1/8:*"})
	require.ErrorIs(t, err, ErrInvalidRule)
	assert.Contains(t, err.Error(), `deny rule 0 "tcp:10.0.0.1/8:*"`)
}

func TestWithSelf(t *testing.T) {
	t.Parallel()
	base := MustParseAllowList("tcp:0.0.0.0/0:*", "tcp:[::]/0:*")
	local := func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")}, nil
	}
	a := base.WithSelf(local,
		netip.MustParseAddrPort("127.0.0.1:8086"), // admin on loopback
		netip.MustParseAddrPort("0.0.0.0:7500"),   // QUIC on every address
		netip.MustParseAddrPort("[::]:9090"),      // a second wildcard listener
		netip.MustParseAddrPort("127.0.0.1:0"),    // ignored
	)
	res := &fakeResolver{hosts: map[string][]string{"me.example": {"192.0.2.7"}}}
	for dest, self := range map[string]bool{
		"tcp:127.0.0.1:8086":          true,
		"tcp:[::ffff:127.0.0.1]:8086": true,
		"tcp:127.0.0.2:8086":          false, // nothing listens there
		"tcp:127.0.0.1:8087":          false,
		"tcp:127.0.0.5:7500":          true,
		"tcp:[::1]:7500":              true,
		"tcp:192.0.2.7:7500":          true,
		"tcp:[2001:db8::7]:9090":      true,
		"tcp:192.0.2.7:9090":          true,
		"tcp:me.example:9090":         true,
		"tcp:192.0.2.8:9090":          false,
		"tcp:198.51.100.1:7500":       false,
	} {
		d, err := Parse(dest)
		require.NoError(t, err)
		_, _, err = a.Authorize(context.Background(), res, d)
		if self {
			require.ErrorIs(t, err, ErrSelf, dest)
			assert.Equal(t, ReasonSelf, RefusalReason(err))
		} else {
			require.NoError(t, err, dest)
		}
		// The base list is unchanged.
		_, _, err = base.Authorize(context.Background(), res, d)
		require.NoError(t, err, dest)
	}
	// A failed interface lookup refuses the wildcard port rather than risk it.
	broken := base.WithSelf(func() ([]netip.Addr, error) { return nil, errNoSuchHost }, netip.MustParseAddrPort("[::]:9090"))
	_, _, err := broken.Authorize(context.Background(), nil, Endpoint{"tcp", "198.51.100.1:9090"})
	require.ErrorIs(t, err, ErrSelf)
	_, _, err = broken.Authorize(context.Background(), nil, Endpoint{"tcp", "198.51.100.1:9091"})
	require.NoError(t, err)
}

func TestCheckDial(t *testing.T) {
	t.Parallel()
	a, err := ParseRules([]string{"db=tcp:db.internal:5432", "imds=tcp:169.254.169.254:80"}, []string{"tcp:10.9.0.0/16:*"})
	require.NoError(t, err)
	a = a.WithSelf(nil, netip.MustParseAddrPort("127.0.0.1:8086"))
	for addr, want := range map[string]string{
		"10.0.0.5:5432":           "", // no allow rule needed: the name rule allowed it
		"0.0.0.0:5432":            ReasonReserved,
		"[::]:5432":               ReasonReserved,
		"169.254.169.254:5432":    ReasonReserved,
		"169.254.169.254:80":      "",
		"[fd00:ec2::254]:5432":    ReasonReserved,
		"10.9.1.1:5432":           ReasonDenied,
		"127.0.0.1:8086":          ReasonSelf,
		"[::ffff:127.0.0.1]:8086": ReasonSelf,
	} {
		err := a.CheckDial("tcp4", netip.MustParseAddrPort(addr))
		assert.Equal(t, want, RefusalReason(err), "%s: %v", addr, err)
	}
	// A tcp deny rule does not cover udp; the server itself and reserved
	// addresses are refused on every network.
	assert.NoError(t, a.CheckDial("udp4", netip.MustParseAddrPort("10.9.1.1:53")))
	assert.Equal(t, ReasonSelf, RefusalReason(a.CheckDial("udp", netip.MustParseAddrPort("127.0.0.1:8086"))))
	assert.Equal(t, ReasonReserved, RefusalReason(a.CheckDial("udp6", netip.MustParseAddrPort("[::]:53"))))
	assert.Empty(t, RefusalReason(nil))
	assert.Empty(t, RefusalReason(errNoSuchHost))
}

// UDP rules allow UDP flows only, and TCP rules TCP only; every refusal that
// holds for tcp holds for udp.
func TestUDPRules(t *testing.T) {
	t.Parallel()
	a, err := ParseRules([]string{"dns=udp:10.0.0.53:53", "web=tcp:10.0.0.0/8:443", "any=udp:0.0.0.0/0:*"},
		[]string{"udp:10.66.0.0/16:*"})
	require.NoError(t, err)
	a = a.WithSelf(nil, netip.MustParseAddrPort("0.0.0.0:7500"))
	for dest, want := range map[string]string{
		"udp:10.0.0.53:53":          "dns",
		"udp:10.0.0.54:53":          "any",
		"tcp:10.0.0.53:53":          ReasonNotAllowed,
		"tcp:10.0.0.1:443":          "web",
		"udp:10.66.1.1:53":          ReasonDenied,
		"udp:0.0.0.0:53":            ReasonReserved,
		"udp:169.254.169.254:53":    ReasonReserved,
		"udp:127.0.0.1:7500":        ReasonSelf, // the server's own QUIC port
		"udp:[::ffff:10.0.0.53]:53": "dns",
	} {
		ep, err := Parse(dest)
		require.NoError(t, err)
		dial, rule, err := a.Authorize(context.Background(), nil, ep)
		if err != nil {
			assert.Equal(t, want, RefusalReason(err), "%s: %v", dest, err)
			continue
		}
		assert.Equal(t, want, rule, dest)
		assert.Equal(t, ep.Network, dial.Network, dest)
	}
	_, err = ParseAllowList([]string{"udp:10.0.0.1"})
	require.ErrorContains(t, err, "want udp:HOST:PORT")
	def := DefaultAllowList()
	_, rule, err := def.Authorize(context.Background(), nil, Endpoint{NetworkUDP, "127.0.0.1:53"})
	require.NoError(t, err)
	assert.Equal(t, "loopback4-udp", rule)
	_, _, err = def.Authorize(context.Background(), nil, Endpoint{NetworkUDP, "10.0.0.1:53"})
	assert.Equal(t, ReasonNotAllowed, RefusalReason(err))
}

// Issue 21 item 7: a broad rule does not admit multicast (224.0.0.0/4,
// ff00::/8) or the limited broadcast address (255.255.255.255): a UDP flow
// to them reaches every host of a segment. Only a rule naming the address
// exactly does, as for metadata addresses; CheckDial (a name an exact host
// rule allowed, resolved by the dialer) refuses them likewise.
func TestBroadRulesRefuseMulticastAndBroadcast(t *testing.T) {
	t.Parallel()
	a := MustParseAllowList("udp:0.0.0.0/0:*", "udp:[::]/0:*", "tcp:0.0.0.0/0:*",
		"mdns=udp:224.0.0.251:5353", "mdns6=udp:[ff02::fb]:5353", "bootp=udp:255.255.255.255:67", "udp:lan.example:*")
	res := &fakeResolver{hosts: map[string][]string{
		"group.evil": {"239.1.2.3"},
		"bcast.evil": {"255.255.255.255"},
		"ok.example": {"93.184.216.34"},
	}}
	for _, tc := range []struct{ dest, want string }{
		{"udp:93.184.216.34:53", "rule0"},
		{"udp:[2001:db8::1]:53", "rule1"},
		{"udp:ok.example:53", "rule0"},
		{"udp:224.0.0.251:5353", "mdns"},
		{"udp:[ff02::fb]:5353", "mdns6"},
		{"udp:255.255.255.255:67", "bootp"},
		{"udp:224.0.0.251:53", ReasonReserved}, // the exact rule covers 5353 only
		{"udp:224.0.0.1:53", ReasonReserved},
		{"udp:239.255.255.250:1900", ReasonReserved},
		{"udp:[::ffff:239.255.255.250]:1900", ReasonReserved},
		{"udp:[64:ff9b::e000:1]:53", ReasonReserved}, // NAT64 form of 224.0.0.1
		{"udp:[ff02::1]:53", ReasonReserved},
		{"udp:[ff05::1:3]:547", ReasonReserved},
		{"udp:255.255.255.255:68", ReasonReserved},
		{"udp:group.evil:53", ReasonReserved},
		{"udp:bcast.evil:53", ReasonReserved},
		{"tcp:224.0.0.1:80", ReasonReserved},
	} {
		t.Run(tc.dest, func(t *testing.T) {
			t.Parallel()
			d, err := Parse(tc.dest)
			require.NoError(t, err)
			_, rule, err := a.Authorize(context.Background(), res, d)
			if r := RefusalReason(err); r != "" {
				assert.Equal(t, tc.want, r, "err: %v", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, rule)
		})
	}
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"93.184.216.34:53", true},
		{"224.0.0.251:5353", true},
		{"224.0.0.251:53", false},
		{"239.1.2.3:53", false},
		{"[ff02::1]:53", false},
		{"255.255.255.255:53", false},
	} {
		err := a.CheckDial("udp4", netip.MustParseAddrPort(tc.addr))
		if tc.ok {
			assert.NoError(t, err, tc.addr)
			continue
		}
		assert.ErrorIs(t, err, ErrReserved, tc.addr)
	}
}
