package integration

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	quicproxy "github.com/quic-go/quic-go/integrationtests/tools/proxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/congestion"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/ratecap"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/usage"
	"github.com/quictun/quictun/server"
)

// serveEndless serves TCP connections that write to their client until it
// goes (a download as fast as it is read) and returns the address.
func serveEndless(t *testing.T) string {
	t.Helper()
	return testutil.ServeTCP(t, func(c net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
}

// startCappedServer runs a server with alice's and bob's keys, accounting
// and the caps of rules.
func startCappedServer(t *testing.T, allow string, rules ...ratecap.Rule) *testutil.Server {
	t.Helper()
	ledger, err := usage.New(usage.Config{Path: filepath.Join(t.TempDir(), "usage.json")})
	require.NoError(t, err)
	keys, err := proto.NewKeyring(proto.Key{Name: "alice", Secret: aliceSecret}, proto.Key{Name: "bob", Secret: bobSecret})
	require.NoError(t, err)
	return testutil.StartServer(t, testutil.ServerOptions{Allow: []string{allow}, Mutate: func(c *server.Config) {
		c.Keys, c.Usage, c.RateLimits = keys, ledger, ratecap.NewTable(rules, ratecap.Rate{})
	}})
}

// measure counts the bytes add reports from warm until warm+window and
// returns the rate in bytes per second.
func measure(counter *atomic.Int64, warm, window time.Duration) float64 {
	time.Sleep(warm) // a rate is bytes over wall-clock time: no event to wait for
	start, n0 := time.Now(), counter.Load()
	time.Sleep(window)
	return float64(counter.Load()-n0) / time.Since(start).Seconds()
}

// TestDownloadCapSharedByConnections (issue 35 item 2): a 20 Mbit/s
// download cap holds within 5 % for one identity's four downloads over two
// connections, whatever congestion controller the client runs; another
// identity is not capped by it.
func TestDownloadCapSharedByConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a rate for seconds")
	}
	const capBytes = 20e6 / 8
	var got atomic.Int64
	source := serveEndless(t)
	srv := startCappedServer(t, "tcp:"+source, ratecap.Rule{Identity: "key=alice", Rate: ratecap.Rate{Down: capBytes}})
	var wg sync.WaitGroup
	var conns []net.Conn
	for _, cc := range []congestion.Algorithm{congestion.Cubic, congestion.Reno} {
		cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + source, Secret: aliceSecret, WaitReady: true,
			QUIC: func(o *transport.QUICOptions) { o.Congestion = cc }})
		for range 2 {
			c := dial(t, cl.Addr)
			conns = append(conns, c)
			wg.Go(func() { _, _ = io.Copy(counterWriter{&got}, c) })
		}
	}
	rate := measure(&got, 1500*time.Millisecond, 3*time.Second)
	t.Logf("alice's four downloads over two connections: %.2f Mbit/s (cap 20)", rate*8/1e6)
	capHolds(t, capBytes, rate, "alice")

	// bob is not capped: he gets clearly more than alice's cap.
	var bobGot atomic.Int64
	bob := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + source, Secret: bobSecret, WaitReady: true})
	bc := dial(t, bob.Addr)
	wg.Go(func() { _, _ = io.Copy(counterWriter{&bobGot}, bc) })
	bobRate := measure(&bobGot, 1500*time.Millisecond, 1500*time.Millisecond)
	t.Logf("bob, uncapped, beside her: %.2f Mbit/s", bobRate*8/1e6)
	// Held to alice's cap he would get at most 5 % over it. Only where the
	// machine delivered her cap: starved of CPU (make test's -race beside two
	// busy loops and a benchmark) an uncapped download here got 2-14 Mbit/s
	// while alice's capped ones got 9-16 of their 20; on a quiet machine he
	// gets 48-267.
	if rate < 0.9*capBytes {
		t.Logf("bob: not checked, the machine delivered only %.0f %% of alice's cap", 100*rate/capBytes)
	} else {
		assert.Greater(t, bobRate, 1.15*capBytes, "bob is not held to alice's cap")
	}
	for _, c := range append(conns, bc) {
		_ = c.Close()
	}
	wg.Wait()
}

