package endpoint

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeResolver answers from a map and counts lookups.
type fakeResolver struct {
	hosts map[string][]string
	calls atomic.Int32
}

var errNoSuchHost = errors.New("no such host")

func (f *fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	f.calls.Add(1)
	if network != "ip" {
		return nil, errors.New("unexpected network " + network)
	}
	ss, ok := f.hosts[host]
	if !ok {
		return nil, errNoSuchHost
	}
	out := make([]netip.Addr, 0, len(ss))
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out, nil
}

func TestParseAllowListErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, rule, wantSub string
	}{
		{"empty", "", "missing network"},
		{"no network", "127.0.0.1:22", "unknown network"},
		{"sctp", "sctp:127.0.0.1:53", "unknown network"},
		{"no port", "tcp:127.0.0.1", "want tcp:HOST:PORT"},
		{"bad port", "tcp:127.0.0.1:0", "bad port"},
		{"reversed range", "tcp:127.0.0.1:2000-1000", "empty port range"},
		{"open range", "tcp:127.0.0.1:1000-", "bad port"},
		{"host bits", "tcp:10.0.0.1/8:22", "host bits"},
		{"bad prefix", "tcp:10.0.0.0/33:22", "10.0.0.0/33"},
		{"bad bracket", "tcp:[::1:22", "missing ']'"},
		{"zone", "tcp:[fe80::1%eth0]:22", "zoned"},
		{"star host", "tcp:*:22", "invalid character"},
		{"empty host", "tcp::22", "empty host"},
		{"unix relative", "unix:run/*", "not absolute"},
		{"unix bad pattern", "unix:/run/[", "syntax error"},
		{"bad name", "s sh=tcp:127.0.0.1:22", "invalid character"},
		{"empty name", "=tcp:127.0.0.1:22", "rule name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseAllowList([]string{"tcp:127.0.0.1:22", tc.rule})
			require.ErrorIs(t, err, ErrInvalidRule)
			assert.Contains(t, err.Error(), tc.wantSub)
			assert.Contains(t, err.Error(), "rule 1 ", "error must name the rule")
		})
	}
}

func TestParseAllowListReportsAll(t *testing.T) {
	t.Parallel()
	_, err := ParseAllowList([]string{"tcp:x", "tcp:127.0.0.1:22", "unix:rel"})
	require.ErrorIs(t, err, ErrInvalidRule)
	assert.Contains(t, err.Error(), `rule 0 "tcp:x"`)
	assert.Contains(t, err.Error(), `rule 2 "unix:rel"`)
}

func TestRulesAndNames(t *testing.T) {
	t.Parallel()
	a, err := ParseAllowList([]string{"ssh=tcp:127.0.0.1:22", " tcp:[::1]:* ", "unix:/run/a=b.sock"})
	require.NoError(t, err)
	assert.Equal(t, []string{"ssh=tcp:127.0.0.1:22", "rule1=tcp:[::1]:*", "rule2=unix:/run/a=b.sock"}, a.Rules())
	assert.Equal(t, []string{"ssh", "rule1", "rule2"}, a.Names())
	assert.Equal(t, []string{"loopback4", "loopback6", "loopback4-udp", "loopback6-udp"}, DefaultAllowList().Names())

	empty, err := ParseAllowList(nil)
	require.NoError(t, err)
	_, _, err = empty.Authorize(context.Background(), &fakeResolver{}, Endpoint{"tcp", "127.0.0.1:22"})
	require.ErrorIs(t, err, ErrForbidden)
}

