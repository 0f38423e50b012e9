package token

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/endpoint"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestNewParser(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, plugin, key string
		wantErr           bool
	}{
		{"cleartext", "Cleartext", "", false},
		{"lower", "cleartext", "", false},
		{"base64", "Cleartext", "base64", false},
		{"BASE64", "CLEARTEXT", "BASE64", false},
		{"unknown key", "Cleartext", "aes", true},
		{"unknown plugin", "Jwt", "", true},
		{"empty plugin", "", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := NewParser(tc.plugin, tc.key)
			if tc.wantErr {
				require.ErrorIs(t, err, ErrUnknownPlugin)
				assert.Nil(t, p)
				return
			}
			require.NoError(t, err)
			assert.NotNil(t, p)
		})
	}
}

func TestCleartextParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, key, token string
		want             endpoint.Endpoint
		wantErr          error
	}{
		{"tcp", "", "tcp:127.0.0.1:22", endpoint.Endpoint{Network: "tcp", Address: "127.0.0.1:22"}, nil},
		{"tcp v6", "", "tcp:[::1]:22", endpoint.Endpoint{Network: "tcp", Address: "[::1]:22"}, nil},
		{"unix", "", "unix:/run/app.sock", endpoint.Endpoint{Network: "unix", Address: "/run/app.sock"}, nil},
		{"base64 tcp", "base64", b64("tcp:10.0.0.1:5432"), endpoint.Endpoint{Network: "tcp", Address: "10.0.0.1:5432"}, nil},
		{"base64 unix", "base64", b64("unix:/run/a/../b.sock"), endpoint.Endpoint{Network: "unix", Address: "/run/b.sock"}, nil},
		{"empty", "", "", endpoint.Endpoint{}, ErrInvalidToken},
		{"bad endpoint", "", "tcp:127.0.0.1", endpoint.Endpoint{}, endpoint.ErrInvalidEndpoint},
		{"quic-tun bare address", "", "127.0.0.1:22", endpoint.Endpoint{}, ErrInvalidToken},
		{"base64 of bad", "base64", b64("sctp:1.2.3.4:5"), endpoint.Endpoint{}, ErrInvalidToken},
		{"udp", "", "udp:1.2.3.4:53", endpoint.Endpoint{Network: "udp", Address: "1.2.3.4:53"}, nil},
		{"not base64", "base64", "tcp:127.0.0.1:22", endpoint.Endpoint{}, ErrInvalidToken},
		{"base64 unpadded", "base64", strings.TrimRight(b64("tcp:1.2.3.4:5"), "="), endpoint.Endpoint{}, ErrInvalidToken},
		{"too long", "", "unix:/" + strings.Repeat("a", MaxTokenLen), endpoint.Endpoint{}, ErrTokenTooLong},
		{"too long base64", "base64", strings.Repeat("QUFB", MaxTokenLen/4+1), endpoint.Endpoint{}, ErrTokenTooLong},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := NewParser("Cleartext", tc.key)
			require.NoError(t, err)
			got, err := p.Parse(tc.token)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func FuzzCleartextParse(f *testing.F) {
	for _, s := range []string{"tcp:127.0.0.1:22", "tcp:[::1]:22", "unix:/run/app.sock", "tcp:db.internal:5432"} {
		f.Add(s, false)
		f.Add(b64(s), true)
	}
	f.Fuzz(func(t *testing.T, token string, useBase64 bool) {
		key := ""
		if useBase64 {
			key = KeyBase64
		}
		p, err := NewParser("Cleartext", key)
		require.NoError(t, err)
		e, err := p.Parse(token)
		if err != nil {
			return
		}
		// A parsed token's canonical form parses to the same endpoint.
		canon := e.String()
		if useBase64 {
			canon = b64(canon)
		}
		if len(canon) <= MaxTokenLen {
			again, err := p.Parse(canon)
			require.NoError(t, err)
			require.Equal(t, e, again)
		}
	})
}