// TestUploadCap (issue 35 item 2): a 20 Mbit/s upload cap holds within 5 %:
// the server reads alice's streams no faster, flow control holds her back.
func TestUploadCap(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a rate for seconds")
	}
	const capBytes = 20e6 / 8
	var got atomic.Int64
	sink := testutil.ServeTCP(t, func(c net.Conn) { _, _ = io.Copy(counterWriter{&got}, c) })
	srv := startCappedServer(t, "tcp:"+sink, ratecap.Rule{Identity: "key=alice", Rate: ratecap.Rate{Up: capBytes}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + sink, Secret: aliceSecret, WaitReady: true})
	var wg sync.WaitGroup
	var conns []net.Conn
	for range 2 {
		c := dial(t, cl.Addr)
		conns = append(conns, c)
		wg.Go(func() {
			buf := make([]byte, 32<<10)
			for {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		})
	}
	rate := measure(&got, 1500*time.Millisecond, 3*time.Second)
	t.Logf("alice's two uploads: %.2f Mbit/s (cap 20)", rate*8/1e6)
	capHolds(t, capBytes, rate, "upload")
	for _, c := range conns {
		_ = c.Close()
	}
	wg.Wait()
}

// counterWriter counts what is written to it.
type counterWriter struct{ n *atomic.Int64 }

func (w counterWriter) Write(p []byte) (int, error) { w.n.Add(int64(len(p))); return len(p), nil }

// TestTwoDownloadCapsAtOnce (issue 35 targets): alice capped at 20 Mbit/s
// and bob at 40 Mbit/s download at the same time; both caps hold within
// 5 % (of application bytes: a cap counts packet bytes, about 2-3 % more).
func TestTwoDownloadCapsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a rate for seconds")
	}
	source := serveEndless(t)
	srv := startCappedServer(t, "tcp:"+source,
		ratecap.Rule{Identity: "key=alice", Rate: ratecap.Rate{Down: 20e6 / 8}},
		ratecap.Rule{Identity: "key=bob", Rate: ratecap.Rate{Down: 40e6 / 8}})
	var wg sync.WaitGroup
	var conns []net.Conn
	counters := map[string]*atomic.Int64{"alice": {}, "bob": {}}
	for name, secret := range map[string][]byte{"alice": aliceSecret, "bob": bobSecret} {
		cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + source, Secret: secret, WaitReady: true})
		for range 2 {
			c := dial(t, cl.Addr)
			conns = append(conns, c)
			wg.Go(func() { _, _ = io.Copy(counterWriter{counters[name]}, c) })
		}
	}
	time.Sleep(1500 * time.Millisecond) // a rate is bytes over wall-clock time
	start := time.Now()
	a0, b0 := counters["alice"].Load(), counters["bob"].Load()
	time.Sleep(3 * time.Second)
	secs := time.Since(start).Seconds()
	alice, bob := float64(counters["alice"].Load()-a0)/secs, float64(counters["bob"].Load()-b0)/secs
	t.Logf("at once: alice %.2f Mbit/s (cap 20), bob %.2f Mbit/s (cap 40)", alice*8/1e6, bob*8/1e6)
	capHolds(t, 20e6/8, alice, "alice")
	capHolds(t, 40e6/8, bob, "bob")
	for _, c := range conns {
		_ = c.Close()
	}
	wg.Wait()
}

