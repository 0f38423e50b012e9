package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/proto"
)

// floodGarbage sends n random UDP datagrams to addr, paced over about d. A
// quarter look like QUIC v1 Initial packets (long header, version 1, 1200
// bytes), so the server has to try to decrypt them; the rest are random.
func floodGarbage(t *testing.T, addr string, n int, d time.Duration) {
	t.Helper()
	c, err := net.Dial("udp", addr)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	const batch = 200
	pause := d / time.Duration(n/batch)
	buf := make([]byte, 1400)
	for i := range n {
		size := 1 + int(buf[0])*5 // from the previous packet's random bytes: 1..1276
		_, _ = rand.Read(buf)
		if i%4 == 0 {
			size = 1200
			buf[0] = 0xc0 | buf[0]&0x0f             // long header, Initial
			binary.BigEndian.PutUint32(buf[1:5], 1) // QUIC v1
			buf[5] = 8                              // DCID length
		}
		_, _ = c.Write(buf[:size]) // ECONNREFUSED from an ICMP error is possible and harmless
		if i%batch == batch-1 {
			time.Sleep(pause)
		}
	}
}

// TestGarbageUDP: 20k garbage datagrams at the server while a legitimate
// client does ping-pong. The server stays up and ready, the probe completes
// and its latency is reported, the live connection survives, no panic.
func TestGarbageUDP(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo})

	before, r := probe(t, cl.Addr, 1000)
	require.Equal(t, 0, r.code, r.stderr)

	const packets = 20000
	flooded := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		floodGarbage(t, srv.Addr, packets, 2*time.Second)
		flooded <- time.Since(start)
	}()
	during, r := probe(t, cl.Addr, 3000)
	floodDur := <-flooded
	assert.Equal(t, 0, r.code, "probe during the flood: %s", r.stderr)
	assert.Zero(t, during.Errors, during.ErrorMessages)
	assert.Equal(t, 3000, during.RoundTrips)

	assert.False(t, srv.exited(), "server died")
	assert.True(t, srv.ready(), "server not ready after the flood")
	assert.NotContains(t, srv.log(), "panic")
	require.NoError(t, echoVia(t, cl.Addr, "still here"))
	cm, sm := scrape(t, cl), scrape(t, srv)
	assert.Equal(t, 1.0, sm.val("quictun_server_active_connections"), "garbage must not create connections")
	assert.Equal(t, 0.0, cm.val("quictun_client_reconnects_total"), "the legitimate connection must survive")
	t.Logf("%d garbage datagrams in %v during a 3000 x 1000 B probe: p50 %.3f ms -> %.3f ms (x%.2f), p99 %.3f ms -> %.3f ms (x%.2f)",
		packets, floodDur, before.P50MS, during.P50MS, during.P50MS/before.P50MS, before.P99MS, during.P99MS, during.P99MS/before.P99MS)
}

// rawClient dials the server with quic-go directly (ALPN quictun/1, no
// certificate verification), as an attacker without the quictun client would.
func rawClient(t *testing.T, addr string) *quic.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := quic.DialAddr(ctx, addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"quictun/1"}, MinVersion: tls.VersionTLS13}, // the attacker does not verify
		&quic.Config{MaxIdleTimeout: 30 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.CloseWithError(0, "") })
	return conn
}

// header encodes a valid stream header for token, with a MAC when secret is set.
func header(t *testing.T, token string, secret []byte) []byte {
	t.Helper()
	h, err := proto.NewHeader(token, time.Now())
	require.NoError(t, err)
	b, err := h.Append(nil, secret)
	require.NoError(t, err)
	return b
}

// kindHeader encodes a valid stream header of kind for token, with a MAC.
func kindHeader(t *testing.T, token string, kind proto.Kind, secret []byte) []byte {
	t.Helper()
	h, err := proto.NewHeader(token, time.Now())
	require.NoError(t, err)
	h.Kind = kind
	b, err := h.Append(nil, secret)
	require.NoError(t, err)
	return b
}

// fixedHeader returns the 28 fixed header bytes: version, flags, time, nonce, token length.
func fixedHeader(version, flags byte, tokenLen uint16) []byte {
	b := []byte{version, flags}
	b = binary.BigEndian.AppendUint64(b, uint64(time.Now().Unix())) // positive
	b = append(b, make([]byte, proto.NonceLen)...)
	_, _ = rand.Read(b[10:])
	return binary.BigEndian.AppendUint16(b, tokenLen)
}