func TestAuthorize(t *testing.T) {
	t.Parallel()
	rules := []string{
		"ssh=tcp:127.0.0.1:22",
		"pg=tcp:10.0.0.0/8:5432",
		"any=tcp:192.168.0.0/16:*",
		"range=tcp:10.0.0.1:1000-2000",
		"v6=tcp:[::1]:*",
		"v6net=tcp:fd00::/8:443",
		"db=tcp:db.internal:5432",
		"sock=unix:/run/app.sock",
		"apps=unix:/run/apps/*",
	}
	a, err := ParseAllowList(rules)
	require.NoError(t, err)
	res := &fakeResolver{hosts: map[string][]string{
		"good.example":    {"10.1.2.3", "10.4.5.6"},
		"mixed.example":   {"10.1.2.3", "169.254.169.254"},
		"metadata.evil":   {"169.254.169.254"},
		"mapped.example":  {"::ffff:10.9.9.9"},
		"v6.example":      {"fd00::5"},
		"empty.example":   {},
		"db.internal":     {"169.254.169.254"},
		"loopback.evil":   {"127.0.0.1"},
		"local6.example":  {"::1", "127.0.0.1"},
		"range6.example":  {"fd00::1"},
		"zoned.example":   {"fe80::1%eth0"},
		"anyport.example": {"192.168.1.1"},
	}}
	tests := []struct {
		name     string
		dest     string
		wantDial string
		wantRule string
		wantErr  error
	}{
		{"exact ip port", "tcp:127.0.0.1:22", "tcp:127.0.0.1:22", "ssh", nil},
		{"exact ip other port", "tcp:127.0.0.1:23", "", "", ErrForbidden},
		{"other loopback", "tcp:127.0.0.2:22", "", "", ErrForbidden},
		{"cidr", "tcp:10.200.0.1:5432", "tcp:10.200.0.1:5432", "pg", nil},
		{"cidr wrong port", "tcp:10.200.0.1:5433", "", "", ErrForbidden},
		{"cidr any port", "tcp:192.168.7.7:1", "tcp:192.168.7.7:1", "any", nil},
		{"range low", "tcp:10.0.0.1:1000", "tcp:10.0.0.1:1000", "range", nil},
		{"range high", "tcp:10.0.0.1:2000", "tcp:10.0.0.1:2000", "range", nil},
		{"range above", "tcp:10.0.0.1:2001", "", "", ErrForbidden},
		{"range below", "tcp:10.0.0.1:999", "", "", ErrForbidden},
		{"first rule wins", "tcp:10.0.0.1:5432", "tcp:10.0.0.1:5432", "pg", nil},
		{"v6 loopback", "tcp:[::1]:8080", "tcp:[::1]:8080", "v6", nil},
		{"v6 prefix", "tcp:[fd12::1]:443", "tcp:[fd12::1]:443", "v6net", nil},
		{"v6 prefix wrong port", "tcp:[fd12::1]:444", "", "", ErrForbidden},
		{"mapped v4 unmapped", "tcp:[::ffff:127.0.0.1]:22", "tcp:127.0.0.1:22", "ssh", nil},
		{"mapped v4 forbidden", "tcp:[::ffff:169.254.169.254]:80", "", "", ErrForbidden},
		{"metadata ip", "tcp:169.254.169.254:80", "", "", ErrForbidden},
		{"hostname all allowed", "tcp:good.example:5432", "tcp:10.1.2.3:5432", "pg", nil},
		{"hostname one forbidden", "tcp:mixed.example:5432", "", "", ErrForbidden},
		{"hostname to metadata", "tcp:metadata.evil:5432", "", "", ErrForbidden},
		{"hostname to loopback wrong port", "tcp:loopback.evil:23", "", "", ErrForbidden},
		{"hostname to loopback allowed", "tcp:loopback.evil:22", "tcp:127.0.0.1:22", "ssh", nil},
		{"hostname resolves mapped", "tcp:mapped.example:5432", "tcp:10.9.9.9:5432", "pg", nil},
		{"hostname v6", "tcp:v6.example:443", "tcp:[fd00::5]:443", "v6net", nil},
		{"hostname mixed families", "tcp:local6.example:22", "tcp:[::1]:22", "v6", nil},
		{"hostname mixed families partly forbidden", "tcp:local6.example:23", "", "", ErrForbidden},
		{"hostname zoned answer", "tcp:zoned.example:443", "", "", ErrForbidden},
		{"hostname any port rule", "tcp:anyport.example:9", "tcp:192.168.1.1:9", "any", nil},
		{"exact hostname rule trusted", "tcp:db.internal:5432", "tcp:db.internal:5432", "db", nil},
		{"exact hostname case", "tcp:DB.INTERNAL:5432", "tcp:db.internal:5432", "db", nil},
		{"exact hostname wrong port resolves", "tcp:db.internal:5433", "", "", ErrForbidden},
		{"unknown host", "tcp:nx.example:5432", "", "", ErrResolve},
		{"empty answer", "tcp:empty.example:5432", "", "", ErrResolve},
		{"unix exact", "unix:/run/app.sock", "unix:/run/app.sock", "sock", nil},
		{"unix glob", "unix:/run/apps/x.sock", "unix:/run/apps/x.sock", "apps", nil},
		{"unix glob no subdir", "unix:/run/apps/x/y.sock", "", "", ErrForbidden},
		{"unix dotdot escape", "unix:/run/apps/../../etc/shadow", "", "", ErrForbidden},
		{"unix dotdot inside", "unix:/run/apps/../app.sock", "unix:/run/app.sock", "sock", nil},
		{"unix double slash", "unix://run//apps//a", "unix:/run/apps/a", "apps", nil},
		{"unix other", "unix:/var/run/docker.sock", "", "", ErrForbidden},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dest, err := Parse(tc.dest)
			require.NoError(t, err)
			dial, rule, err := a.Authorize(context.Background(), res, dest)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				assert.Empty(t, rule)
				assert.Equal(t, Endpoint{}, dial)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantDial, dial.String())
			assert.Equal(t, tc.wantRule, rule)
		})
	}
}

