package proto

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBindTokens(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		token string
		want  Bind
		ok    bool
	}{
		{"bind/1/0/tcp:0.0.0.0:8022", Bind{0, "tcp:0.0.0.0:8022"}, true},
		{"bind/1/1023/unix:/run/a.sock", Bind{1023, "unix:/run/a.sock"}, true},
		{"bind/1/7/udp:[::]:53", Bind{7, "udp:[::]:53"}, true},
		{"bind/1/1024/tcp:0.0.0.0:1", Bind{}, false},
		{"bind/1/01/tcp:0.0.0.0:1", Bind{}, false},
		{"bind/1/-1/tcp:0.0.0.0:1", Bind{}, false},
		{"bind/1/1/", Bind{}, false},
		{"bind/1/1", Bind{}, false},
		{"bind/2/1/tcp:0.0.0.0:1", Bind{}, false},
		{"tcp:127.0.0.1:22", Bind{}, false},
	} {
		b, err := ParseBind(tc.token)
		if !tc.ok {
			require.ErrorIs(t, err, ErrBadBind, tc.token)
			continue
		}
		require.NoError(t, err, tc.token)
		assert.Equal(t, tc.want, b)
		assert.Equal(t, tc.token, b.Token())
	}
	id, err := ParseBoundToken(BoundToken(42))
	require.NoError(t, err)
	assert.Equal(t, 42, id)
	for _, bad := range []string{"bound/1/", "bound/1/x", "bound/1/2048", "bound/2/1", "tcp:127.0.0.1:22", "bound/1/1/tcp:127.0.0.1:22"} {
		_, err := ParseBoundToken(bad)
		require.ErrorIs(t, err, ErrBadBind, bad)
	}
	_, err = NewBind(Bind{ID: MaxBindID + 1, Listen: "tcp:0.0.0.0:1"}, time.Now())
	require.ErrorIs(t, err, ErrBadBind)
}

// TestBindHeaderRoundTrip: a bind's header decodes to its kind and token.
func TestBindHeaderRoundTrip(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef0123456789abcdef")
	h, err := NewBind(Bind{ID: 3, Listen: "tcp:0.0.0.0:8022"}, time.Now())
	require.NoError(t, err)
	b, err := h.Append(nil, secret)
	require.NoError(t, err)
	got, err := Decode(bytes.NewReader(b))
	require.NoError(t, err)
	require.NoError(t, got.Verify(secret))
	assert.Equal(t, KindReverse, got.Kind)
	bind, err := ParseBind(got.Token)
	require.NoError(t, err)
	assert.Equal(t, Bind{ID: 3, Listen: "tcp:0.0.0.0:8022"}, bind)
}

// FuzzParseBind: any token parses or fails with ErrBadBind, never panics;
// what parses encodes back to itself (one spelling per binding), and the
// same for bound tokens.
func FuzzParseBind(f *testing.F) {
	for _, s := range []string{"bind/1/0/tcp:0.0.0.0:8022", "bind/1/1023/unix:/x", "bound/1/5", "bind/1/01/x", "bound/1/", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if b, err := ParseBind(s); err == nil {
			if b.Token() != s || b.ID < 0 || b.ID > MaxBindID {
				t.Fatalf("ParseBind(%q) = %+v, encodes to %q", s, b, b.Token())
			}
		} else if !bytes.Contains([]byte(err.Error()), []byte(ErrBadBind.Error())) {
			t.Fatalf("ParseBind(%q): %v", s, err)
		}
		if id, err := ParseBoundToken(s); err == nil && BoundToken(id) != s {
			t.Fatalf("ParseBoundToken(%q) = %d, encodes to %q", s, id, BoundToken(id))
		}
	})
}
