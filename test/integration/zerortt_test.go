package integration

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/server"
)

// restartWith0RTT runs a server, connects a client
// (which gets a session ticket), stops the server, dials an application
// connection while it is down (so it waits for the reconnect), and restarts
// the server from newState. It returns the client and the waiting connection.
func restartWith0RTT(t *testing.T, newState func(old string) string) (*testutil.Client, *net.TCPConn, *testutil.Server) {
	t.Helper()
	echo := testutil.EchoServer(t)
	state := t.TempDir()
	noDrain := func(c *server.Config) { c.DrainTimeout = 0 }
	srv := testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Allow: []string{"tcp:" + echo}, Mutate: noDrain})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})
	echoCheck(t, dial(t, cl.Addr), 1000) // the server sends a session ticket after the handshake
	srv.Stop(t)
	require.Eventually(t, func() bool { return !cl.Client.Ready() }, 5*time.Second, 5*time.Millisecond)
	c := dial(t, cl.Addr) // waits for the session
	srv2 := testutil.StartServer(t, testutil.ServerOptions{StateDir: newState(state), Addr: srv.Addr, Allow: []string{"tcp:" + echo}})
	return cl, c, srv2
}

func TestZeroRTTReconnectAfterServerRestart(t *testing.T) {
	cl, c, srv2 := restartWith0RTT(t, func(old string) string { return old })
	msg := []byte("first bytes, sent as 0-RTT data")
	_, err := c.Write(msg)
	require.NoError(t, err)
	require.NoError(t, c.CloseWrite())
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	assert.Equal(t, msg, got)
	assert.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("ok_0rtt")) == 1 },
		5*time.Second, 5*time.Millisecond, "the reconnect must resume with 0-RTT")
	assert.Zero(t, promtest.ToFloat64(srv2.Metrics.StreamsTotal.WithLabelValues("replay")))
}

// TestZeroRTTRejectedIsResent: the restarted server has a new ticket key, so
// it rejects 0-RTT and drops that data; the client must re-send it.
func TestZeroRTTRejectedIsResent(t *testing.T) {
	cl, c, _ := restartWith0RTT(t, func(old string) string {
		dir := t.TempDir()
		for _, f := range []string{transport.CertFileName, transport.KeyFileName, transport.ResetKeyFileName} {
			b, err := os.ReadFile(filepath.Join(old, f))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o600))
		}
		return dir // same identity, new session-ticket key
	})
	msg := make([]byte, 100<<10)
	for i := range msg {
		msg[i] = byte(i)
	}
	go func() { _, _ = c.Write(msg); _ = c.CloseWrite() }()
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	assert.Equal(t, msg, got, "bytes sent as rejected 0-RTT data must be re-sent, in order")
	assert.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("0rtt_rejected")) == 1 },
		5*time.Second, 5*time.Millisecond)
}

