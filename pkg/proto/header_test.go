package proto

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHeaderRoundTrip(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name   string
		token  string
		secret []byte
	}{
		{"plain", "tcp:127.0.0.1:22", nil},
		{"mac", "tcp:[::1]:5432", []byte("s3cret")},
		{"max token", strings.Repeat("x", MaxTokenLen), []byte("k")},
		{"unix", "unix:/run/app.sock", []byte("k")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, err := NewHeader(tc.token, now)
			require.NoError(t, err)
			b, err := h.Append(nil, tc.secret)
			require.NoError(t, err)
			require.LessOrEqual(t, len(b), MaxHeaderLen)
			payload := []byte("application bytes follow")
			r := bytes.NewReader(append(b, payload...))
			got, err := Decode(r)
			require.NoError(t, err)
			assert.Equal(t, tc.token, got.Token)
			assert.Equal(t, h.Nonce, got.Nonce)
			assert.True(t, now.Equal(got.Time))
			assert.Equal(t, len(tc.secret) > 0, got.HasMAC)
			assert.Equal(t, len(tc.secret) > 0, got.HasKeyID)
			if len(tc.secret) > 0 {
				assert.Equal(t, KeyIDOf(tc.secret), got.KeyID)
			}
			rest, err := io.ReadAll(r)
			require.NoError(t, err)
			assert.Equal(t, payload, rest, "Decode must not consume bytes past the header")
			if len(tc.secret) > 0 {
				require.NoError(t, got.Verify(tc.secret))
				require.ErrorIs(t, got.Verify([]byte("wrong")), ErrAuth)
			} else {
				require.ErrorIs(t, got.Verify([]byte("any")), ErrAuth)
			}
		})
	}
}

func TestHeaderTamperDetected(t *testing.T) {
	t.Parallel()
	h, err := NewHeader("tcp:127.0.0.1:22", time.Now())
	require.NoError(t, err)
	b, err := h.Append(nil, []byte("k"))
	require.NoError(t, err)
	for i := 2; i < len(b); i++ { // version and flags are checked structurally
		c := bytes.Clone(b)
		c[i] ^= 0x01
		got, err := Decode(bytes.NewReader(c))
		if err != nil {
			continue // a length change makes the header malformed, which is fine
		}
		require.ErrorIs(t, got.Verify([]byte("k")), ErrAuth, "flipping byte %d went unnoticed", i)
	}
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	valid, err := (&Header{Token: "tcp:1.2.3.4:5"}).Append(nil, nil)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrBadHeader},
		{"short", valid[:10], ErrBadHeader},
		{"version", append([]byte{9}, valid[1:]...), ErrUnsupportedVersion},
		{"flags", append([]byte{1, 0x80}, valid[2:]...), ErrBadHeader},
		{"zero token", append(bytes.Clone(valid[:26]), 0, 0), ErrBadHeader},
		{"huge token", append(bytes.Clone(valid[:26]), 0xff, 0xff), ErrBadHeader},
		{"truncated token", valid[:len(valid)-1], ErrBadHeader},
		{"missing mac", append([]byte{1, 1}, valid[2:]...), ErrBadHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Decode(bytes.NewReader(tc.in))
			require.ErrorIs(t, err, tc.want)
		})
	}
}

func TestAppendRejectsBadToken(t *testing.T) {
	t.Parallel()
	_, err := (&Header{}).Append(nil, nil)
	require.ErrorIs(t, err, ErrBadHeader)
	_, err = (&Header{Token: strings.Repeat("a", MaxTokenLen+1)}).Append(nil, nil)
	require.ErrorIs(t, err, ErrBadHeader)
}

func TestReply(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	require.NoError(t, WriteReply(&buf, CodeOK))
	require.NoError(t, WriteReply(&buf, CodeRefused))
	require.NoError(t, ReadReply(&buf))
	err := ReadReply(&buf)
	require.ErrorIs(t, err, &RemoteError{Code: CodeRefused})
	require.NotErrorIs(t, err, &RemoteError{Code: CodeDialFailed})
	require.ErrorIs(t, ReadReply(&buf), io.EOF)
}

