package socks5_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/proxy"

	"github.com/quictun/quictun/pkg/socks5"
)

// rw is a client's input and what the server answered.
type rw struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (c *rw) Read(p []byte) (int, error)  { return c.in.Read(p) }
func (c *rw) Write(p []byte) (int, error) { return c.out.Write(p) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestNegotiate(t *testing.T) {
	alice := socks5.UserPass{User: "alice", Password: "s3cret"}
	userPass := func(u, p string) []byte {
		return cat([]byte{1, byte(len(u))}, []byte(u), []byte{byte(len(p))}, []byte(p))
	}
	for _, tc := range []struct {
		name    string
		creds   socks5.Credentials
		in      []byte
		wantOut []byte
		wantErr error
	}{
		{name: "no auth", in: []byte{5, 1, 0}, wantOut: []byte{5, 0}},
		{name: "no auth among others", in: []byte{5, 3, 2, 1, 0}, wantOut: []byte{5, 0}},
		{name: "only user/pass offered, none configured", in: []byte{5, 1, 2}, wantOut: []byte{5, 0xFF}, wantErr: socks5.ErrNoAcceptableMethod},
		{name: "user/pass", creds: alice, in: cat([]byte{5, 2, 0, 2}, userPass("alice", "s3cret")), wantOut: []byte{5, 2, 1, 0}},
		{name: "wrong password", creds: alice, in: cat([]byte{5, 1, 2}, userPass("alice", "guess")), wantOut: []byte{5, 2, 1, 1}, wantErr: socks5.ErrAuth},
		{name: "wrong user", creds: alice, in: cat([]byte{5, 1, 2}, userPass("bob", "s3cret")), wantOut: []byte{5, 2, 1, 1}, wantErr: socks5.ErrAuth},
		{name: "no auth offered, credentials required", creds: alice, in: []byte{5, 1, 0}, wantOut: []byte{5, 0xFF}, wantErr: socks5.ErrNoAcceptableMethod},
		{name: "SOCKS4", in: []byte{4, 1, 0, 80}, wantErr: socks5.ErrProtocol},
		{name: "no methods", in: []byte{5, 0}, wantErr: socks5.ErrProtocol},
		{name: "bad sub-negotiation version", creds: alice, in: cat([]byte{5, 1, 2}, []byte{5, 1, 'a', 1, 'b'}), wantOut: []byte{5, 2}, wantErr: socks5.ErrProtocol},
		{name: "truncated", in: []byte{5, 3, 0}, wantErr: io.ErrUnexpectedEOF},
		{name: "empty", in: nil, wantErr: io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := &rw{in: bytes.NewReader(tc.in)}
			err := socks5.Negotiate(c, tc.creds)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
				assert.Zero(t, c.in.Len(), "the greeting is read exactly")
			}
			assert.Equal(t, tc.wantOut, c.out.Bytes())
		})
	}
}

func TestReadRequest(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []byte
		want    socks5.Request
		wantStr string
		wantErr error
	}{
		{name: "connect IPv4", in: []byte{5, 1, 0, 1, 10, 0, 0, 5, 0x15, 0x38},
			want: socks5.Request{Command: socks5.CmdConnect, Addr: socks5.Addr{IP: netip.MustParseAddr("10.0.0.5"), Port: 5432}}, wantStr: "10.0.0.5:5432"},
		{name: "connect IPv6", in: cat([]byte{5, 1, 0, 4}, netip.MustParseAddr("2001:db8::1").AsSlice(), []byte{0, 22}),
			want: socks5.Request{Command: socks5.CmdConnect, Addr: socks5.Addr{IP: netip.MustParseAddr("2001:db8::1"), Port: 22}}, wantStr: "[2001:db8::1]:22"},
		{name: "connect domain", in: cat([]byte{5, 1, 0, 3, 11}, []byte("example.org"), []byte{1, 187}),
			want: socks5.Request{Command: socks5.CmdConnect, Addr: socks5.Addr{Host: "example.org", Port: 443}}, wantStr: "example.org:443"},
		{name: "udp associate", in: []byte{5, 3, 0, 1, 0, 0, 0, 0, 0, 0},
			want: socks5.Request{Command: socks5.CmdUDPAssociate, Addr: socks5.Addr{IP: netip.MustParseAddr("0.0.0.0")}}, wantStr: "0.0.0.0:0"},
		{name: "bind is read, the caller refuses it", in: []byte{5, 2, 0, 1, 1, 2, 3, 4, 0, 80},
			want: socks5.Request{Command: socks5.CmdBind, Addr: socks5.Addr{IP: netip.MustParseAddr("1.2.3.4"), Port: 80}}, wantStr: "1.2.3.4:80"},
		{name: "unknown address type", in: []byte{5, 1, 0, 9, 1, 2, 3, 4, 0, 80}, wantErr: socks5.ErrAddressType},
		{name: "empty domain", in: []byte{5, 1, 0, 3, 0, 0, 80}, wantErr: socks5.ErrProtocol},
		{name: "wrong version", in: []byte{4, 1, 0, 1, 1, 2, 3, 4, 0, 80}, wantErr: socks5.ErrProtocol},
		{name: "truncated address", in: []byte{5, 1, 0, 1, 1, 2}, wantErr: io.ErrUnexpectedEOF},
		{name: "truncated domain", in: []byte{5, 1, 0, 3, 20, 'a'}, wantErr: io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.wantErr != nil {
				_, err := socks5.ReadRequest(bytes.NewReader(tc.in))
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			r := bytes.NewReader(append(tc.in, "payload"...))
			got, err := socks5.ReadRequest(r)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.wantStr, got.Addr.String())
			rest, _ := io.ReadAll(r)
			assert.Equal(t, "payload", string(rest), "the request is read exactly; what follows is the application's")
		})
	}
}