// TestZeroRTTReplayRefused replays, from another socket, the client's
// captured packets of a 0-RTT reconnect: the server takes the replayed
// Initial as a new connection and decrypts the 0-RTT stream, but its header's
// nonce was seen, so the stream is reset with the replay code and the
// destination is never dialed a second time.
func TestZeroRTTReplayRefused(t *testing.T) {
	var dials atomic.Int64
	echo := testutil.ServeTCP(t, func(c net.Conn) {
		dials.Add(1)
		_, _ = io.Copy(c, c)
		_ = c.(*net.TCPConn).CloseWrite()
	})
	state := t.TempDir()
	noDrain := func(c *server.Config) { c.DrainTimeout = 0 }
	srv := testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Allow: []string{"tcp:" + echo}, Mutate: noDrain})
	var recording atomic.Bool
	var mu sync.Mutex
	var captured [][]byte
	recordProxy := recordingProxy(t, srv, func(pkt []byte) {
		if recording.Load() {
			mu.Lock()
			captured = append(captured, bytes.Clone(pkt))
			mu.Unlock()
		}
	})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: recordProxy, WaitReady: true})
	echoCheck(t, dial(t, cl.Addr), 100) // gets a session ticket
	// Record from before the server stops, so the capture holds the whole
	// reconnect, its first Initial too.
	recording.Store(true)
	srv.Stop(t)
	require.Eventually(t, func() bool { return !cl.Client.Ready() }, 5*time.Second, 5*time.Millisecond)
	c := dial(t, cl.Addr)
	// The server comes back only once the client redialed (with 0-RTT, after
	// a backoff): the tunnel's header then goes out as 0-RTT data, which is
	// what is replayed below.
	require.Eventually(t, func() bool { return len(cl.Client.ConnStats()) == 1 }, 5*time.Second, time.Millisecond)
	srv2 := testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Addr: srv.Addr, Allow: []string{"tcp:" + echo}})
	_, err := c.Write([]byte("0-rtt request"))
	require.NoError(t, err)
	got := make([]byte, len("0-rtt request"))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("ok_0rtt")) == 1 },
		5*time.Second, 5*time.Millisecond, "the reconnect must use 0-RTT for the replay to mean anything")
	recording.Store(false)
	_ = c.Close()
	cl.Stop(t) // the original connection ends; its connection IDs are then free to be replayed
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv2.Metrics.ActiveConnections) == 0 },
		5*time.Second, 5*time.Millisecond)
	before := dials.Load()

	attacker, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer func() { _ = attacker.Close() }()
	sa, err := net.ResolveUDPAddr("udp", srv2.Addr)
	require.NoError(t, err)
	mu.Lock()
	pkts := captured
	mu.Unlock()
	require.NotEmpty(t, pkts)
	require.Eventually(t, func() bool {
		// Replay until the server has forgotten the original connection and takes the packets as new.
		for _, pkt := range pkts {
			_, _ = attacker.WriteToUDP(pkt, sa)
		}
		return promtest.ToFloat64(srv2.Metrics.StreamsTotal.WithLabelValues("replay")) >= 1
	}, 10*time.Second, 200*time.Millisecond, "the replayed 0-RTT stream must be refused")
	assert.Equal(t, before, dials.Load(), "a replay must not reach the destination")
}

// TestResumedDialWithoutAnswerIsAnError: a resumed attempt is usable before
// its handshake (0-RTT); one the server never completes (it is gone) is a
// failed dial, not a connection.
func TestResumedDialWithoutAnswerIsAnError(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) { c.DrainTimeout = 0 }})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})
	echoCheck(t, dial(t, cl.Addr), 1000) // the server sends a session ticket after the handshake
	dials := func(result string) float64 { return promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues(result)) }
	require.Equal(t, 1.0, dials("ok"))
	srv.Stop(t) // and does not come back
	require.Eventually(t, func() bool { return dials("error") >= 1 }, 20*time.Second, 10*time.Millisecond,
		"the resumed attempts time out")
	assert.Equal(t, 1.0, dials("ok"), "a resumed attempt that never completed is no connection")
	assert.Zero(t, dials("ok_0rtt"))
	assert.False(t, cl.Client.Ready())
}