func TestFromError(t *testing.T) {
	t.Parallel()
	c, ok := FromError(&quic.StreamError{ErrorCode: quic.StreamErrorCode(CodeDialFailed), Remote: true})
	require.True(t, ok)
	assert.Equal(t, CodeDialFailed, c)
	_, ok = FromError(&quic.StreamError{ErrorCode: 2, Remote: false})
	assert.False(t, ok, "a locally cancelled stream carries no peer code")
	c, ok = FromError(&quic.ApplicationError{ErrorCode: quic.ApplicationErrorCode(CodeAuthFailed), Remote: true})
	require.True(t, ok)
	assert.Equal(t, CodeAuthFailed, c)
	_, ok = FromError(errors.New("x"))
	assert.False(t, ok)
	assert.Equal(t, "refused", CodeRefused.String())
	assert.Equal(t, "code_200", Code(200).String())
	assert.Len(t, AllCodes(), int(CodeResumeRefused)+1)
	names := CodeNames()
	require.Len(t, names, len(AllCodes()))
	for _, c := range AllCodes() {
		assert.Equal(t, c.String(), names[c])
	}
}

func FuzzDecode(f *testing.F) {
	for _, tok := range []string{"tcp:127.0.0.1:22", "unix:/x", strings.Repeat("z", 300)} {
		for _, secret := range [][]byte{nil, []byte("k")} {
			h, err := NewHeader(tok, time.Unix(1, 0))
			if err != nil {
				f.Fatal(err)
			}
			b, err := h.Append(nil, secret)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	if b, err := (&Header{Token: "tcp:1.2.3.4:5"}).append(nil, []byte("k"), nil); err == nil {
		f.Add(b) // a client from before key IDs
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		h, err := Decode(r)
		if err != nil {
			return
		}
		consumed := len(in) - r.Len()
		if consumed > MaxHeaderLen {
			t.Fatalf("consumed %d > MaxHeaderLen", consumed)
		}
		// Re-encoding a decoded header must give back the same bytes.
		var secret []byte
		if h.HasMAC {
			secret = []byte("k") // MAC bytes differ; compare only the signed part
		}
		var id *KeyID
		if h.HasKeyID {
			id = &h.KeyID
		}
		b, err := h.append(nil, secret, id)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if !bytes.Equal(b[:len(h.signed)], in[:len(h.signed)]) {
			t.Fatalf("round trip mismatch")
		}
	})
}

func TestHeaderKind(t *testing.T) {
	t.Parallel()
	for _, k := range []Kind{0, KindTCP, KindUDP, KindReverse, 9} {
		h, err := NewHeader("udp:127.0.0.1:53", time.Unix(1, 0))
		require.NoError(t, err)
		h.Kind = k
		b, err := h.Append(nil, []byte("k"))
		require.NoError(t, err)
		got, err := Decode(bytes.NewReader(b))
		require.NoError(t, err)
		want := k
		if k == 0 {
			want = KindTCP
		}
		assert.Equal(t, want, got.Kind, "kind %d", k)
		assert.Equal(t, k != 0 && k != KindTCP, b[1]&flagKind != 0, "a TCP stream carries no kind, so older servers still read it")
		require.NoError(t, got.Verify([]byte("k")), "the kind is covered by the MAC")
		tampered := bytes.Clone(b)
		if b[1]&flagKind != 0 {
			tampered[len(b)-MACLen-1] ^= 0x07
			if g, err := Decode(bytes.NewReader(tampered)); err == nil {
				require.ErrorIs(t, g.Verify([]byte("k")), ErrAuth)
			}
		}
	}
	// The kind flag with kind 0 or 1 is malformed.
	h := &Header{Token: "tcp:1.2.3.4:5", Kind: KindUDP}
	b, err := h.append(nil, nil, nil)
	require.NoError(t, err)
	b[len(b)-1] = byte(KindTCP)
	_, err = Decode(bytes.NewReader(b))
	require.ErrorIs(t, err, ErrBadHeader)
}

func TestTunnelID(t *testing.T) {
	t.Parallel()
	h := &Header{}
	for i := range h.Nonce {
		h.Nonce[i] = byte(i * 17)
	}
	assert.Equal(t, "00112233-4455-6677-8899-aabbccddeeff", h.TunnelID())
	a, err := NewHeader("tcp:127.0.0.1:22", time.Now())
	require.NoError(t, err)
	b, err := NewHeader("tcp:127.0.0.1:22", time.Now())
	require.NoError(t, err)
	assert.NotEqual(t, a.TunnelID(), b.TunnelID(), "each header's nonce is fresh")
	raw, err := a.Append(nil, []byte("0123456789abcdef"))
	require.NoError(t, err)
	got, err := Decode(bytes.NewReader(raw))
	require.NoError(t, err)
	assert.Equal(t, a.TunnelID(), got.TunnelID(), "the server reads the same ID")
}
