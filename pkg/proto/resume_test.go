package proto

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHeaderResumeID: a resume ID rides in the header with any kind and
// key, is covered by the MAC and leaves the bytes after the header alone;
// a header without it decodes as before.
func TestHeaderResumeID(t *testing.T) {
	t.Parallel()
	secret := []byte("k")
	for _, kind := range []Kind{KindTCP, KindUDP, KindResume} {
		for _, withID := range []bool{false, true} {
			h, err := NewHeader("tcp:127.0.0.1:22", time.Unix(1_700_000_000, 0))
			require.NoError(t, err)
			h.Kind = kind
			if withID {
				h.HasResumeID = true
				h.ResumeID = [ResumeIDLen]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
			}
			b, err := h.Append(nil, secret)
			require.NoError(t, err)
			require.LessOrEqual(t, len(b), MaxHeaderLen)
			r := bytes.NewReader(append(b, "after"...))
			got, err := Decode(r)
			require.NoError(t, err, "kind %s id %v", kind, withID)
			assert.Equal(t, kind, got.Kind)
			assert.Equal(t, withID, got.HasResumeID)
			assert.Equal(t, h.ResumeID, got.ResumeID)
			assert.Equal(t, h.Token, got.Token)
			require.NoError(t, got.Verify(secret))
			rest, _ := io.ReadAll(r)
			assert.Equal(t, "after", string(rest))

			// The ID is signed: changing one of its bytes fails the MAC.
			if withID {
				b[len(b)-MACLen-1] ^= 1
				bad, err := Decode(bytes.NewReader(b))
				require.NoError(t, err)
				require.ErrorIs(t, bad.Verify(secret), ErrAuth)
			}
		}
	}
}
