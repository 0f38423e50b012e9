package proto

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func decodeWith(t testing.TB, secret []byte, keyID bool) *Header {
	t.Helper()
	h, err := NewHeader("tcp:127.0.0.1:22", time.Now())
	require.NoError(t, err)
	var b []byte
	if keyID {
		b, err = h.Append(nil, secret)
	} else {
		b, err = h.append(nil, secret, nil) // a client from before key IDs
	}
	require.NoError(t, err)
	got, err := Decode(bytes.NewReader(b))
	require.NoError(t, err)
	return got
}

func TestKeyring(t *testing.T) {
	t.Parallel()
	oldS, newS, other := []byte("the old secret, 16+"), []byte("the new secret, 16+"), []byte("someone else's secret")
	kr, err := NewKeyring(Key{Name: "old", Secret: oldS}, Key{Secret: newS})
	require.NoError(t, err)
	assert.Equal(t, 2, kr.Len())

	for _, keyID := range []bool{true, false} {
		k, err := kr.Verify(decodeWith(t, oldS, keyID))
		require.NoError(t, err, "keyID=%v", keyID)
		assert.Equal(t, "old", k.Label())
		k, err = kr.Verify(decodeWith(t, newS, keyID))
		require.NoError(t, err, "keyID=%v", keyID)
		assert.Equal(t, KeyIDOf(newS).String(), k.Label(), "an unnamed key is named by its ID")
	}
	_, err = kr.Verify(decodeWith(t, other, true))
	require.ErrorIs(t, err, ErrUnknownKey)
	require.ErrorIs(t, err, ErrAuth)
	_, err = kr.Verify(decodeWith(t, other, false))
	require.ErrorIs(t, err, ErrAuth)
	_, err = kr.Verify(decodeWith(t, nil, false))
	require.ErrorIs(t, err, ErrNoMAC)

	// A header naming a key but MACed with another secret fails.
	h, err := NewHeader("tcp:127.0.0.1:22", time.Now())
	require.NoError(t, err)
	id := KeyIDOf(oldS)
	b, err := h.append(nil, other, &id)
	require.NoError(t, err)
	forged, err := Decode(bytes.NewReader(b))
	require.NoError(t, err)
	_, err = kr.Verify(forged)
	require.ErrorIs(t, err, ErrAuth)
	require.NotErrorIs(t, err, ErrUnknownKey)

	var none *Keyring
	assert.Zero(t, none.Len())
}

func TestNewKeyringErrors(t *testing.T) {
	t.Parallel()
	_, err := NewKeyring(Key{Secret: []byte("a")}, Key{Secret: []byte("a")})
	require.ErrorContains(t, err, "the same secret")
	_, err = NewKeyring(Key{Name: "x", Secret: []byte("a")}, Key{Name: "x", Secret: []byte("b")})
	require.ErrorContains(t, err, "the same name")
	_, err = NewKeyring(Key{})
	require.ErrorContains(t, err, "empty secret")
	many := make([]Key, MaxKeys+1)
	for i := range many {
		many[i].Secret = []byte{byte(i) + 1}
	}
	_, err = NewKeyring(many...)
	require.ErrorContains(t, err, "at most")
}

// TestNewKeyringRefusesNameOfAKeyID: a key named like another key's ID (how
// logs and --allow-for key=... name an unnamed key) would share that key's
// identity, so it is refused; any name that is no key's ID is fine.
func TestNewKeyringRefusesNameOfAKeyID(t *testing.T) {
	t.Parallel()
	unnamed, named := []byte("the --secret-file secret"), []byte("a --keys-file secret")
	for _, tc := range []struct {
		name    string
		keys    []Key
		wantErr string
	}{
		{"the hex label of the unnamed key", []Key{{Secret: unnamed}, {Name: KeyIDOf(unnamed).String(), Secret: named}},
			`key 2: the name "` + KeyIDOf(unnamed).String() + `" is the ID of key 1 (the unnamed key`},
		{"the unnamed key listed after", []Key{{Name: KeyIDOf(unnamed).String(), Secret: named}, {Secret: unnamed}},
			`key 1: the name "` + KeyIDOf(unnamed).String() + `" is the ID of key 2 (the unnamed key`},
		{"the ID of another named key", []Key{{Name: "a", Secret: unnamed}, {Name: KeyIDOf(unnamed).String(), Secret: named}},
			"is the ID of key 1"},
		{"its own ID", []Key{{Name: KeyIDOf(named).String(), Secret: named}}, "is the ID of key 1"},
		{"a hex name that is no key's ID", []Key{{Secret: unnamed}, {Name: "0badc0de", Secret: named}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kr, err := NewKeyring(tc.keys...)
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Equal(t, len(tc.keys), kr.Len())
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
			assert.ErrorContains(t, err, "a key's ID names the unnamed key in logs and --allow-for key=ID rules; pick another name")
		})
	}
}

// TestKeyLabelMadeOnce: a keyring's keys have their label made when the
// ring is (an unnamed key's hex ID, logged and matched for every tunnel),
// not for each call.
func TestKeyLabelMadeOnce(t *testing.T) {
	kr, err := NewKeyring(Key{Secret: []byte("an unnamed key's secret")}, Key{Name: "alice", Secret: []byte("alice's secret, 16+")})
	require.NoError(t, err)
	keys := kr.Keys()
	require.Equal(t, keys[0].ID.String(), keys[0].Label())
	require.Equal(t, "alice", keys[1].Label())
	require.Equal(t, keys[0].ID.String(), Key{Secret: keys[0].Secret, ID: keys[0].ID}.Label(), "a key outside a ring: made on the call")
	if raceEnabled {
		return
	}
	require.Zero(t, testing.AllocsPerRun(100, func() { _ = keys[0].Label() }))
}