// TestLinkRateLeavesTheRest (issue 35, --link-rate): with the server's
// link rate at 60 Mbit/s, an uncapped identity's downloads are paced to
// what a capped one leaves of it: all 60 while the capped one is idle,
// about 40 while it downloads at its 20; the capped one keeps its cap.
// Without the link rate (loopback has no bottleneck) the uncapped one runs
// far above 60.
func TestLinkRateLeavesTheRest(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a rate for seconds")
	}
	source := serveEndless(t)
	const link, capBytes = 60e6 / 8, 20e6 / 8
	srv := startCappedServer(t, "tcp:"+source, ratecap.Rule{Identity: "key=alice", Rate: ratecap.Rate{Down: capBytes}})
	srv.RateLimits().SetLink(ratecap.Rate{Down: link})
	counters := map[string]*atomic.Int64{"alice": {}, "bob": {}}
	var wg sync.WaitGroup
	var conns []net.Conn
	download := func(name string, secret []byte) {
		cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + source, Secret: secret, WaitReady: true})
		for range 2 {
			c := dial(t, cl.Addr)
			conns = append(conns, c)
			wg.Go(func() { _, _ = io.Copy(counterWriter{counters[name]}, c) })
		}
	}
	download("bob", bobSecret)
	alone := measure(counters["bob"], 1500*time.Millisecond, 2*time.Second)
	download("alice", aliceSecret)
	time.Sleep(1500 * time.Millisecond) // a rate is bytes over wall-clock time
	start := time.Now()
	a0, b0 := counters["alice"].Load(), counters["bob"].Load()
	time.Sleep(3 * time.Second)
	secs := time.Since(start).Seconds()
	alice, bob := float64(counters["alice"].Load()-a0)/secs, float64(counters["bob"].Load()-b0)/secs
	t.Logf("link 60 Mbit/s: bob alone %.1f Mbit/s; at once alice %.1f (cap 20), bob %.1f", alone*8/1e6, alice*8/1e6, bob*8/1e6)
	// QUIC packet bytes are paced, application bytes counted: at most the
	// rate, a few % under it.
	assert.LessOrEqual(t, alone, link*1.05, "bob alone: no more than the link")
	capHolds(t, capBytes, alice, "alice")
	assert.LessOrEqual(t, bob, (link-capBytes)*1.05, "bob beside alice: the link less alice's use")
	if !testutil.RaceEnabled {
		assert.GreaterOrEqual(t, alone, link*0.85, "bob alone: the whole link")
		assert.GreaterOrEqual(t, bob, (link-capBytes)*0.85, "bob beside alice: the rest")
	}
	for _, c := range conns {
		_ = c.Close()
	}
	wg.Wait()
}

// capHolds checks a capped rate (bytes/s): never more than 5 % over the cap
// (what the cap promises, on any machine), and within 5 % under it when the
// machine has the capacity. Under the race detector (make test: every
// package at once on two cores) the applications may not read as fast as
// the cap allows, by a margin that depends on the machine's load: a 40
// Mbit/s cap beside a 20 Mbit/s one got 27-32 Mbit/s there, and 23 with one
// more busy process, so the floor is only logged; the ±5 % target is the
// bench's (ratecap scenario), on a quiet machine.
func capHolds(t *testing.T, capBytes, rate float64, who string) {
	t.Helper()
	assert.LessOrEqual(t, rate, capBytes*1.05, "%s: the cap holds (%.0f B/s over a cap of %.0f)", who, rate, capBytes)
	if testutil.RaceEnabled {
		t.Logf("%s: %.0f %% of the cap used (not checked under the race detector)", who, 100*rate/capBytes)
		return
	}
	assert.GreaterOrEqual(t, rate, capBytes*0.95, "%s: the cap is used (%.0f B/s of %.0f)", who, rate, capBytes)
}

// TestCappedServerSendsTailCopies: a server with rate caps wraps its
// connections' controllers (pkg/ratecap) and still sends bbr's copies of
// tail packets on a lossy path (issue 35; until 292c801 the wrapper hid
// bbr's congestion.TailCopier and a capped server sent none). Short echo
// exchanges of a capped identity through a proxy that drops 30 % of the
// packets each way.
func TestCappedServerSendsTailCopies(t *testing.T) {
	if testing.Short() {
		t.Skip("short exchanges at heavy loss for seconds")
	}
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := startCappedServer(t, "tcp:"+echo, ratecap.Rule{Identity: "key=alice", Rate: ratecap.Rate{Down: 100e6 / 8}})
	var lossy atomic.Bool
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(7, 35)) //nolint:gosec // the proxy's loss pattern, not a secret
	proxy := directedProxy(t, srv, func(quicproxy.Direction) bool {
		if !lossy.Load() {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		return rng.Float64() < 0.3
	})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: aliceSecret, ServerAddr: proxy, WaitReady: true})
	lossy.Store(true)

	tailCopies := func() (n uint64) {
		for _, cs := range srv.ConnStats() {
			n += cs.Stats.TailCopiesSent
		}
		return n
	}
	msg := bytes.Repeat([]byte("tail"), 250)
	deadline := time.Now().Add(20 * time.Second)
	exchanges := 0
	for ; exchanges < 200 && tailCopies() == 0 && time.Now().Before(deadline); exchanges++ {
		c := dial(t, cl.Addr)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err := c.Write(msg)
		require.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = io.ReadFull(c, got)
		require.NoError(t, err, "exchange %d", exchanges)
		require.Equal(t, msg, got)
		_ = c.Close()
	}
	t.Logf("%d exchanges at 30 %% loss each way: the capped server sent %d tail copies", exchanges, tailCopies())
	assert.NotZero(t, tailCopies(), "a capped server sends tail copies on a lossy path")
}
