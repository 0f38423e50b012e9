package integration

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/usage"
	"github.com/quictun/quictun/server"
)

var (
	aliceSecret = []byte("alice's secret, 32 bytes long...")
	bobSecret   = []byte("bob's secret, 32 bytes long.....")
)

// startUsageServer runs a server with the named keys alice and bob, the
// accounting kept in stateDir and alice's metrics series of her own.
func startUsageServer(t *testing.T, stateDir string, allow ...string) (*testutil.Server, *usage.Ledger) {
	t.Helper()
	ledger, err := usage.New(usage.Config{Path: filepath.Join(stateDir, "usage.json"), Labeled: []string{"key=alice"}})
	require.NoError(t, err)
	keys, err := proto.NewKeyring(proto.Key{Name: "alice", Secret: aliceSecret}, proto.Key{Name: "bob", Secret: bobSecret})
	require.NoError(t, err)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: allow, Mutate: func(c *server.Config) {
		c.Keys, c.Usage = keys, ledger
	}})
	srv.Registry.MustRegister(server.NewIdentityCollector(ledger))
	return srv, ledger
}

// gatherIdentity returns the values of the identity metric name by
// "identity/direction" (or "identity").
func gatherIdentity(t *testing.T, srv *testutil.Server, name string) map[string]float64 {
	t.Helper()
	mfs, err := srv.Registry.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			key := labels["identity"]
			if d, ok := labels["direction"]; ok {
				key += "/" + d
			}
			out[key] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestAccountingByIdentity (issue 35 item 1): the bytes each identity's
// applications send and receive are counted exactly, with its tunnels,
// connections and refused destinations; metrics carry the configured
// identity and other; the totals survive a restart.
func TestAccountingByIdentity(t *testing.T) {
	echo := testutil.EchoServer(t)
	stateDir := t.TempDir()
	srv, ledger := startUsageServer(t, stateDir, "tcp:"+echo)
	alice := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: aliceSecret, WaitReady: true})
	bob := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: bobSecret, WaitReady: true})
	bobRefused := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:1", Secret: bobSecret, WaitReady: true})

	const n1, n2, n3 = 300_000, 77_777, 123_456
	echoCheck(t, dial(t, alice.Addr), n1)
	echoCheck(t, dial(t, alice.Addr), n2)
	echoCheck(t, dial(t, bob.Addr), n3)
	refusedRead(t, bobRefused.Addr)

	want := map[string]usage.Usage{
		"key=alice": {Identity: "key=alice", BytesUpstream: n1 + n2, BytesDownstream: n1 + n2, Tunnels: 2, Connections: 1, ActiveConnections: 1},
		"key=bob":   {Identity: "key=bob", BytesUpstream: n3, BytesDownstream: n3, Tunnels: 1, Connections: 2, ActiveConnections: 2, RefusedDestinations: 1},
	}
	totals := func(id string) usage.Usage {
		u, _ := ledger.Identity(id)
		u.UpstreamBytesPerSec, u.DownBytesPerSec = 0, 0
		return u
	}
	for id, w := range want {
		require.Eventually(t, func() bool { return totals(id) == w }, 10*time.Second, 20*time.Millisecond,
			"%s: want %+v, have %+v", id, w, totals(id))
	}
	// Metrics: alice by name, bob under other.
	problems, err := promtest.GatherAndLint(srv.Registry, "quictun_server_identity_bytes_total", "quictun_server_identity_tunnels_total")
	require.NoError(t, err)
	assert.Empty(t, problems)
	mf := gatherIdentity(t, srv, "quictun_server_identity_bytes_total")
	assert.Equal(t, float64(n1+n2), mf["key=alice/upstream"])
	assert.Equal(t, float64(n3), mf["other/downstream"])
	assert.Len(t, mf, 4, "alice and other, two directions each")

	// Restart: the totals come back from --state-dir.
	alice.Stop(t)
	bob.Stop(t)
	bobRefused.Stop(t)
	srv.Stop(t)
	_, ledger2 := startUsageServer(t, stateDir, "tcp:"+echo)
	a, ok := ledger2.Identity("key=alice")
	require.True(t, ok)
	assert.Equal(t, int64(n1+n2), a.BytesUpstream)
	assert.Equal(t, int64(2), a.Tunnels)
	b, _ := ledger2.Identity("key=bob")
	assert.Equal(t, int64(1), b.RefusedDestinations)
}