func TestAuthorizeHandBuiltEndpoints(t *testing.T) {
	t.Parallel()
	a := MustParseAllowList("tcp:127.0.0.0/8:*", "unix:/run/*")
	tests := []struct {
		name string
		dest Endpoint
	}{
		{"relative unix", Endpoint{"unix", "run/x"}},
		{"unknown network", Endpoint{"sctp", "127.0.0.1:53"}},
		{"zero", Endpoint{}},
		{"no port", Endpoint{"tcp", "127.0.0.1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := a.Authorize(context.Background(), &fakeResolver{}, tc.dest)
			require.ErrorIs(t, err, ErrForbidden)
		})
	}
	// An uncleaned path built by hand is cleaned before matching.
	dial, _, err := a.Authorize(context.Background(), nil, Endpoint{"unix", "/run/x/../y"})
	require.NoError(t, err)
	assert.Equal(t, "/run/y", dial.Address)
	_, _, err = a.Authorize(context.Background(), nil, Endpoint{"unix", "/run/../etc/passwd"})
	require.ErrorIs(t, err, ErrForbidden)
}

func TestAuthorizeSkipsDNSWhenNoRuleCoversPort(t *testing.T) {
	t.Parallel()
	a := MustParseAllowList("tcp:10.0.0.0/8:22")
	res := &fakeResolver{hosts: map[string][]string{"h.example": {"10.0.0.1"}}}
	_, _, err := a.Authorize(context.Background(), res, Endpoint{"tcp", "h.example:80"})
	require.ErrorIs(t, err, ErrForbidden)
	assert.Equal(t, int32(0), res.calls.Load())
	_, _, err = a.Authorize(context.Background(), res, Endpoint{"tcp", "h.example:22"})
	require.NoError(t, err)
	assert.Equal(t, int32(1), res.calls.Load())
}

func TestDefaultAllowList(t *testing.T) {
	t.Parallel()
	a := DefaultAllowList()
	for dest, ok := range map[string]bool{
		"tcp:127.0.0.1:22":            true,
		"tcp:127.255.255.254:65535":   true,
		"tcp:[::1]:1":                 true,
		"tcp:[::ffff:127.0.0.1]:80":   true,
		"tcp:10.0.0.1:22":             false,
		"tcp:[::2]:22":                false,
		"tcp:169.254.169.254:80":      false,
		"unix:/run/app.sock":          false,
		"tcp:[0:0:0:0:0:0:0:1]:22":    true,
		"tcp:[::ffff:10.0.0.1]:22":    false,
		"tcp:[64:ff9b::7f00:1]:22":    false,
		"tcp:[2002:7f00:1::1]:22":     false,
		"tcp:[::127.0.0.1]:22":        false,
		"tcp:0.0.0.0:22":              false,
		"tcp:[::]:22":                 false,
		"tcp:[fe80::1]:22":            false,
		"tcp:[ff02::1]:22":            false,
		"tcp:[::ffff:0:7f00:1]:22":    false,
		"tcp:[0::ffff:7f00:1]:22":     true,
		"tcp:[0:0::ffff:127.0.0.1]:2": true,
	} {
		t.Run(dest, func(t *testing.T) {
			t.Parallel()
			d, err := Parse(dest)
			require.NoError(t, err)
			_, _, err = a.Authorize(context.Background(), nil, d)
			if ok {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrForbidden)
			}
		})
	}
}

