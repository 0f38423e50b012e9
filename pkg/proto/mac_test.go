package proto

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMACPoolReusedStates: a state taken back from the pool (Reset, not
// made anew) gives every message the MAC a new HMAC gives it.
func TestMACPoolReusedStates(t *testing.T) {
	t.Parallel()
	secret := []byte("a secret of more than 16 bytes")
	var p macPool
	p.init(secret)
	for _, msg := range []string{"first", "second, longer than one SHA-256 block: " + string(bytes.Repeat([]byte("x"), 80)), "", "third"} {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(msg))
		want := m.Sum(nil)
		require.Equal(t, want, p.sum(nil, []byte(msg)), "message %q", msg)
		require.True(t, p.verify([]byte(msg), want), "message %q", msg)
		require.False(t, p.verify([]byte(msg+"!"), want), "message %q changed", msg)
	}
}

// TestAppendFollowsTheSecret: headers signed one after the other with
// different secrets (a client's reload) carry each secret's key ID and MAC,
// not those of the secret signed with before; a Signer keeps its own copy
// of the secret; a nil one signs nothing.
func TestAppendFollowsTheSecret(t *testing.T) {
	t.Parallel()
	a, b := []byte("secret A, 16 bytes or more"), []byte("secret B, 16 bytes or more")
	kr, err := NewKeyring(Key{Name: "a", Secret: a}, Key{Name: "b", Secret: b})
	require.NoError(t, err)
	for _, secret := range [][]byte{a, b, a, a, b} {
		h := decodeWith(t, secret, true)
		require.Equal(t, KeyIDOf(secret), h.KeyID)
		k, err := kr.Verify(h)
		require.NoError(t, err)
		require.Equal(t, secret, k.Secret)
		require.NoError(t, h.Verify(secret))
	}
	buf := []byte("secret C, 16 bytes or more")
	sg := NewSigner(buf)
	copy(buf, "secret D") // the caller's bytes change: the signer keeps C
	hdr, err := NewHeader("tcp:127.0.0.1:22", time.Now())
	require.NoError(t, err)
	enc, err := hdr.AppendSigned(nil, sg)
	require.NoError(t, err)
	h, err := Decode(bytes.NewReader(enc))
	require.NoError(t, err)
	require.Equal(t, KeyIDOf([]byte("secret C, 16 bytes or more")), h.KeyID)
	require.NoError(t, h.Verify([]byte("secret C, 16 bytes or more")))

	enc, err = hdr.AppendSigned(nil, nil)
	require.NoError(t, err)
	h, err = Decode(bytes.NewReader(enc))
	require.NoError(t, err)
	require.False(t, h.HasMAC, "no secret, no MAC")
}

// TestHeaderMACAllocations: signing and verifying a header reuse the
// secret's HMAC states (a new HMAC-SHA256 is several allocations per
// tunnel on each side).
func TestHeaderMACAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("with the race detector, sync.Pool drops some of what it is given back")
	}
	secret := []byte("a secret of more than 16 bytes")
	kr, err := NewKeyring(Key{Secret: secret})
	require.NoError(t, err)
	h, err := NewHeader("tcp:127.0.0.1:22", time.Now())
	require.NoError(t, err)
	buf := make([]byte, 0, 256)
	b, err := h.Append(buf, secret)
	require.NoError(t, err)
	d, err := Decode(bytes.NewReader(b))
	require.NoError(t, err)
	verify := testing.AllocsPerRun(100, func() {
		if _, err := kr.Verify(d); err != nil {
			t.Fatal(err)
		}
	})
	sg := NewSigner(secret)
	sign := testing.AllocsPerRun(100, func() {
		if _, err := h.AppendSigned(buf, sg); err != nil {
			t.Fatal(err)
		}
	})
	require.LessOrEqual(t, verify, 1.0, "allocations per Keyring.Verify")
	require.LessOrEqual(t, sign, 1.0, "allocations per Header.AppendSigned")
}