// TestKickIdentity (issue 35 item 4): a kick closes the identity's
// connections at once (its tunnel ends), refuses it for the given time,
// and leaves other identities alone.
func TestKickIdentity(t *testing.T) {
	echo := testutil.EchoServer(t)
	srv, ledger := startUsageServer(t, t.TempDir(), "tcp:"+echo)
	alice := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: aliceSecret, WaitReady: true})
	bob := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: bobSecret, WaitReady: true})
	aliceConn, bobConn := dial(t, alice.Addr), dial(t, bob.Addr)
	echoMsg(t, aliceConn, "alice is in")
	echoMsg(t, bobConn, "bob is in")

	start := time.Now()
	closed, until, err := srv.Kick("key=alice", time.Hour)
	require.NoError(t, err)
	assert.Equal(t, 1, closed)
	assert.WithinDuration(t, time.Now().Add(time.Hour), until, time.Minute)
	// Her open tunnel ends (the application sees EOF or a reset).
	require.NoError(t, aliceConn.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, rerr := aliceConn.Read(make([]byte, 1))
	require.Error(t, rerr)
	var ne interface{ Timeout() bool }
	require.False(t, errors.As(rerr, &ne) && ne.Timeout(), "the tunnel ended, it did not time out")
	t.Logf("kicked tunnel ended %v after the kick", time.Since(start))
	// Her client reconnects; her new tunnels are refused, and the new
	// connection is kept (closing it would have her client reconnect in
	// a loop).
	refusedRead(t, alice.Addr)
	refusedRead(t, alice.Addr)
	u, _ := ledger.Identity("key=alice")
	assert.Equal(t, until, u.SuspendedUntil)
	assert.Equal(t, int64(2), u.Connections, "one reconnect, no storm")
	assert.Equal(t, int64(1), u.ActiveConnections)
	// Bob is not affected.
	echoMsg(t, bobConn, "bob is still in")
	echoCheck(t, dial(t, bob.Addr), 10_000)

	// Lifted: she gets in again.
	_, _, err = srv.Kick("key=alice", 0)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		c := dial(t, alice.Addr)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			return false
		}
		_, err := c.Read(make([]byte, 1))
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "alice reconnects once the suspension is lifted")
}

// TestQuota (issue 35 item 3): once an identity's rolling window holds its
// quota its new tunnels are refused with quota; its open tunnel runs on;
// other identities are not affected.
func TestQuota(t *testing.T) {
	echo := testutil.EchoServer(t)
	srv, ledger := startUsageServer(t, t.TempDir(), "tcp:"+echo)
	ledger.SetQuotas(map[string]usage.Quota{"key=alice": {Bytes: 100_000, Window: time.Hour}}, usage.Quota{})
	alice := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: aliceSecret, WaitReady: true})
	bob := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: bobSecret, WaitReady: true})
	open := dial(t, alice.Addr)
	echoMsg(t, open, "alice's long tunnel")
	echoCheck(t, dial(t, alice.Addr), 60_000) // 120,000 bytes up and down
	require.Eventually(t, func() bool { u, _ := ledger.Identity("key=alice"); return u.OverQuota }, 10*time.Second, 20*time.Millisecond)
	refusedRead(t, alice.Addr)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("quota")) == 1
	}, 5*time.Second, 10*time.Millisecond, "refused with its own code")
	echoMsg(t, open, "her open tunnel runs on")
	echoCheck(t, dial(t, bob.Addr), 200_000)
}
