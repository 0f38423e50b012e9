package integration

import (
	"errors"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/usage"
	"github.com/quictun/quictun/server"
)

// startResumeUsageServer runs a server with alice's and bob's keys,
// accounting (so kicks) and resumable tunnels.
func startResumeUsageServer(t *testing.T, side *resumeSide, allow string) (*testutil.Server, *usage.Ledger) {
	t.Helper()
	ledger, err := usage.New(usage.Config{})
	require.NoError(t, err)
	keys, err := proto.NewKeyring(proto.Key{Name: "alice", Secret: aliceSecret}, proto.Key{Name: "bob", Secret: bobSecret})
	require.NoError(t, err)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{allow}, Mutate: func(c *server.Config) {
		c.Keys, c.Usage, c.Resume = keys, ledger, side.egress(time.Minute)
	}})
	return srv, ledger
}

// TestKickEndsResumableTunnels (issues 34 and 35): a kick ends the
// identity's resumable tunnels instead of parking them (they would resume
// once the suspension ends, or from a connection the kick did not reach):
// the application's connection is reset, the server holds none of them,
// counted as given up (kicked); another identity's tunnel goes on.
func TestKickEndsResumableTunnels(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srvSide := newResumeSide(server.NewResumeMetrics)
	srv, _ := startResumeUsageServer(t, srvSide, "tcp:"+echo)
	resumable := func(c *client.Config) { c.Resume = newResumeSide(client.NewResumeMetrics).ingress(time.Minute) }
	alice := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: aliceSecret, WaitReady: true, Mutate: resumable})
	bob := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: bobSecret, WaitReady: true, Mutate: resumable})
	aliceConn, bobConn := dial(t, alice.Addr), dial(t, bob.Addr)
	echoMsg(t, aliceConn, "alice is in")
	echoMsg(t, bobConn, "bob is in")
	require.Equal(t, 2, srvSide.table.Len())

	_, _, err := srv.Kick("key=alice", time.Hour)
	require.NoError(t, err)
	require.NoError(t, aliceConn.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, rerr := aliceConn.Read(make([]byte, 1))
	require.Error(t, rerr)
	var ne interface{ Timeout() bool }
	require.False(t, errors.As(rerr, &ne) && ne.Timeout(), "the tunnel ended, it was not parked")
	assert.Equal(t, 1.0, promtest.ToFloat64(srvSide.metrics.GaveUp.WithLabelValues(resume.GaveUpKicked)))
	assert.Zero(t, promtest.ToFloat64(srvSide.metrics.Parked), "nothing parked")
	assert.Equal(t, 1, srvSide.table.Len(), "only bob's tunnel is held")
	echoMsg(t, bobConn, "bob is still in")
}

// TestResumeRefusedWhileSuspended: a re-attachment of a tunnel held for a
// suspended identity (one that reached the table beside the kick) is
// refused, counted (refused: suspended), and ends the tunnel.
func TestResumeRefusedWhileSuspended(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	side := newResumeSide(server.NewResumeMetrics)
	srv, ledger := startResumeUsageServer(t, side, "tcp:"+echo)
	id, first := openResumable(t, attackerConn(t, srv), "tcp:"+echo, aliceSecret)
	echoRoundTrip(t, first, "ping")
	require.Equal(t, 1, side.table.Len())

	ledger.Suspend("key=alice", time.Hour) // the suspension without the kick's ending of tunnels
	_, _, code := sendResume(t, attackerConn(t, srv), resumeHeader(t, id, 4, aliceSecret))
	assert.Equal(t, proto.CodeResumeRefused, code)
	assert.Equal(t, 1.0, promtest.ToFloat64(side.metrics.Refused.WithLabelValues(resume.RefusedSuspended)))
	require.Eventually(t, func() bool { return side.table.Len() == 0 }, 10*time.Second, 10*time.Millisecond, "the tunnel ended")
	assert.Equal(t, 1.0, promtest.ToFloat64(side.metrics.GaveUp.WithLabelValues(resume.GaveUpKicked)))
}