// TestZeroRTTReplayToAnotherReplica (issue 30 R6): two servers share a
// session-ticket key, as the Helm chart's replicas do, so each resumes the
// other's sessions, but each has its own replay cache. A client's 0-RTT
// reconnect to replica a is recorded on the path and sent to replica b
// within the replay window. With replica IDs apart, b resumes a's ticket
// without 0-RTT (session_tickets_total{issuer="other_replica"}) and never
// sees the flight's streams: the destination is reached once. With one ID
// for both (the control: as every replica was before replica IDs), b
// serves the replayed tunnel again.
func TestZeroRTTReplayToAnotherReplica(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		replicaB string
		issuer   string
		replayed bool // b serves the replayed tunnel
	}{
		{"replica IDs apart", "b", transport.IssuerOtherReplica, false},
		{"control: one replica ID for both", "a", transport.IssuerThisReplica, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var dials atomic.Int64
			echo := testutil.ServeTCP(t, func(c net.Conn) {
				dials.Add(1)
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			})
			state := t.TempDir() // one ticket key (and certificate) for both
			replica := func(id, addr string) testutil.ServerOptions {
				return testutil.ServerOptions{StateDir: state, Addr: addr, Allow: []string{"tcp:" + echo},
					Mutate: func(c *server.Config) { c.ReplicaID, c.DrainTimeout = id, 0 }}
			}
			a := testutil.StartServer(t, replica("a", ""))
			b := testutil.StartServer(t, replica(tc.replicaB, ""))
			pkts := recordZeroRTTReconnect(t, a, func() *testutil.Server { return testutil.StartServer(t, replica("a", a.Addr)) }, echo)
			before := dials.Load()

			attacker, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			require.NoError(t, err)
			defer func() { _ = attacker.Close() }()
			sb, err := net.ResolveUDPAddr("udp", b.Addr)
			require.NoError(t, err)
			tickets := func() float64 { return promtest.ToFloat64(b.Metrics.SessionTicketsTotal.WithLabelValues(tc.issuer)) }
			require.Eventually(t, func() bool {
				for _, pkt := range pkts {
					_, _ = attacker.WriteToUDP(pkt, sb)
				}
				return tickets() >= 1
			}, 10*time.Second, 500*time.Millisecond, "replica b resumes the recorded session (issuer %s)", tc.issuer)
			// The replayed connection cannot complete its handshake: once b
			// has closed it, nothing more of the flight can be served.
			require.Eventually(t, func() bool { return connectionsEnded(b) >= 1 }, 20*time.Second, 10*time.Millisecond)
			if tc.replayed {
				assert.Greater(t, dials.Load(), before, "the control: b serves the replayed 0-RTT tunnel")
				return
			}
			assert.Equal(t, before, dials.Load(), "a 0-RTT flight is served by one replica only")
			assert.Zero(t, promtest.ToFloat64(b.Metrics.StreamsTotal.WithLabelValues("ok")))
			assert.Zero(t, promtest.ToFloat64(b.Metrics.StreamsTotal.WithLabelValues("replay")), "b never saw the 0-RTT streams")
		})
	}
}

// connectionsEnded is the number of connections srv has closed, for any
// reason.
func connectionsEnded(srv *testutil.Server) float64 {
	n := 0.0
	for _, r := range []string{"closed", "idle_timeout", "auth_failed", "auth_timeout", "shutdown", "error"} {
		n += promtest.ToFloat64(srv.Metrics.ConnectionsTotal.WithLabelValues(r))
	}
	return n
}

// recordZeroRTTReconnect connects a client to srv through a proxy that
// records what the client sends, stops srv, has the client redial with
// 0-RTT and send a tunnel's request as 0-RTT data, starts srv again with
// restart (same address, same session-ticket key), and returns the
// recorded packets once the request was answered over a 0-RTT connection
// and the client has stopped (its connection IDs are then free to be
// replayed).
func recordZeroRTTReconnect(t *testing.T, srv *testutil.Server, restart func() *testutil.Server, echo string) [][]byte {
	t.Helper()
	var recording atomic.Bool
	var mu sync.Mutex
	var captured [][]byte
	proxy := recordingProxy(t, srv, func(pkt []byte) {
		if recording.Load() {
			mu.Lock()
			captured = append(captured, bytes.Clone(pkt))
			mu.Unlock()
		}
	})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: proxy, WaitReady: true})
	echoCheck(t, dial(t, cl.Addr), 100) // gets a session ticket
	recording.Store(true)
	srv.Stop(t)
	require.Eventually(t, func() bool { return !cl.Client.Ready() }, 5*time.Second, 5*time.Millisecond)
	c := dial(t, cl.Addr)
	require.Eventually(t, func() bool { return len(cl.Client.ConnStats()) == 1 }, 5*time.Second, time.Millisecond)
	srv2 := restart()
	_, err := c.Write([]byte("0-rtt request"))
	require.NoError(t, err)
	got := make([]byte, len("0-rtt request"))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("ok_0rtt")) == 1 },
		5*time.Second, 5*time.Millisecond, "the reconnect must use 0-RTT for the replay to mean anything")
	recording.Store(false)
	_ = c.Close()
	cl.Stop(t)
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv2.Metrics.ActiveConnections) == 0 },
		5*time.Second, 5*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, captured)
	return captured
}
