package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/transport"
)

func TestIsTransientSendError(t *testing.T) {
	t.Parallel()
	sendErr := func(errno syscall.Errno) error {
		return &net.OpError{Op: "write", Net: "udp", Err: os.NewSyscallError("sendmsg", errno)}
	}
	linux := runtime.GOOS == "linux"
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{sendErr(syscall.EINVAL), linux}, // a blackhole route
		{sendErr(syscall.EACCES), linux}, // a prohibit route
		{sendErr(syscall.ENETUNREACH), true},
		{sendErr(syscall.EHOSTUNREACH), true},
		{sendErr(syscall.EADDRNOTAVAIL), true},
		{sendErr(syscall.ENETDOWN), true},
		{sendErr(syscall.ENOBUFS), true},
		{sendErr(syscall.EPERM), true},
		{sendErr(syscall.EMSGSIZE), false}, // quic-go's path MTU discovery needs it
		{sendErr(syscall.EIO), false},      // quic-go turns GSO off on it
		{sendErr(syscall.EBADF), false},
		{net.ErrClosed, false},
	} {
		t.Run(fmt.Sprint(tc.err), func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, isTransientSendError(tc.err))
		})
	}
}

// failingConn fails every write with err.
type failingConn struct {
	net.PacketConn
	err error
}

func (c failingConn) WriteTo([]byte, net.Addr) (int, error) { return 0, c.err }

func TestSendErrorsAsLossPlainConn(t *testing.T) {
	t.Parallel()
	to := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 7500}
	unreachable := &net.OpError{Op: "write", Net: "udp", Err: os.NewSyscallError("sendto", syscall.ENETUNREACH)}
	n, err := sendErrorsAsLoss(failingConn{err: unreachable}, klog.Background()).WriteTo(make([]byte, 100), to)
	require.NoError(t, err, "a datagram the network did not take counts as lost")
	assert.Equal(t, 100, n)
	_, err = sendErrorsAsLoss(failingConn{err: net.ErrClosed}, klog.Background()).WriteTo(make([]byte, 100), to)
	require.ErrorIs(t, err, net.ErrClosed, "other errors pass through")
}

// TestSendErrorsAsLossKeepsUDPFeatures: quic-go must still see the wrapped
// socket as an OOB-capable UDP conn, so GSO stays on where it was on.
func TestSendErrorsAsLossKeepsUDPFeatures(t *testing.T) {
	t.Parallel()
	var _ quic.OOBCapablePacketConn = &lossyUDPConn{}
	gso := func(wrap bool) bool {
		st, err := transport.LoadOrCreateState(t.TempDir(), "", "")
		require.NoError(t, err)
		sconn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		defer func() { _ = sconn.Close() }()
		str := &quic.Transport{Conn: sconn}
		defer func() { _ = str.Close() }()
		ln, err := str.Listen(transport.ServerTLSConfig(st, nil), &quic.Config{})
		require.NoError(t, err)
		defer func() { _ = ln.Close() }()

		cconn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		defer func() { _ = cconn.Close() }()
		var pc net.PacketConn = cconn
		if wrap {
			pc = sendErrorsAsLoss(cconn, klog.Background())
		}
		ctr := &quic.Transport{Conn: pc}
		defer func() { _ = ctr.Close() }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := ctr.Dial(ctx, sconn.LocalAddr(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{transport.ALPN}}, &quic.Config{}) // test against a throwaway certificate
		require.NoError(t, err)
		defer func() { _ = conn.CloseWithError(0, "") }()
		return conn.ConnectionState().GSO
	}
	plain, wrapped := gso(false), gso(true)
	t.Logf("GSO: plain socket %v, wrapped %v", plain, wrapped)
	assert.Equal(t, plain, wrapped, "GSO on the wrapped socket as on the plain one")
}
