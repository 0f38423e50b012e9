//go:build linux && (amd64 || arm64)

package rawsock

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/ipv4"
)

func listen(t *testing.T, network, addr string) (*net.UDPConn, *UDPConn) {
	t.Helper()
	c, err := net.ListenUDP(network, &net.UDPAddr{IP: net.ParseIP(addr)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	w, ok := Wrap(c).(*UDPConn)
	require.True(t, ok, "a UDP socket on Linux is wrapped")
	return c, w
}

func messages(n, size int) []ipv4.Message {
	ms := make([]ipv4.Message, n)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, size)}
		ms[i].OOB = make([]byte, 128)
	}
	return ms
}

// Datagrams sent with WriteMsgUDP arrive whole and in order through
// ReadBatch, with their sender's address, on IPv4 and IPv6 sockets and from
// an IPv6 (dual-stack) socket to an IPv4 one.
func TestWriteMsgUDPReadBatch(t *testing.T) {
	for _, tc := range []struct{ name, fromNet, from, toNet, to string }{
		{"ipv4", "udp4", "127.0.0.1", "udp4", "127.0.0.1"},
		{"ipv6", "udp6", "::1", "udp6", "::1"},
		{"dual-stack to ipv4", "udp", "::", "udp4", "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, a := listen(t, tc.fromNet, tc.from)
			_, b := listen(t, tc.toNet, tc.to)
			dst := b.LocalAddr().(*net.UDPAddr)
			var sent [][]byte
			for i := range 5 {
				p := bytes.Repeat([]byte{byte('a' + i)}, 100+i*300)
				n, _, err := a.WriteMsgUDP(p, nil, dst)
				require.NoError(t, err)
				require.Equal(t, len(p), n)
				sent = append(sent, p)
			}
			var got [][]byte
			ms := messages(8, 2000)
			for len(got) < len(sent) {
				n, err := b.ReadBatch(ms, 0)
				require.NoError(t, err)
				require.Positive(t, n)
				for _, m := range ms[:n] {
					got = append(got, bytes.Clone(m.Buffers[0][:m.N]))
					from := m.Addr.(*net.UDPAddr)
					assert.Equal(t, a.LocalAddr().(*net.UDPAddr).Port, from.Port)
					if tc.to == "127.0.0.1" {
						assert.True(t, from.IP.Equal(net.IPv4(127, 0, 0, 1)), "from %s", from)
					} else {
						assert.True(t, from.IP.Equal(net.IPv6loopback), "from %s", from)
					}
				}
			}
			assert.Equal(t, sent, got)
		})
	}
}

// A ReadBatch on an empty socket waits on the network poller until a
// datagram comes; a passed read deadline ends it with a timeout (quic-go's
// listen loop looks for one: patch 0014) and a close with net.ErrClosed.
func TestReadBatchWaits(t *testing.T) {
	_, a := listen(t, "udp4", "127.0.0.1")
	bc, b := listen(t, "udp4", "127.0.0.1")
	got := make(chan int, 1)
	go func() {
		n, err := b.ReadBatch(messages(4, 1500), 0)
		assert.NoError(t, err)
		got <- n
	}()
	select {
	case <-got:
		t.Fatal("ReadBatch returned on an empty socket")
	case <-time.After(50 * time.Millisecond):
	}
	_, _, err := a.WriteMsgUDP([]byte("x"), nil, b.LocalAddr().(*net.UDPAddr))
	require.NoError(t, err)
	select {
	case n := <-got:
		assert.Equal(t, 1, n)
	case <-time.After(5 * time.Second):
		t.Fatal("ReadBatch did not return after a datagram came")
	}

	require.NoError(t, bc.SetReadDeadline(time.Now().Add(-time.Second)))
	_, err = b.ReadBatch(messages(4, 1500), 0)
	var nerr net.Error
	require.ErrorAs(t, err, &nerr)
	assert.True(t, nerr.Timeout())
	require.NoError(t, bc.SetReadDeadline(time.Time{}))

	done := make(chan error, 1)
	go func() { _, err := b.ReadBatch(messages(4, 1500), 0); done <- err }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, bc.Close())
	select {
	case err := <-done:
		assert.ErrorIs(t, err, net.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("ReadBatch did not return after Close")
	}
}

// A failed send is an *os.SyscallError inside the error, as net.UDPConn's
// (quic-go checks for its errno: EMSGSIZE, EIO).
func TestWriteMsgUDPError(t *testing.T) {
	_, a := listen(t, "udp4", "127.0.0.1")
	_, b := listen(t, "udp4", "127.0.0.1")
	_, _, err := a.WriteMsgUDP(make([]byte, 70000), nil, b.LocalAddr().(*net.UDPAddr))
	var serr *os.SyscallError
	require.ErrorAs(t, err, &serr)
	assert.ErrorIs(t, err, syscall.EMSGSIZE)
	// An address the socket cannot send to takes net's own path and error.
	_, _, err = a.WriteMsgUDP([]byte("x"), nil, &net.UDPAddr{IP: net.IPv6loopback, Port: 1})
	assert.Error(t, err)
}

