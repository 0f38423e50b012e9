package proto

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// manyKeys returns n named keys with distinct secrets.
func manyKeys(n int) []Key {
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = Key{Name: fmt.Sprintf("user-%d", i), Secret: fmt.Appendf(nil, "secret of user %d, long enough", i)}
	}
	return keys
}

// collidingSecrets returns two distinct secrets with the same 4-byte key ID
// (found by a deterministic search: the same pair every run).
func collidingSecrets(t *testing.T) (a, b []byte) {
	t.Helper()
	seen := map[KeyID][]byte{}
	for i := range 1 << 20 {
		s := fmt.Appendf(nil, "colliding secret %d", i)
		id := KeyIDOf(s)
		if prev, ok := seen[id]; ok {
			return prev, s
		}
		seen[id] = s
	}
	t.Fatal("no collision among 2^20 secrets")
	return nil, nil
}

// TestKeyringManyKeys (issue 35 item 5): 10,000 keys load; each header is
// verified with the key its ID names, the last as the first.
func TestKeyringManyKeys(t *testing.T) {
	t.Parallel()
	keys := manyKeys(10_000)
	kr, err := NewKeyring(keys...)
	require.NoError(t, err)
	assert.Equal(t, 10_000, kr.Len())
	for _, i := range []int{0, 4999, 9999} {
		k, err := kr.Verify(decodeWith(t, keys[i].Secret, true))
		require.NoError(t, err)
		assert.Equal(t, keys[i].Name, k.Name)
	}
	_, err = kr.Verify(decodeWith(t, []byte("nobody's secret, long enough"), true))
	require.ErrorIs(t, err, ErrUnknownKey)

	_, err = NewKeyring(manyKeys(MaxKeys + 1)...)
	require.ErrorContains(t, err, "at most")
}

// TestKeyringCollidingIDs: two keys whose 4-byte IDs collide are both held
// and each header verifies with its own key, not refused as "the same
// secret" (about 1 % of 10,000-key files hold such a pair).
func TestKeyringCollidingIDs(t *testing.T) {
	t.Parallel()
	a, b := collidingSecrets(t)
	require.Equal(t, KeyIDOf(a), KeyIDOf(b))
	kr, err := NewKeyring(Key{Name: "a", Secret: a}, Key{Name: "b", Secret: b})
	require.NoError(t, err)
	for name, s := range map[string][]byte{"a": a, "b": b} {
		k, err := kr.Verify(decodeWith(t, s, true))
		require.NoError(t, err)
		assert.Equal(t, name, k.Name)
	}
	assert.NotEqual(t, kr.Keys()[0].Digest(), kr.Keys()[1].Digest())
	_, err = NewKeyring(Key{Name: "a", Secret: a}, Key{Name: "a2", Secret: append([]byte(nil), a...)})
	require.ErrorContains(t, err, "the same secret as key 1")
}

// TestKeyringLegacyHeadersTryFirstKeys: a header without a key ID (a client
// from before key IDs) is tried against the first MaxLegacyKeys keys only,
// so its cost stays bounded with thousands of keys.
func TestKeyringLegacyHeadersTryFirstKeys(t *testing.T) {
	t.Parallel()
	keys := manyKeys(1000)
	kr, err := NewKeyring(keys...)
	require.NoError(t, err)
	k, err := kr.Verify(decodeWith(t, keys[MaxLegacyKeys-1].Secret, false))
	require.NoError(t, err)
	assert.Equal(t, keys[MaxLegacyKeys-1].Name, k.Name)
	_, err = kr.Verify(decodeWith(t, keys[MaxLegacyKeys].Secret, false))
	require.ErrorIs(t, err, ErrAuth)
}

// BenchmarkKeyringVerify is the per-stream cost of finding and checking a
// header's key with 16 and with 10,000 keys (the last key: a list would
// scan them all).
func BenchmarkKeyringVerify(b *testing.B) {
	for _, n := range []int{16, 10_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			keys := manyKeys(n)
			kr, err := NewKeyring(keys...)
			require.NoError(b, err)
			h := decodeWith(b, keys[n-1].Secret, true)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := kr.Verify(h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNewKeyring10000 is building a ring of 10,000 keys (at start and
// each reload).
func BenchmarkNewKeyring10000(b *testing.B) {
	keys := manyKeys(10_000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewKeyring(keys...); err != nil {
			b.Fatal(err)
		}
	}
}
