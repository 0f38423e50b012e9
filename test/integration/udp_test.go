package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/udpflow"
	"github.com/quictun/quictun/server"
)

// udpForward starts a client with one udp forward to dest and returns the
// forward's local address.
func udpForward(t *testing.T, srv *testutil.Server, dest string, mutate func(*client.Config)) (string, *testutil.Client) {
	t.Helper()
	uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	ts, err := token.NewSource(token.PluginFixed, dest, nil)
	require.NoError(t, err)
	c := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:1", WaitReady: true, Mutate: func(cfg *client.Config) {
		cfg.Forwards = []client.Forward{{Packet: uc, Tokens: ts}}
		if mutate != nil {
			mutate(cfg)
		}
	}})
	return uc.LocalAddr().String(), c
}

// packet is seq | sha256(body) | body, so an answer is checked whole.
func packet(seq uint32, size int) []byte {
	body := bytes.Repeat([]byte{byte(seq)}, size)
	sum := sha256.Sum256(body)
	p := binary.BigEndian.AppendUint32(nil, seq)
	p = append(p, sum[:]...)
	return append(p, body...)
}

func checkPacket(t *testing.T, p []byte) uint32 {
	t.Helper()
	require.GreaterOrEqual(t, len(p), 36)
	sum := sha256.Sum256(p[36:])
	require.Equal(t, sum[:], p[4:36], "packet damaged")
	return binary.BigEndian.Uint32(p)
}

// exchange sends packets of the given sizes from a new socket to addr, one
// at a time (a lost one is sent again, up to 5 times: datagrams are
// unreliable), and checks each answer.
func exchange(t *testing.T, addr string, sizes ...int) *net.UDPConn {
	t.Helper()
	uc, err := net.Dial("udp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = uc.Close() })
	buf := make([]byte, udpflow.MaxPacket)
	for i, size := range sizes {
		want := packet(uint32(i), size)
		got := false
		for try := 0; try < 5 && !got; try++ {
			_, err := uc.Write(want)
			require.NoError(t, err)
			_ = uc.SetReadDeadline(time.Now().Add(2 * time.Second))
			for {
				n, err := uc.Read(buf)
				if errors.Is(err, os.ErrDeadlineExceeded) {
					break
				}
				require.NoError(t, err)
				if checkPacket(t, buf[:n]) == uint32(i) {
					require.Len(t, buf[:n], len(want))
					got = true
					break
				}
			}
		}
		require.True(t, got, "packet %d (%d bytes) never answered", i, size)
	}
	return uc.(*net.UDPConn)
}

// TestUDPForward (issue 12): packets through a udp forward reach a UDP
// destination and the answers come back whole, for several application
// sockets at once (one flow each) over one QUIC connection; the first packet
// goes on the flow's stream, later ones as datagrams, and a packet too large
// for a datagram on the stream; metrics count them.
func TestUDPForward(t *testing.T) {
	t.Parallel()
	echo := testutil.UDPEchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"udp:" + echo}})
	addr, c := udpForward(t, srv, "udp:"+echo, nil)

	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { exchange(t, addr, 10, 100, 1000, 8000, 60000, 1) })
	}
	wg.Wait()
	cu, su := c.Metrics.UDP, srv.Metrics.UDP
	assert.Equal(t, 3.0, promtest.ToFloat64(cu.FlowsActive))
	assert.Equal(t, 3.0, promtest.ToFloat64(su.FlowsActive))
	up := func(m *metrics.UDP, dir, path string) float64 {
		return promtest.ToFloat64(m.PacketsTotal.WithLabelValues(dir, path))
	}
	// A packet is counted after it was handed on, so its answer can beat
	// the count: wait for the counts. Datagrams lost on the way would be
	// sent again by exchange and counted twice on the client only.
	require.Eventually(t, func() bool {
		return up(cu, metrics.DirectionUpstream, udpflow.PathStream) >= 3 && // first packets and large ones
			up(cu, metrics.DirectionUpstream, udpflow.PathDatagram) > 0 && // later small packets
			up(su, metrics.DirectionDownstream, udpflow.PathDatagram) > 0 &&
			up(su, metrics.DirectionDownstream, udpflow.PathStream) >= 6 // 8000 and 60000-byte answers
	}, 5*time.Second, 10*time.Millisecond, "packets by path: client up stream %v datagram %v, server down datagram %v stream %v",
		up(cu, metrics.DirectionUpstream, udpflow.PathStream), up(cu, metrics.DirectionUpstream, udpflow.PathDatagram),
		up(su, metrics.DirectionDownstream, udpflow.PathDatagram), up(su, metrics.DirectionDownstream, udpflow.PathStream))
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(su.BytesTotal.WithLabelValues(metrics.DirectionUpstream)) >= 3*(6*36+10+100+1000+8000+60000+1)
	}, 5*time.Second, 10*time.Millisecond, "every packet arrived at least once")
	assert.LessOrEqual(t, promtest.ToFloat64(su.BytesTotal.WithLabelValues(metrics.DirectionUpstream)),
		promtest.ToFloat64(cu.BytesTotal.WithLabelValues(metrics.DirectionUpstream)))
	assert.Len(t, srv.Server.Registry().List(time.Now()), 3, "/tunnels lists the flows")
	c.Stop(t)
	assert.Zero(t, promtest.ToFloat64(cu.FlowsActive))
	require.Eventually(t, func() bool { return promtest.ToFloat64(su.FlowsActive) == 0 }, 5*time.Second, 10*time.Millisecond,
		"the client's end closes the server's flows")
	require.Eventually(t, func() bool { return promtest.ToFloat64(su.FlowsTotal.WithLabelValues("ok")) == 3 },
		5*time.Second, 10*time.Millisecond, "the flows ended cleanly")
}

