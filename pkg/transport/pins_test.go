package transport_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/transport"
)

// TestParsePins: each entry pins every server (sha256:HEX) or one endpoint
// (HOST:PORT=sha256:HEX); an endpoint with pins of its own accepts only
// those; duplicates count once; every bad entry is reported, each with what
// to write instead.
func TestParsePins(t *testing.T) {
	t.Parallel()
	a, b, c := "sha256:"+strings.Repeat("aa", 32), "sha256:"+strings.Repeat("bb", 32), "sha256:"+strings.Repeat("cc", 32)
	pa, _ := transport.ParseFingerprint(a)
	pb, _ := transport.ParseFingerprint(b)
	pc, _ := transport.ParseFingerprint(c)

	p, err := transport.ParsePins([]string{a, "b.example:7500=" + b, " b.example:7500 = " + strings.ToUpper(c[7:]), "[2001:db8::1]:7500=" + c, a})
	require.NoError(t, err)
	assert.Equal(t, [][32]byte{pa}, p.For("a.example:7500"), "no pins of its own: the shared ones")
	assert.Equal(t, [][32]byte{pb, pc}, p.For("b.example:7500"), "its own only (two: a rotation)")
	assert.Equal(t, [][32]byte{pc}, p.For("[2001:db8::1]:7500"))
	assert.Equal(t, []string{a, "b.example:7500=" + b, "b.example:7500=" + c, "[2001:db8::1]:7500=" + c}, p.Entries(), "canonical, each once")
	assert.False(t, p.Empty())

	none, err := transport.ParsePins(nil)
	require.NoError(t, err)
	assert.True(t, none.Empty())
	assert.Nil(t, none.For("a.example:7500"))

	for _, tc := range []struct {
		name, entry, want string
	}{
		{"not hex", "sha256:xyz", `--server-fingerprint "sha256:xyz": fingerprint must be sha256:<64 hex digits>, as printed by 'quictun-server fingerprint'`},
		{"colon instead of =", "b.example:7500:" + b, "to pin one server write HOST:PORT=sha256:HEX"},
		{"endpoint without port", "b.example=" + b, `"b.example" is not HOST:PORT; want sha256:HEX (every server) or HOST:PORT=sha256:HEX`},
		{"empty endpoint", "=" + b, `"" is not HOST:PORT`},
		{"empty fingerprint", "b.example:7500=", "fingerprint must be sha256:<64 hex digits>"},
		{"placeholder", "b.example:7500=sha256:" + strings.Repeat("00", 32), "all-zero placeholder"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := transport.ParsePins([]string{tc.entry})
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err = transport.ParsePins([]string{"bad", a, "x=" + b})
	require.Error(t, err)
	assert.Equal(t, 2, strings.Count(err.Error(), "--server-fingerprint"), "every bad entry reported: %v", err)
}

// TestPinsCheck: an entry for an endpoint that is not configured is an
// error naming the configured ones; with pins per endpoint only, an
// endpoint without one is an error (nothing would verify it).
func TestPinsCheck(t *testing.T) {
	t.Parallel()
	a, b := "sha256:"+strings.Repeat("aa", 32), "sha256:"+strings.Repeat("bb", 32)
	eps := []string{"a.example:7500", "b.example:7500"}
	for _, tc := range []struct {
		name    string
		entries []string
		want    []string // substrings of the error; none: valid
	}{
		{"shared pin", []string{a}, nil},
		{"each its own", []string{"a.example:7500=" + a, "b.example:7500=" + b}, nil},
		{"one its own, the other the shared", []string{a, "b.example:7500=" + b}, nil},
		{"unknown endpoint", []string{a, "c.example:7500=" + b},
			[]string{"--server-fingerprint c.example:7500=" + b + " names c.example:7500, which is not a --server-endpoint (a.example:7500,b.example:7500)"}},
		{"spelt otherwise", []string{a, "B.example:7500=" + b}, []string{"write the endpoint exactly as in --server-endpoint"}},
		{"an endpoint without a pin", []string{"a.example:7500=" + a},
			[]string{"--server-endpoint b.example:7500 has no pin: add --server-fingerprint b.example:7500=sha256:HEX"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := transport.ParsePins(tc.entries)
			require.NoError(t, err)
			err = p.Check(eps)
			if len(tc.want) == 0 {
				require.NoError(t, err)
				return
			}
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}
