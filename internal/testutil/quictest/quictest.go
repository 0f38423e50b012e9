// Package quictest gives package tests a connected pair of QUIC connections
// on loopback with quictun's identity and QUIC settings, without the daemons
// (internal/testutil has those).
package quictest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/transport"
)

// Pair returns a connected client and server *quic.Conn on loopback, each on
// its own transport and UDP socket, with quictun's QUIC config (datagrams
// enabled); everything is closed when the test ends.
func Pair(tb testing.TB) (cli, srv *quic.Conn) {
	tb.Helper()
	q := transport.QUICConfig(transport.DefaultQUICOptions())
	return PairWith(tb, q, q)
}

// PairWith is Pair with the given server and client QUIC configs.
func PairWith(tb testing.TB, serverConf, clientConf *quic.Config) (cli, srv *quic.Conn) {
	tb.Helper()
	st, err := transport.LoadOrCreateState(tb.TempDir(), "", "")
	require.NoError(tb, err)
	ctls, err := transport.ClientTLSConfig(transport.ClientTLSOptions{InsecureSkipVerify: true})
	require.NoError(tb, err)
	udp := func() *net.UDPConn {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(tb, err)
		return c
	}
	spc, cpc := udp(), udp()
	str, ctr := &quic.Transport{Conn: spc}, &quic.Transport{Conn: cpc}
	ln, err := str.Listen(transport.ServerTLSConfig(st, nil), serverConf)
	require.NoError(tb, err)
	tb.Cleanup(func() {
		_ = ln.Close()
		_ = ctr.Close()
		_ = str.Close()
		_ = cpc.Close()
		_ = spc.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cli, err = ctr.Dial(ctx, spc.LocalAddr(), ctls, clientConf)
	require.NoError(tb, err)
	srv, err = ln.Accept(ctx)
	require.NoError(tb, err)
	tb.Cleanup(func() {
		_ = cli.CloseWithError(0, "")
		_ = srv.CloseWithError(0, "")
	})
	return cli, srv
}