func TestWriteReply(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rep   socks5.Reply
		bound socks5.Addr
		want  []byte
	}{
		{name: "refused, no address", rep: socks5.ReplyNotAllowed, want: []byte{5, 2, 0, 1, 0, 0, 0, 0, 0, 0}},
		{name: "ok IPv4", rep: socks5.ReplySucceeded, bound: socks5.Addr{IP: netip.MustParseAddr("127.0.0.1"), Port: 1080},
			want: []byte{5, 0, 0, 1, 127, 0, 0, 1, 4, 56}},
		{name: "ok IPv4-mapped", rep: socks5.ReplySucceeded, bound: socks5.Addr{IP: netip.MustParseAddr("::ffff:127.0.0.1"), Port: 1080},
			want: []byte{5, 0, 0, 1, 127, 0, 0, 1, 4, 56}},
		{name: "ok IPv6", rep: socks5.ReplySucceeded, bound: socks5.Addr{IP: netip.MustParseAddr("::1"), Port: 1},
			want: cat([]byte{5, 0, 0, 4}, netip.MustParseAddr("::1").AsSlice(), []byte{0, 1})},
		{name: "domain", rep: socks5.ReplyHostUnreachable, bound: socks5.Addr{Host: "a.b", Port: 2},
			want: []byte{5, 4, 0, 3, 3, 'a', '.', 'b', 0, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			require.NoError(t, socks5.WriteReply(&b, tc.rep, tc.bound))
			assert.Equal(t, tc.want, b.Bytes())
		})
	}
}

func TestUDPHeaderRoundTrip(t *testing.T) {
	for _, a := range []socks5.Addr{
		{IP: netip.MustParseAddr("192.0.2.1"), Port: 53},
		{IP: netip.MustParseAddr("2001:db8::53"), Port: 5353},
		{Host: "dns.example", Port: 53},
	} {
		pkt := append(socks5.AppendUDPHeader(nil, a), "query"...)
		got, payload, err := socks5.ParseUDP(pkt)
		require.NoError(t, err)
		assert.Equal(t, a, got)
		assert.Equal(t, "query", string(payload))
	}
	_, _, err := socks5.ParseUDP([]byte{0, 0, 1, 1, 1, 2, 3, 4, 0, 53, 'x'})
	require.ErrorIs(t, err, socks5.ErrFragmented)
	_, _, err = socks5.ParseUDP([]byte{0, 0, 0})
	require.ErrorIs(t, err, socks5.ErrProtocol)
	_, _, err = socks5.ParseUDP([]byte{0, 0, 0, 1, 1, 2})
	require.Error(t, err)
}