// streamReset opens a stream, writes payload (then FIN when fin), waits
// (bounded) for the server's answer and returns the stream error code the
// server reset the stream with.
func streamReset(t *testing.T, conn *quic.Conn, payload []byte, fin bool) (proto.Code, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return 0, err
	}
	defer str.CancelRead(0)
	if _, err := str.Write(payload); err != nil {
		return 0, err
	}
	if fin {
		_ = str.Close()
	}
	_ = str.SetReadDeadline(time.Now().Add(15 * time.Second))
	var b [64]byte
	n, err := str.Read(b[:])
	var se *quic.StreamError
	if errors.As(err, &se) && se.Remote {
		return proto.Code(se.ErrorCode), nil
	}
	return 0, fmt.Errorf("want a stream reset, got %d bytes %q: %w", n, b[:n], err)
}

// TestHostileStreams: a raw QUIC client that completes the handshake but sends
// bad stream headers. Each stream is reset with the right code and counted;
// nothing reaches a destination; bad or missing credentials close the connection.
func TestHostileStreams(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: []string{"--header-timeout", "1s"}})
	raw, err := os.ReadFile(srv.SecretFile)
	require.NoError(t, err)
	secret := []byte(strings.TrimSpace(string(raw))) // as the daemons read it
	otherPort := testutil.FreePort(t, "tcp")

	conn := rawClient(t, srv.Addr)
	for _, tc := range []struct {
		name    string
		payload []byte
		fin     bool
		want    proto.Code
	}{
		{"unknown version", append(fixedHeader(2, 1, 4), "tcp:"...), false, proto.CodeBadHeader},
		{"unknown flags", append(fixedHeader(1, 0x81, 4), "tcp:"...), false, proto.CodeBadHeader},
		{"token length 65535", append(fixedHeader(1, 1, 0xffff), make([]byte, 1100)...), false, proto.CodeBadHeader},
		{"token length 1025", append(fixedHeader(1, 1, proto.MaxTokenLen+1), make([]byte, 1100)...), false, proto.CodeBadHeader},
		{"token length 0", fixedHeader(1, 1, 0), false, proto.CodeBadHeader},
		{"truncated then FIN", fixedHeader(1, 1, 20)[:15], true, proto.CodeBadHeader},
		{"slow header", fixedHeader(1, 1, 20)[:15], false, proto.CodeTimeout},
		{"link-local metadata address", header(t, "tcp:169.254.169.254:80", secret), false, proto.CodeRefused},
		{"loopback port not allowed", header(t, fmt.Sprintf("tcp:127.0.0.1:%d", otherPort), secret), false, proto.CodeRefused},
		{"unix socket not allowed", header(t, "unix:/etc/passwd", secret), false, proto.CodeRefused},
		{"unparsable token", header(t, "ftp://example.org/", secret), false, proto.CodeBadToken},
		// A kind this server does not serve (reserved for reverse binds):
		// refused with a code, after authentication, never carried as TCP.
		{"reserved kind", kindHeader(t, "tcp:"+echo, proto.KindReverse, secret), false, proto.CodeUnsupported},
	} {
		start := time.Now()
		code, err := streamReset(t, conn, tc.payload, tc.fin)
		if assert.NoError(t, err, tc.name) {
			assert.Equal(t, tc.want.String(), code.String(), tc.name)
		}
		t.Logf("%-28s -> reset %-10s after %v", tc.name, code, time.Since(start).Round(time.Millisecond))
	}
	// The connection is still usable: a valid header reaches the allowed echo.
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	str, err := conn.OpenStreamSync(sctx)
	require.NoError(t, err)
	_, err = str.Write(append(header(t, "tcp:"+echo, secret), "x"...))
	require.NoError(t, err)
	require.NoError(t, str.Close())
	_ = str.SetReadDeadline(time.Now().Add(10 * time.Second))
	echoed, err := io.ReadAll(str)
	require.NoError(t, err, "a valid stream must not be reset")
	assert.Equal(t, "\x00x", string(echoed), "reply byte OK, then the echo")

	// Wrong secret, then no secret: the stream is reset and the connection closed.
	for _, tc := range []struct {
		name   string
		secret []byte
	}{{"wrong secret", []byte("0123456789abcdef0123456789abcdef")}, {"no secret", nil}} {
		c := rawClient(t, srv.Addr)
		code, err := streamReset(t, c, header(t, "tcp:"+echo, tc.secret), false)
		if err == nil {
			assert.Equal(t, proto.CodeAuthFailed.String(), code.String(), tc.name)
		} else {
			// The connection close may overtake the stream reset.
			c, ok := proto.FromError(err)
			assert.True(t, ok && c == proto.CodeAuthFailed, "%s: %v", tc.name, err)
		}
		select {
		case <-c.Context().Done():
			var ae *quic.ApplicationError
			require.ErrorAs(t, context.Cause(c.Context()), &ae, tc.name)
			assert.Equal(t, quic.ApplicationErrorCode(proto.CodeAuthFailed), ae.ErrorCode, tc.name)
		case <-time.After(10 * time.Second):
			t.Errorf("%s: the server did not close the connection", tc.name)
		}
	}

	for result, want := range map[string]float64{
		"bad_header": 6, "timeout": 1, "refused": 3, "bad_token": 1, "auth_failed": 2, "ok": 1, "unsupported": 1,
	} {
		waitMetric(t, srv, 5*time.Second, eq(want), "quictun_server_streams_total", "result", result)
	}
	m := scrape(t, srv)
	assert.Equal(t, 2.0, m.val("quictun_server_refused_destinations_total", "network", "tcp", "reason", "not_allowed"))
	assert.Equal(t, 1.0, m.val("quictun_server_refused_destinations_total", "network", "unix", "reason", "not_allowed"))
	assert.Equal(t, 1.0, m.val("quictun_server_dial_duration_seconds"), "only the valid stream was dialed")
	waitMetric(t, srv, 5*time.Second, eq(2), "quictun_server_connections_total", "result", "auth_failed")
	assert.True(t, srv.ready())

	// A client that does not speak quictun/1 does not get a connection.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = quic.DialAddr(ctx, srv.Addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h3"}, MinVersion: tls.VersionTLS13}, nil) // attacker
	assert.Error(t, err, "ALPN h3 must be refused")
}