// TestUDPForwardRefused: a udp destination the server does not allow (a tcp
// rule for the same address allows no UDP) is refused; the application's
// packets go nowhere, and both ends count it.
func TestUDPForwardRefused(t *testing.T) {
	t.Parallel()
	echo := testutil.UDPEchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	addr, c := udpForward(t, srv, "udp:"+echo, nil)
	uc, err := net.Dial("udp", addr)
	require.NoError(t, err)
	defer uc.Close()
	_, err = uc.Write(packet(0, 10))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(c.Metrics.UDP.FlowsTotal.WithLabelValues("refused")) == 1
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.RefusedTotal.WithLabelValues("udp", "not_allowed")))
	_ = uc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, err = uc.Read(make([]byte, 100))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

// TestUDPFlowIdleAndLimits: a flow without packets ends after the idle
// timeout on both ends, and the next packet opens a new one; flows beyond
// the server's per-connection limit are refused with overloaded.
func TestUDPFlowIdleAndLimits(t *testing.T) {
	t.Parallel()
	echo := testutil.UDPEchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"udp:" + echo}, Mutate: func(cfg *server.Config) {
		cfg.UDPIdleTimeout = 300 * time.Millisecond
		cfg.MaxUDPFlowsPerConn = 2
	}})
	addr, c := udpForward(t, srv, "udp:"+echo, func(cfg *client.Config) { cfg.UDPIdleTimeout = time.Hour })
	a := exchange(t, addr, 10)
	exchange(t, addr, 10)
	// A third flow on the connection is refused.
	third, err := net.Dial("udp", addr)
	require.NoError(t, err)
	defer third.Close()
	_, err = third.Write(packet(0, 10))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(c.Metrics.UDP.FlowsTotal.WithLabelValues("overloaded")) == 1
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.UDP.DropsTotal.WithLabelValues(udpflow.DropFlowLimit)))

	// The server's idle timeout ends both flows, and the client's ends follow.
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(c.Metrics.UDP.FlowsActive) == 0 && promtest.ToFloat64(srv.Metrics.UDP.FlowsActive) == 0
	}, 5*time.Second, 10*time.Millisecond)
	// The same application socket opens a new flow.
	buf := make([]byte, 100)
	_, err = a.Write(packet(7, 10))
	require.NoError(t, err)
	_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := a.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, uint32(7), checkPacket(t, buf[:n]))
}

