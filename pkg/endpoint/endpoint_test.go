package endpoint

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want Endpoint
	}{
		{"ipv4", "tcp:127.0.0.1:22", Endpoint{"tcp", "127.0.0.1:22"}},
		{"ipv6 bracketed", "tcp:[::1]:22", Endpoint{"tcp", "[::1]:22"}},
		{"ipv6 canonicalised", "tcp:[2001:DB8:0:0::1]:443", Endpoint{"tcp", "[2001:db8::1]:443"}},
		{"ipv4 in brackets", "tcp:[10.0.0.1]:80", Endpoint{"tcp", "10.0.0.1:80"}},
		{"mapped v4 kept", "tcp:[::ffff:127.0.0.1]:22", Endpoint{"tcp", "[::ffff:127.0.0.1]:22"}},
		{"hostname lowered", "tcp:DB.Internal:5432", Endpoint{"tcp", "db.internal:5432"}},
		{"hostname underscore", "tcp:_svc.example.com:1", Endpoint{"tcp", "_svc.example.com:1"}},
		{"max port", "tcp:localhost:65535", Endpoint{"tcp", "localhost:65535"}},
		{"unix", "unix:/run/app.sock", Endpoint{"unix", "/run/app.sock"}},
		{"unix cleaned", "unix:/run//apps/../app.sock", Endpoint{"unix", "/run/app.sock"}},
		{"unix dotdot above root", "unix:/../../etc/x", Endpoint{"unix", "/etc/x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := Parse(tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			again, err := Parse(got.String())
			require.NoError(t, err)
			assert.Equal(t, got, again, "Parse(String(e)) must round-trip")
		})
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, wantSub string
	}{
		{"empty", "", "missing network"},
		{"no network", "127.0.0.1:22", "unknown network"},
		{"upper network", "TCP:127.0.0.1:22", "unknown network"},
		{"sctp", "sctp:127.0.0.1:53", "unknown network"},
		{"no port", "tcp:127.0.0.1", "missing port"},
		{"port zero", "tcp:127.0.0.1:0", "bad port"},
		{"port too big", "tcp:127.0.0.1:65536", "bad port"},
		{"port sign", "tcp:127.0.0.1:+22", "bad port"},
		{"port leading zero", "tcp:127.0.0.1:022", "bad port"},
		{"port name", "tcp:127.0.0.1:ssh", "bad port"},
		{"unbracketed v6", "tcp:::1:22", "too many colons"},
		{"zone", "tcp:[fe80::1%eth0]:22", "zoned"},
		{"empty host", "tcp::22", "empty host"},
		{"bad host char", "tcp:a b:22", "invalid character"},
		{"empty label", "tcp:a..b:22", "empty"},
		{"dash label", "tcp:-a.b:22", "'-'"},
		{"numeric tld", "tcp:2130706433:22", "numeric"},
		{"hex ip", "tcp:0x7f.1:22", "numeric"},
		{"octal-ish ip", "tcp:127.0.0.01:22", "numeric"},
		{"long host", "tcp:" + strings.Repeat("a.", 130) + "com:22", "longer than"},
		{"too long", "unix:/" + strings.Repeat("a", MaxLen), "longer than"},
		{"unix relative", "unix:run/app.sock", "not absolute"},
		{"unix abstract", "unix:@app", "not absolute"},
		{"unix empty", "unix:", "empty path"},
		{"unix nul", "unix:/run/a\x00b", "NUL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(tc.in)
			require.ErrorIs(t, err, ErrInvalidEndpoint)
			assert.Contains(t, err.Error(), tc.wantSub)
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, e := range []Endpoint{
		{"tcp", "127.0.0.1:22"}, {"tcp", "[::1]:22"}, {"tcp", "db.internal:5432"},
		{"tcp", "[::ffff:10.0.0.1]:1"}, {"unix", "/run/app.sock"}, {"unix", "/"},
	} {
		f.Add(e.String())
	}
	f.Add("tcp:[fe80::1%eth0]:22")
	f.Add("unix:/a/../../b")
	f.Fuzz(func(t *testing.T, s string) {
		e, err := Parse(s)
		if err != nil {
			return
		}
		require.LessOrEqual(t, len(e.String()), MaxLen)
		again, err := Parse(e.String())
		require.NoError(t, err, "String() of a parsed endpoint must parse: %q", e.String())
		require.Equal(t, e, again)
	})
}