// quic-go on wrapped sockets (its batched reads with GRO and ECN control
// messages, its sends with GSO): 4 MiB through a stream, both ways, intact.
func TestQUICOverWrappedSockets(t *testing.T) {
	_, srvRaw := listen(t, "udp4", "127.0.0.1")
	_, cliRaw := listen(t, "udp4", "127.0.0.1")
	srvConn, cliConn := &countingConn{UDPConn: srvRaw}, &countingConn{UDPConn: cliRaw}
	srvTr := &quic.Transport{Conn: srvConn}
	cliTr := &quic.Transport{Conn: cliConn}
	t.Cleanup(func() { _ = cliTr.Close(); _ = srvTr.Close() })
	ln, err := srvTr.Listen(serverTLS(t), &quic.Config{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const size = 4 << 20
	data := make([]byte, size)
	_, _ = rand.Read(data)
	want := sha256.Sum256(data)
	echoed := make(chan error, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			echoed <- err
			return
		}
		s, err := c.AcceptStream(ctx)
		if err != nil {
			echoed <- err
			return
		}
		_, err = io.Copy(s, s)
		echoed <- errors.Join(err, s.Close())
	}()
	c, err := cliTr.Dial(ctx, srvConn.LocalAddr(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"rawsock-test"}}, &quic.Config{})
	require.NoError(t, err)
	defer func() { _ = c.CloseWithError(0, "") }()
	s, err := c.OpenStreamSync(ctx)
	require.NoError(t, err)
	go func() {
		_, _ = s.Write(data)
		_ = s.Close()
	}()
	h := sha256.New()
	n, err := io.Copy(h, s)
	require.NoError(t, err)
	assert.EqualValues(t, size, n)
	assert.Equal(t, want[:], h.Sum(nil))
	require.NoError(t, <-echoed)
	assert.Positive(t, srvConn.reads.Load(), "quic-go read the server's socket through ReadBatch")
	assert.Positive(t, cliConn.reads.Load(), "quic-go read the client's socket through ReadBatch")
	assert.Positive(t, srvConn.writes.Load(), "quic-go sent through WriteMsgUDP")
	assert.Positive(t, cliConn.writes.Load(), "quic-go sent through WriteMsgUDP")
}

// countingConn counts quic-go's calls of the methods it should use.
type countingConn struct {
	*UDPConn
	reads, writes atomic.Int64
}

func (c *countingConn) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	c.reads.Add(1)
	return c.UDPConn.ReadBatch(ms, flags)
}

func (c *countingConn) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (int, int, error) {
	c.writes.Add(1)
	return c.UDPConn.WriteMsgUDP(b, oob, addr)
}

func serverTLS(t *testing.T) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, NextProtos: []string{"rawsock-test"}}
}

// Addresses go into sockaddrs of the socket's family and come back the same:
// IPv4 as v4-mapped on an IPv6 socket, a link-local scope by index.
func TestSockaddr(t *testing.T) {
	v4 := &UDPConn{}
	v6 := &UDPConn{inet6: true}
	for _, tc := range []struct {
		c    *UDPConn
		addr *net.UDPAddr
		ok   bool
		back *net.UDPAddr
	}{
		{v4, &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 443}, true, &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 443}},
		{v4, &net.UDPAddr{IP: net.ParseIP("2001:db8::1"), Port: 443}, false, nil},
		{v6, &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 443}, true, &net.UDPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 443}},
		{v6, &net.UDPAddr{IP: net.ParseIP("fe80::1"), Port: 4433, Zone: "7"}, true, &net.UDPAddr{IP: net.ParseIP("fe80::1"), Port: 4433, Zone: "7"}},
		{v6, &net.UDPAddr{IP: net.ParseIP("fe80::1"), Port: 4433, Zone: "eth0"}, false, nil},
	} {
		var sa syscall.RawSockaddrInet6
		_, ok := tc.c.sockaddr(tc.addr, &sa)
		require.Equal(t, tc.ok, ok, "%s", tc.addr)
		if ok {
			back := udpAddr((*syscall.RawSockaddrAny)(unsafe.Pointer(&sa)))
			assert.True(t, back.IP.Equal(tc.back.IP), "%s: %s", tc.addr, back)
			assert.Equal(t, tc.back.Port, back.Port)
			assert.Equal(t, tc.back.Zone, back.Zone)
		}
	}
}
