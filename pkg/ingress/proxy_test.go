package ingress

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/socks5"
)

func TestAssociateSource(t *testing.T) {
	t.Parallel()
	control := netip.MustParseAddr("127.0.0.1")
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name     string
		declared socks5.Addr
		packets  []string // sources, in order
		want     []bool
	}{
		{"zeros: first sender", socks5.Addr{IP: netip.IPv4Unspecified()},
			[]string{"127.0.0.2:5000", "127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5000"}, []bool{false, true, false, true}},
		{"no address at all: first sender", socks5.Addr{},
			[]string{"127.0.0.1:5001", "127.0.0.1:5000"}, []bool{true, false}},
		{"declared address and port", socks5.Addr{IP: control, Port: 5000},
			[]string{"127.0.0.1:5001", "127.0.0.1:5000", "127.0.0.1:5001"}, []bool{false, true, false}},
		{"declared port on the control address", socks5.Addr{IP: netip.IPv4Unspecified(), Port: 5000},
			[]string{"127.0.0.1:5001", "127.0.0.1:5000"}, []bool{false, true}},
		{"declared address, first port", socks5.Addr{IP: netip.MustParseAddr("127.0.0.3")},
			[]string{"127.0.0.1:5000", "127.0.0.3:6000", "127.0.0.3:6001"}, []bool{false, true, false}},
		{"IPv4-mapped source", socks5.Addr{IP: control, Port: 5000},
			[]string{"[::ffff:127.0.0.1]:5000"}, []bool{true}},
		{"declared by name: control address, declared port", socks5.Addr{Host: "localhost", Port: 5000},
			[]string{"127.0.0.1:5000", "127.0.0.1:5001"}, []bool{true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newAssociateSource(tc.declared, control)
			var got []bool
			for _, p := range tc.packets {
				got = append(got, s.accept(ap(p)))
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// proxyExchange runs p.Request on one end of a pipe while the application
// writes req on the other, and returns what the application read (until
// Request returned) with Request's results.
func proxyExchange(t *testing.T, p Proxy, req []byte) (answer []byte, token string, err error) {
	t.Helper()
	app, nc := net.Pipe()
	defer app.Close()
	type result struct {
		token string
		err   error
	}
	done := make(chan result, 1)
	go func() {
		tok, _, err := p.Request(nc)
		_ = nc.Close()
		done <- result{tok, err}
	}()
	_ = app.SetDeadline(time.Now().Add(5 * time.Second))
	go func() { _, _ = app.Write(req) }()
	answer, _ = io.ReadAll(app)
	r := <-done
	return answer, r.token, r.err
}

func TestHTTPConnectProxyAuthorization(t *testing.T) {
	t.Parallel()
	creds := NewProxyCredentials(socks5.Users{{User: "app", Password: "s3cret"}})
	basic := func(userPass string) string {
		return "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(userPass)) + "\r\n"
	}
	for _, tc := range []struct {
		name       string
		creds      *ProxyCredentials
		header     string
		wantReason string // "" : accepted
	}{
		{name: "no credentials required", creds: nil},
		{name: "credentials required but none set", creds: NewProxyCredentials(nil)},
		{name: "right pair", creds: creds, header: basic("app:s3cret")},
		{name: "scheme in lower case", creds: creds, header: "Proxy-Authorization: basic " + base64.StdEncoding.EncodeToString([]byte("app:s3cret")) + "\r\n"},
		{name: "no header", creds: creds, wantReason: ProxyAuthMissing},
		{name: "another scheme", creds: creds, header: "Proxy-Authorization: Bearer abc\r\n", wantReason: ProxyAuthMissing},
		{name: "wrong password", creds: creds, header: basic("app:wrong"), wantReason: ProxyAuthWrong},
		{name: "no colon", creds: creds, header: basic("app"), wantReason: ProxyAuthWrong},
		{name: "not base64", creds: creds, header: "Proxy-Authorization: Basic !!!\r\n", wantReason: ProxyAuthWrong},
		{name: "in Authorization, not Proxy-Authorization", creds: creds,
			header: "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("app:s3cret")) + "\r\n", wantReason: ProxyAuthMissing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := "CONNECT db.internal:5432 HTTP/1.1\r\nHost: db.internal:5432\r\n" + tc.header + "\r\n"
			answer, token, err := proxyExchange(t, HTTPConnect{Credentials: tc.creds}, []byte(req))
			if tc.wantReason == "" {
				require.NoError(t, err)
				assert.Equal(t, "tcp:db.internal:5432", token)
				assert.Empty(t, answer, "answered by Reply, after the server's verdict")
				return
			}
			var ae *ProxyAuthError
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, ProxyAuthError{Proxy: ProxyHTTPConnect, Reason: tc.wantReason}, *ae)
			require.ErrorIs(t, err, ErrProxyRequest)
			resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(answer)), nil)
			require.NoError(t, err)
			assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode)
			assert.Equal(t, `Basic realm="quictun"`, resp.Header.Get("Proxy-Authenticate"))
		})
	}
}

func TestSOCKS5ProxyAuthErrors(t *testing.T) {
	t.Parallel()
	creds := NewProxyCredentials(socks5.UserPass{User: "app", Password: "s3cret"})
	userPass := func(user, pass string) []byte {
		b := []byte{5, 1, socks5.MethodUserPass, 1, byte(len(user))}
		b = append(append(b, user...), byte(len(pass)))
		return append(b, pass...)
	}
	connect := []byte{5, 1, 0, 1, 127, 0, 0, 1, 0, 22}
	for _, tc := range []struct {
		name       string
		creds      *ProxyCredentials
		req        []byte
		wantReason string // "": no ProxyAuthError
		wantToken  string
	}{
		{name: "none required", req: append([]byte{5, 1, 0}, connect...), wantToken: "tcp:127.0.0.1:22"},
		{name: "right pair", creds: creds, req: append(userPass("app", "s3cret"), connect...), wantToken: "tcp:127.0.0.1:22"},
		{name: "no username/password offered", creds: creds, req: []byte{5, 1, socks5.MethodNoAuth}, wantReason: ProxyAuthMissing},
		{name: "wrong password", creds: creds, req: userPass("app", "wrong"), wantReason: ProxyAuthWrong},
		{name: "only username/password offered, none required", req: []byte{5, 1, socks5.MethodUserPass}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, token, err := proxyExchange(t, SOCKS5{Credentials: tc.creds}, tc.req)
			if tc.wantToken != "" {
				require.NoError(t, err)
				assert.Equal(t, tc.wantToken, token)
				return
			}
			require.Error(t, err)
			var ae *ProxyAuthError
			if tc.wantReason == "" {
				assert.False(t, errors.As(err, &ae), "not an authentication failure: %v", err)
				return
			}
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, ProxyAuthError{Proxy: ProxySOCKS5, Reason: tc.wantReason}, *ae)
		})
	}
}

func TestProxyCredentialsSet(t *testing.T) {
	t.Parallel()
	var none *ProxyCredentials
	assert.Nil(t, none.Load(), "a nil ProxyCredentials requires nothing")
	p := NewProxyCredentials(socks5.UserPass{User: "a", Password: "b"})
	require.NotNil(t, p.Load())
	assert.True(t, p.Load().Valid("a", "b"))
	p.Set(socks5.Users{{User: "c", Password: "d"}})
	assert.False(t, p.Load().Valid("a", "b"), "replaced")
	assert.True(t, p.Load().Valid("c", "d"))
	p.Set(nil)
	assert.Nil(t, p.Load())
}
