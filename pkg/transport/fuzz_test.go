package transport_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/transport"
)

// FuzzParseFingerprint checks that parsing never panics, that whatever parses
// re-encodes to a canonical form that parses to the same bytes, and that a
// Fingerprint always parses back to the certificate's SHA-256.
func FuzzParseFingerprint(f *testing.F) {
	for _, der := range [][]byte{nil, []byte("x"), make([]byte, 300)} {
		fp := transport.Fingerprint(der)
		f.Add(fp)
		f.Add(strings.ToUpper(fp))
		f.Add(strings.TrimPrefix(fp, "sha256:"))
	}
	f.Add("sha256:" + strings.Repeat("ab:", 31) + "ab")
	f.Add("sha256:")
	f.Add("::::")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := transport.ParseFingerprint(s)
		if err != nil {
			require.ErrorIs(t, err, transport.ErrBadFingerprint)
			require.Equal(t, [32]byte{}, got)
		} else {
			canonical := "sha256:" + hex.EncodeToString(got[:])
			again, err := transport.ParseFingerprint(canonical)
			require.NoError(t, err)
			require.Equal(t, got, again)
		}
		der := []byte(s)
		sum, err := transport.ParseFingerprint(transport.Fingerprint(der))
		require.NoError(t, err)
		require.Equal(t, sha256.Sum256(der), sum)
	})
}
