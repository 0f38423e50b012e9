package liveness_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/quictun/quictun/internal/testutil/quictest"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/liveness"
	"github.com/quictun/quictun/pkg/transport"
)

func TestHeartbeatOverQUIC(t *testing.T) {
	t.Parallel()
	cli, srv := quictest.Pair(t)
	var _ liveness.Conn = cli // *quic.Conn is a liveness.Conn

	srvStats, cliStats := &liveness.Stats{}, &liveness.Stats{}
	echoer := liveness.NewReceiver(srv, true, 50, srvStats)
	client := liveness.NewReceiver(cli, false, 0, cliStats)
	created := client.LastEcho()
	prober := liveness.NewTailProber(cli, 2, time.Millisecond, cliStats)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 3)
	for _, run := range []func(context.Context){echoer.Run, client.Run, prober.Run} {
		go func() {
			defer func() { done <- struct{}{} }()
			run(ctx)
		}()
	}
	defer func() {
		cancel()
		for range 3 {
			<-done
		}
	}()

	// Datagrams are unreliable: resend until an echo comes back (loopback: at once).
	seq := uint64(0)
	require.Eventually(t, func() bool {
		seq++
		require.NoError(t, liveness.SendHeartbeat(cli, seq, cliStats))
		return cliStats.EchoesReceived.Load() > 0
	}, 10*time.Second, 20*time.Millisecond)
	assert.True(t, client.LastEcho().After(created))
	assert.Positive(t, srvStats.EchoesSent.Load())
	assert.Equal(t, seq, cliStats.HeartbeatsSent.Load())

	prober.Kick()
	require.Eventually(t, func() bool { return cliStats.TailProbesSent.Load() == 2 }, 10*time.Second, 5*time.Millisecond)
	assert.Zero(t, srvStats.Invalid.Load(), "tail probes are not invalid")
	assert.Zero(t, cliStats.Invalid.Load())
}

// TestHeartbeatDrawsStatelessReset checks why heartbeats are padded: an idle
// client whose server crashed and restarted (same port, same reset key) learns
// it from the stateless reset answering its next heartbeat; quic-go answers
// only packets longer than 42 bytes.
func TestHeartbeatDrawsStatelessReset(t *testing.T) {
	t.Parallel()
	st, err := transport.LoadOrCreateState(t.TempDir(), "", "")
	require.NoError(t, err)
	qconf := transport.QUICConfig(transport.DefaultQUICOptions())
	listen := func(addr *net.UDPAddr) (*net.UDPConn, *quic.Transport, *quic.Listener) {
		var pc *net.UDPConn
		require.Eventually(t, func() bool {
			pc, err = net.ListenUDP("udp", addr)
			return err == nil
		}, 5*time.Second, 10*time.Millisecond)
		tr := &quic.Transport{Conn: pc, StatelessResetKey: &st.ResetKey, TokenGeneratorKey: &st.TokenKey}
		ln, err := tr.Listen(transport.ServerTLSConfig(st, nil), qconf)
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = ln.Close()
			_ = tr.Close()
			_ = pc.Close()
		})
		return pc, tr, ln
	}
	pc1, _, ln1 := listen(&net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	addr := pc1.LocalAddr().(*net.UDPAddr)

	cpc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	ctr := &quic.Transport{Conn: cpc}
	t.Cleanup(func() {
		_ = ctr.Close()
		_ = cpc.Close()
	})
	ctls, err := transport.ClientTLSConfig(transport.ClientTLSOptions{InsecureSkipVerify: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := ctr.Dial(ctx, addr, ctls, qconf)
	require.NoError(t, err)
	_, err = ln1.Accept(ctx)
	require.NoError(t, err)

	// Let the handshake's acknowledgements settle, so that the heartbeats are
	// the client's only packets from now on (nothing observable marks that).
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, pc1.Close()) // crash
	listen(addr)                    // restart with the same keys

	st2 := &liveness.Stats{}
	deadline := time.After(10 * time.Second)
	for seq := uint64(1); ; seq++ {
		_ = liveness.SendHeartbeat(conn, seq, st2) // the only traffic of an idle client
		select {
		case <-conn.Context().Done():
			var sr *quic.StatelessResetError
			assert.ErrorAs(t, context.Cause(conn.Context()), &sr)
			return
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatal("no stateless reset: heartbeats too short to draw one?")
		}
	}
}