func FuzzAuthorize(f *testing.F) {
	f.Add("tcp:10.0.0.0/8:5432", "tcp:10.1.2.3:5432", "10.1.2.3")
	f.Add("tcp:[::1]:*", "tcp:[::ffff:127.0.0.1]:22", "::1")
	f.Add("tcp:127.0.0.1:1000-2000", "tcp:host.example:1500", "127.0.0.1,169.254.169.254")
	f.Add("tcp:db.internal:5432", "tcp:db.internal:5432", "")
	f.Add("unix:/run/apps/*", "unix:/run/apps/../x", "")
	f.Add("n=tcp:[fd00::]/8:443", "tcp:v6.example:443", "fd00::1,::ffff:10.0.0.1")
	f.Fuzz(func(t *testing.T, ruleStr, destStr, ips string) {
		a, err := ParseAllowList([]string{ruleStr})
		if err != nil {
			return
		}
		dest, err := Parse(destStr)
		if err != nil {
			return
		}
		var answer []string
		for _, s := range strings.Split(ips, ",") {
			if _, err := netip.ParseAddr(s); err == nil {
				answer = append(answer, s)
			}
		}
		host := dest.Address
		if h, _, ok := strings.Cut(dest.Address, ":"); ok && dest.Network == NetworkTCP {
			host = h
		}
		res := &fakeResolver{hosts: map[string][]string{host: answer}}
		dial, rule, err := a.Authorize(context.Background(), res, dest)
		if err != nil {
			require.True(t, errors.Is(err, ErrForbidden) || errors.Is(err, ErrResolve), "unexpected error %v", err)
			return
		}
		require.NotEmpty(t, rule)
		// What Authorize tells us to dial must itself be allowed, by the same rule.
		dial2, rule2, err := a.Authorize(context.Background(), res, dial)
		require.NoError(t, err)
		require.Equal(t, dial, dial2)
		require.Equal(t, rule, rule2)
		if dial.Network == NetworkTCP && dial != dest {
			hp, err := netip.ParseAddrPort(dial.Address)
			require.NoError(t, err, "dial must be an IP:port unless a hostname rule matched")
			require.False(t, hp.Addr().Is4In6())
		}
	})
}

// TestWithAllowOf: the copy allows what the other list allows, and a's deny
// rules (on names' resolved addresses too) and own listeners still refuse.
func TestWithAllowOf(t *testing.T) {
	t.Parallel()
	base, err := ParseRules([]string{"tcp:10.1.0.0/16:*"}, []string{"tcp:10.9.9.9:*"})
	require.NoError(t, err)
	base = base.WithSelf(nil, netip.MustParseAddrPort("10.9.0.1:443"))
	given := MustParseAllowList("tcp:10.9.0.0/16:*")
	c := base.WithAllowOf(given)
	r := &fakeResolver{hosts: map[string][]string{"db.internal": {"10.9.9.9"}}}
	for _, tc := range []struct {
		dest, reason string
	}{
		{dest: "tcp:10.9.0.5:22"},
		{dest: "tcp:10.1.0.5:22", reason: ReasonNotAllowed},
		{dest: "tcp:10.9.9.9:22", reason: ReasonDenied},
		{dest: "tcp:db.internal:22", reason: ReasonDenied},
		{dest: "tcp:10.9.0.1:443", reason: ReasonSelf},
	} {
		dest, err := Parse(tc.dest)
		require.NoError(t, err)
		_, _, err = c.Authorize(context.Background(), r, dest)
		if tc.reason == "" {
			assert.NoError(t, err, tc.dest)
			continue
		}
		assert.Equal(t, tc.reason, RefusalReason(err), tc.dest)
	}
	assert.Equal(t, []string{"rule0=tcp:10.1.0.0/16:*"}, base.Rules(), "base is left alone")
}
