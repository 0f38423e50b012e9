package token

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func tcpAddr(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func TestNewSourcePlugins(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "127.0.0.1 tcp:127.0.0.1:22\n")
	tests := []struct {
		name, plugin, source string
		wantErr              error
	}{
		{"fixed", "Fixed", "tcp:127.0.0.1:22", nil},
		{"fixed lower", "fixed", "tcp:127.0.0.1:22", nil},
		{"fixed upper", "FIXED", "unix:/run/x.sock", nil},
		{"fixed base64", "Fixed", "dGNwOjEyNy4wLjAuMToyMg==", nil},
		{"fixed not an endpoint", "Fixed", "tcp:bad", ErrBadSource},
		{"fixed empty", "Fixed", "", ErrBadSource},
		{"fixed too long", "Fixed", strings.Repeat("a", MaxTokenLen+1), ErrTokenTooLong},
		{"file", "file", file, nil},
		{"file missing", "File", filepath.Join(t.TempDir(), "nope"), ErrBadSource},
		{"http", "HTTP", "http://127.0.0.1:1/token", nil},
		{"http bad scheme", "Http", "ftp://x/y", ErrBadSource},
		{"http no host", "Http", "http:///y", ErrBadSource},
		{"http bad url", "Http", "http://[::1", ErrBadSource},
		{"unknown", "Vault", "x", ErrUnknownPlugin},
		{"empty plugin", "", "x", ErrUnknownPlugin},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := NewSource(tc.plugin, tc.source, nil)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				assert.Nil(t, s)
				return
			}
			require.NoError(t, err)
			assert.NotNil(t, s)
		})
	}
}

func TestFixedSource(t *testing.T) {
	t.Parallel()
	s, err := NewSource("Fixed", "tcp:10.0.0.1:22", nil)
	require.NoError(t, err)
	for _, a := range []net.Addr{tcpAddr("1.2.3.4:5"), &net.UnixAddr{Name: "@", Net: "unix"}, nil} {
		tok, err := s.Token(context.Background(), a)
		require.NoError(t, err)
		assert.Equal(t, "tcp:10.0.0.1:22", tok)
	}
}

func TestFileSource(t *testing.T) {
	t.Parallel()
	content := `# tokens by client
10.0.0.0/8      tcp:10.0.0.1:5432
10.1.0.0/16     tcp:10.1.0.1:5432   # more specific
10.1.2.3        tcp:10.1.2.3:22

192.168.0.0/16  dGNwOjEyNy4wLjAuMToyMg==
fd00::/8        tcp:[fd00::1]:22
::1             tcp:[::1]:22
`
	src, err := NewSource("File", writeFile(t, content), nil)
	require.NoError(t, err)
	withDefault, err := NewSource("File", writeFile(t, content+"*  tcp:127.0.0.1:1\n"), nil)
	require.NoError(t, err)

	tests := []struct {
		name    string
		addr    net.Addr
		want    string
		wantDef string
	}{
		{"exact", tcpAddr("10.1.2.3:40000"), "tcp:10.1.2.3:22", "tcp:10.1.2.3:22"},
		{"16 beats 8", tcpAddr("10.1.9.9:1"), "tcp:10.1.0.1:5432", "tcp:10.1.0.1:5432"},
		{"8", tcpAddr("10.2.0.1:1"), "tcp:10.0.0.1:5432", "tcp:10.0.0.1:5432"},
		{"base64 token", tcpAddr("192.168.1.1:1"), "dGNwOjEyNy4wLjAuMToyMg==", "dGNwOjEyNy4wLjAuMToyMg=="},
		{"v6", tcpAddr("[fd00::5]:1"), "tcp:[fd00::1]:22", "tcp:[fd00::1]:22"},
		{"v6 loopback", tcpAddr("[::1]:1"), "tcp:[::1]:22", "tcp:[::1]:22"},
		{"mapped v4", tcpAddr("[::ffff:10.1.2.3]:1"), "tcp:10.1.2.3:22", "tcp:10.1.2.3:22"},
		{"no match", tcpAddr("8.8.8.8:1"), "", "tcp:127.0.0.1:1"},
		{"unix peer", &net.UnixAddr{Name: "", Net: "unix"}, "", "tcp:127.0.0.1:1"},
		{"nil addr", nil, "", "tcp:127.0.0.1:1"},
		{"udp addr", &net.UDPAddr{IP: net.ParseIP("10.1.2.3"), Port: 1}, "tcp:10.1.2.3:22", "tcp:10.1.2.3:22"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := src.Token(context.Background(), tc.addr)
			if tc.want == "" {
				require.ErrorIs(t, err, ErrNoToken)
			} else {
				require.NoError(t, err)
				assert.Equal(t, tc.want, got)
			}
			got, err = withDefault.Token(context.Background(), tc.addr)
			require.NoError(t, err)
			assert.Equal(t, tc.wantDef, got)
		})
	}
}

func TestFileSourceErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, content, wantSub string
	}{
		{"one field", "# c\n10.0.0.1\n", ":2: want"},
		{"three fields", "10.0.0.1 a b\n", ":1: want"},
		{"bad ip", "\n\n10.0.0.300 tcp:h:1\n", ":3: "},
		{"bad cidr", "10.0.0.0/40 tcp:h:1\n", ":1: "},
		{"zone", "fe80::1%eth0 tcp:h:1\n", "zoned"},
		{"duplicate", "10.0.0.0/8 tcp:a:1\n10.0.0.0/8 tcp:b:1\n", ":2: duplicate entry for 10.0.0.0/8 (first on line 1)"},
		{"duplicate unmasked", "10.0.0.0/8 tcp:a:1\n10.1.0.0/8 tcp:b:1\n", ":2: duplicate"},
		{"duplicate default", "* tcp:a:1\n* tcp:b:1\n", ":2: duplicate default"},
		{"token too long", "10.0.0.1 " + strings.Repeat("x", MaxTokenLen+1) + "\n", ":1: token too long"},
		{"empty", "# nothing\n\n", "no entries"},
		{"not an endpoint", "10.0.0.1 tcp:bad\n", ":1: \"tcp:bad\" is not tcp:HOST:PORT"},
		{"line too long", strings.Repeat("x", 4096) + " y\n", "too long"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := writeFile(t, tc.content)
			_, err := NewSource("File", p, nil)
			require.ErrorIs(t, err, ErrBadSource)
			assert.Contains(t, err.Error(), tc.wantSub)
			if strings.Contains(tc.wantSub, ":") && strings.HasPrefix(tc.wantSub, ":") {
				assert.Contains(t, err.Error(), p+tc.wantSub[:2], "error must name file:line")
			}
		})
	}
}

func TestFileSourceReadOnce(t *testing.T) {
	t.Parallel()
	p := writeFile(t, "10.0.0.1 tcp:first:1\n")
	s, err := NewSource("File", p, nil)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, []byte("10.0.0.1 tcp:second:1\n"), 0o600))
	tok, err := s.Token(context.Background(), tcpAddr("10.0.0.1:1"))
	require.NoError(t, err)
	assert.Equal(t, "tcp:first:1", tok)
}

func TestHTTPSource(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    string
		wantErr error
		wantSub string
	}{
		{"ok", func(w http.ResponseWriter, r *http.Request) {
			_ = json.NewEncoder(w).Encode(map[string]string{"token": "tok-for-" + r.URL.Query().Get("addr")})
		}, "tok-for-10.1.2.3", nil, ""},
		{"keeps query", func(w http.ResponseWriter, r *http.Request) {
			_ = json.NewEncoder(w).Encode(map[string]string{"token": r.URL.Query().Get("team") + "/" + r.URL.Query().Get("addr")})
		}, "a/10.1.2.3", nil, ""},
		{"extra fields ok", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"token":"t","ttl":3}`))
		}, "t", nil, ""},
		{"status 500", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "secret-ish body", http.StatusInternalServerError)
		}, "", ErrBadResponse, "status 500"},
		{"status 404", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNotFound)
		}, "", ErrBadResponse, "status 404"},
		{"bad json", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"token":`))
		}, "", ErrBadResponse, ""},
		{"missing token", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"tok":"x"}`))
		}, "", ErrNoToken, ""},
		{"empty token", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"token":""}`))
		}, "", ErrNoToken, ""},
		{"token not string", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"token":5}`))
		}, "", ErrBadResponse, ""},
		{"token too long", func(w http.ResponseWriter, _ *http.Request) {
			_ = json.NewEncoder(w).Encode(map[string]string{"token": strings.Repeat("x", MaxTokenLen+1)})
		}, "", ErrTokenTooLong, ""},
		{"body too large", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"token":"t","pad":"` + strings.Repeat("x", 64<<10) + `"}`))
		}, "", ErrBadResponse, "larger than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(tc.handler)
			t.Cleanup(srv.Close)
			s, err := NewSource("Http", srv.URL+"/token?team=a", srv.Client())
			require.NoError(t, err)
			got, err := s.Token(context.Background(), tcpAddr("10.1.2.3:5555"))
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				assert.Contains(t, err.Error(), tc.wantSub)
				assert.NotContains(t, err.Error(), "secret-ish")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestHTTPSourceSendsClientIPOnly(t *testing.T) {
	t.Parallel()
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.URL.RawQuery
		_, _ = w.Write([]byte(`{"token":"t"}`))
	}))
	t.Cleanup(srv.Close)
	s, err := NewSource("http", srv.URL, nil)
	require.NoError(t, err)
	_, err = s.Token(context.Background(), tcpAddr("[::ffff:10.0.0.7]:999"))
	require.NoError(t, err)
	assert.Equal(t, "addr=10.0.0.7", <-got)
	_, err = s.Token(context.Background(), &net.UnixAddr{Net: "unix"})
	require.NoError(t, err)
	assert.Equal(t, "addr=", <-got)
}

func TestHTTPSourceHonoursContext(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	s, err := NewSource("Http", srv.URL, srv.Client())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = s.Token(ctx, tcpAddr("10.0.0.1:1"))
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestHTTPSourceUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	s, err := NewSource("Http", "http://"+addr+"/", nil)
	require.NoError(t, err)
	_, err = s.Token(context.Background(), tcpAddr("10.0.0.1:1"))
	require.Error(t, err)
}