// TestBadCredentialsThroughClient: the real client with a wrong secret, with
// no secret, or pinning the wrong fingerprint never carries a byte; the
// application's connection is reset and both ends count why.
func TestBadCredentialsThroughClient(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}})
	other := strings.TrimSpace(run(t, nil, bins.server, "fingerprint", "--state-dir", t.TempDir()+"/other").stdout)

	for _, tc := range []struct {
		name string
		o    clientOpts
		log  string // expected in the client's log
	}{
		{"wrong secret", clientOpts{SecretFile: newSecretFile(t)}, "Server rejected our credentials"},
		{"no secret", clientOpts{SecretFile: "-", Args: []string{"--insecure-no-auth"}}, "Server rejected our credentials"},
		{"wrong fingerprint", clientOpts{Fingerprint: other, Args: []string{"--session-wait-timeout", "1s"}},
			"server certificate fingerprint does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Token = "tcp:" + echo
			tc.o.NoWait = true
			tc.o.Args = append(tc.o.Args, "--reconnect-max-delay", "500ms")
			cl := startClient(t, srv, tc.o)
			err := echoVia(t, cl.Addr, "secret data")
			assert.Error(t, err, tc.name)
			assert.True(t, isReset(err), "%s: want a reset, got %v", tc.name, err)
			waitFor(t, 10*time.Second, tc.name+" log", func() bool { return strings.Contains(cl.log(), tc.log) })
			m := scrape(t, cl)
			assert.Equal(t, 0.0, m.val("quictun_client_streams_total", "result", "ok"), tc.name)
			assert.Equal(t, 0.0, m.val("quictun_client_stream_bytes_total", "direction", "downstream"), tc.name)
			if tc.name == "wrong fingerprint" {
				assert.False(t, cl.ready(), tc.name)
				assert.Positive(t, m.val("quictun_client_dials_total", "result", "cert_rejected"), tc.name)
				assert.Equal(t, 1.0, m.val("quictun_client_streams_total", "result", "no_session"), tc.name)
			} else {
				assert.Equal(t, 1.0, m.val("quictun_client_streams_total", "result", "auth_failed"), tc.name)
			}
		})
	}
	m := scrape(t, srv)
	// The wrong secret's tunnel and its hellos (one per connection: the no-secret client sends none).
	assert.GreaterOrEqual(t, m.val("quictun_server_streams_total", "result", "auth_failed"), 2.0)
	assert.GreaterOrEqual(t, m.val("quictun_server_auth_failures_total", "reason", "unknown_key"), 1.0, "the wrong secret's hello")
	assert.GreaterOrEqual(t, m.val("quictun_server_connections_total", "result", "auth_failed"), 2.0)
	assert.Equal(t, 0.0, m.val("quictun_server_streams_total", "result", "ok"))
	assert.Equal(t, 0.0, m.val("quictun_server_dial_duration_seconds"), "no destination was dialed")
}