// TestUDPDatagramsWithoutFlow: 'U' datagrams from a peer that opened no flow
// (here: one without the secret) are dropped and counted; the server holds
// nothing for them.
func TestUDPDatagramsWithoutFlow(t *testing.T) {
	t.Parallel()
	srv := testutil.StartServer(t, testutil.ServerOptions{})
	c := attackerConn(t, srv)
	for i := range 50 {
		require.NoError(t, c.SendDatagram(udpflow.AppendDatagram(nil, uint64(i*4), []byte("garbage"))))
	}
	require.NoError(t, c.SendDatagram([]byte{udpflow.TypeUDP, 0x40}))
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.UDP.DropsTotal.WithLabelValues(udpflow.DropUnknownFlow)) >= 40 &&
			promtest.ToFloat64(srv.Metrics.UDP.DropsTotal.WithLabelValues(udpflow.DropMalformed)) == 1
	}, 5*time.Second, 10*time.Millisecond)
	assert.Zero(t, promtest.ToFloat64(srv.Metrics.UDP.FlowsActive))
}

// TestUDPFlowsDoNotHoldTheDrain: a server stopping with an open UDP flow
// ends it at once (shutdown) instead of waiting the drain timeout for it.
func TestUDPFlowsDoNotHoldTheDrain(t *testing.T) {
	t.Parallel()
	echo := testutil.UDPEchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"udp:" + echo}, Mutate: func(cfg *server.Config) {
		cfg.DrainTimeout = 20 * time.Second
	}})
	addr, c := udpForward(t, srv, "udp:"+echo, nil)
	exchange(t, addr, 10)
	require.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.UDP.FlowsActive))
	start := time.Now()
	srv.Stop(t)
	assert.Less(t, time.Since(start), 5*time.Second, "the drain did not wait for the UDP flow")
	assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.UDP.FlowsTotal.WithLabelValues("shutdown")))
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(c.Metrics.UDP.FlowsActive) == 0
	}, 5*time.Second, 10*time.Millisecond)
}

// TestUDPFlowShareByIdentity (issue 21 item 6): one identity cannot take
// every UDP flow of the server. Connections of key "a" together hold at most
// their share (here the default, a quarter of MaxUDPFlows but at least
// MaxUDPFlowsPerConn: 2 of 4); past it their flows are refused with
// overloaded and counted as identity_flow_limit, and a client of key "b"
// still gets flows.
func TestUDPFlowShareByIdentity(t *testing.T) {
	t.Parallel()
	echo := testutil.UDPEchoServer(t)
	secretA, secretB := []byte("the secret of group a, 32 bytes!"), []byte("the secret of group b, 32 bytes!")
	kr, err := proto.NewKeyring(proto.Key{Name: "a", Secret: secretA}, proto.Key{Name: "b", Secret: secretB})
	require.NoError(t, err)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"udp:" + echo}, Mutate: func(cfg *server.Config) {
		cfg.Keys = kr
		cfg.MaxUDPFlows = 4
		cfg.MaxUDPFlowsPerConn = 2
		cfg.UDPIdleTimeout = time.Hour
	}})
	withSecret := func(s []byte) func(*client.Config) {
		return func(cfg *client.Config) { cfg.Secret, cfg.UDPIdleTimeout = s, time.Hour }
	}
	a1, _ := udpForward(t, srv, "udp:"+echo, withSecret(secretA))
	exchange(t, a1, 10)
	exchange(t, a1, 10)

	// A second connection of key a: its flows are over a's share.
	a2, ca2 := udpForward(t, srv, "udp:"+echo, withSecret(secretA))
	for i := range 2 {
		uc, err := net.Dial("udp", a2)
		require.NoError(t, err)
		t.Cleanup(func() { _ = uc.Close() })
		_, err = uc.Write(packet(0, 10))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			return promtest.ToFloat64(ca2.Metrics.UDP.FlowsTotal.WithLabelValues("overloaded")) == float64(i+1)
		}, 5*time.Second, 10*time.Millisecond, "flow %d of the second connection of key a: want overloaded", i)
	}
	assert.Equal(t, 2.0, promtest.ToFloat64(srv.Metrics.UDP.DropsTotal.WithLabelValues("identity_flow_limit")))
	assert.Zero(t, promtest.ToFloat64(srv.Metrics.UDP.DropsTotal.WithLabelValues(udpflow.DropFlowLimit)))

	// Key b's client gets its flows: the server is not full.
	b, _ := udpForward(t, srv, "udp:"+echo, withSecret(secretB))
	exchange(t, b, 10)
	exchange(t, b, 10)
	assert.Equal(t, 4.0, promtest.ToFloat64(srv.Metrics.UDP.FlowsActive))
}