// TestInteropXNetProxy runs the handshake against golang.org/x/net/proxy's
// SOCKS5 client, an independent implementation, with and without a password.
func TestInteropXNetProxy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		server socks5.Credentials
		client *proxy.Auth
		ok     bool
	}{
		{name: "no auth", ok: true},
		{name: "password", server: socks5.UserPass{User: "u", Password: "p"}, client: &proxy.Auth{User: "u", Password: "p"}, ok: true},
		{name: "wrong password", server: socks5.UserPass{User: "u", Password: "p"}, client: &proxy.Auth{User: "u", Password: "x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer func() { _ = ln.Close() }()
			got := make(chan socks5.Request, 1)
			done := make(chan struct{})
			go func() {
				defer close(done)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer func() { _ = c.Close() }()
				if socks5.Negotiate(c, tc.server) != nil {
					return
				}
				br := bufio.NewReader(c)
				req, err := socks5.ReadRequest(br)
				if err != nil {
					return
				}
				got <- req
				if socks5.WriteReply(c, socks5.ReplySucceeded, socks5.Addr{IP: netip.MustParseAddr("127.0.0.1"), Port: 9}) != nil {
					return
				}
				_, _ = io.Copy(c, br) // echo
			}()
			d, err := proxy.SOCKS5("tcp", ln.Addr().String(), tc.client, proxy.Direct)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := d.(proxy.ContextDialer).DialContext(ctx, "tcp", "db.internal:5432")
			if !tc.ok {
				require.Error(t, err)
				<-done
				return
			}
			require.NoError(t, err)
			req := <-got
			assert.Equal(t, socks5.CmdConnect, req.Command)
			assert.Equal(t, "db.internal:5432", req.Addr.String())
			_, err = c.Write([]byte("ping"))
			require.NoError(t, err)
			b := make([]byte, 4)
			_, err = io.ReadFull(c, b)
			require.NoError(t, err)
			assert.Equal(t, "ping", string(b))
			_ = c.Close()
			<-done
		})
	}
}

// FuzzReadRequest checks that any input either fails or yields a request
// whose address re-encodes to exactly the bytes that were read.
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte{5, 1, 0, 1, 10, 0, 0, 5, 0x15, 0x38})
	f.Add(cat([]byte{5, 1, 0, 4}, netip.MustParseAddr("2001:db8::1").AsSlice(), []byte{0, 22}))
	f.Add(cat([]byte{5, 1, 0, 3, 11}, []byte("example.org"), []byte{1, 187}))
	f.Add([]byte{5, 3, 0, 9})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		req, err := socks5.ReadRequest(r)
		if err != nil || req.Addr.IP.Is4In6() { // a mapped address is answered as IPv4
			return
		}
		read := in[:len(in)-r.Len()]
		var b bytes.Buffer
		require.NoError(t, socks5.WriteReply(&b, socks5.Reply(req.Command), req.Addr))
		assert.Equal(t, read[3:], b.Bytes()[3:], "address re-encodes to what was read")
	})
}

// FuzzParseUDP checks ParseUDP never panics and that what it parses
// re-encodes to the input.
func FuzzParseUDP(f *testing.F) {
	f.Add(append(socks5.AppendUDPHeader(nil, socks5.Addr{IP: netip.MustParseAddr("192.0.2.1"), Port: 53}), "q"...))
	f.Add(append(socks5.AppendUDPHeader(nil, socks5.Addr{Host: "h", Port: 1}), "q"...))
	f.Add([]byte{0, 0, 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		a, payload, err := socks5.ParseUDP(in)
		if err != nil || a.IP.Is4In6() {
			return
		}
		out := append(socks5.AppendUDPHeader(nil, a), payload...)
		assert.Equal(t, in[3:], out[3:])
	})
}

func TestParseUsers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		want     socks5.Users
		wantErr  string
	}{
		{name: "one line", in: "app:s3cret\n", want: socks5.Users{{User: "app", Password: "s3cret"}}},
		{name: "several, comments and blank lines", in: "# proxy users\napp:s3cret\n\n  ops:pa:ss  \n",
			want: socks5.Users{{User: "app", Password: "s3cret"}, {User: "ops", Password: "pa:ss"}}},
		{name: "no colon", in: "app\n", wantErr: "line 1: want USER:PASSWORD"},
		{name: "empty password", in: "app:s3cret\nops:\n", wantErr: "line 2: want USER:PASSWORD"},
		{name: "empty user", in: ":s3cret", wantErr: "line 1: want USER:PASSWORD"},
		{name: "user too long", in: strings.Repeat("u", 256) + ":p", wantErr: "line 1: want USER:PASSWORD (each 1-255 bytes)"},
		{name: "user twice", in: "app:a\napp:b\n", wantErr: `line 2: user "app" appears twice`},
		{name: "comments only", in: "# nobody\n", wantErr: "no USER:PASSWORD line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := socks5.ParseUsers([]byte(tc.in))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestUsersValid(t *testing.T) {
	t.Parallel()
	users := socks5.Users{{User: "app", Password: "s3cret"}, {User: "ops", Password: "other"}}
	for _, tc := range []struct {
		user, password string
		want           bool
	}{
		{"app", "s3cret", true}, {"ops", "other", true}, {"app", "other", false}, {"ops", "s3cret", false},
		{"app", "s3cre", false}, {"", "", false}, {"bob", "s3cret", false},
	} {
		assert.Equal(t, tc.want, users.Valid(tc.user, tc.password), "%s:%s", tc.user, tc.password)
	}
	assert.False(t, socks5.Users(nil).Valid("", ""), "no users: nothing is valid")
}
