package integration

import (
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
)

// natRelay is a UDP relay in front of the server that behaves like a NAT:
// each client address gets a mapping, a socket of its own toward the server.
// Rebind gives every mapping a new socket (new source port, and a new source
// IP if asked), as a NAT that lost its state or a new uplink does; packets
// the server still sends to an old mapping are dropped and counted, as a NAT
// drops them. Block makes one client address dark in both directions, as if
// the client's socket had lost its address. Every packet is delayed by
// oneWay in each direction (in order).
type natRelay struct {
	front  *net.UDPConn
	server *net.UDPAddr

	mu      sync.Mutex
	maps    map[string]*natMapping // by client address
	blocked map[string]bool
	backIP  net.IP
	retired []*net.UDPConn
	closed  bool

	toOld      atomic.Int64 // server packets that arrived on a replaced mapping
	rebindAt   atomic.Int64 // unix nanoseconds of the last Rebind
	firstAfter atomic.Int64 // unix nanoseconds of the first server packet on a mapping made by it

	up, down *delayLine
	readers  sync.WaitGroup // socket readers; they push to the delay lines
	lines    sync.WaitGroup
}

type natMapping struct {
	client   *net.UDPAddr
	back     *net.UDPConn // guarded by natRelay.mu
	up, down atomic.Int64 // packets forwarded
}

// delayLine sends packets after a fixed delay, in order.
type delayLine struct {
	ch    chan delayed
	delay time.Duration
}

type delayed struct {
	due  time.Time
	pkt  []byte
	send func([]byte)
}

func (d *delayLine) run() {
	for p := range d.ch {
		time.Sleep(time.Until(p.due))
		p.send(p.pkt)
	}
}

func (d *delayLine) push(pkt []byte, send func([]byte)) {
	if d.delay <= 0 {
		send(pkt)
		return
	}
	select {
	case d.ch <- delayed{due: time.Now().Add(d.delay), pkt: pkt, send: send}:
	default: // queue full: drop, as a router would
	}
}

// startNATRelay starts a relay toward srv; its mappings use source address
// 127.0.0.1 until a Rebind changes it. It stops when the test ends.
func startNATRelay(t *testing.T, srv *testutil.Server, oneWay time.Duration) *natRelay {
	t.Helper()
	front, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	sa, err := net.ResolveUDPAddr("udp", srv.Addr)
	require.NoError(t, err)
	r := &natRelay{
		front: front, server: sa,
		maps: map[string]*natMapping{}, blocked: map[string]bool{}, backIP: net.IPv4(127, 0, 0, 1),
		up:   &delayLine{ch: make(chan delayed, 512), delay: oneWay},
		down: &delayLine{ch: make(chan delayed, 512), delay: oneWay},
	}
	r.lines.Go(r.up.run)
	r.lines.Go(r.down.run)
	r.readers.Go(r.runFront)
	t.Cleanup(r.close)
	return r
}

func (r *natRelay) Addr() string { return r.front.LocalAddr().String() }

// runFront forwards client packets to the server through their mapping.
func (r *natRelay) runFront() {
	for {
		buf := make([]byte, 1500)
		n, from, err := r.front.ReadFromUDP(buf)
		if err != nil {
			return
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return
		}
		if r.blocked[from.String()] {
			r.mu.Unlock()
			continue
		}
		m, ok := r.maps[from.String()]
		if !ok {
			back, err := net.ListenUDP("udp", &net.UDPAddr{IP: r.backIP})
			if err != nil {
				r.mu.Unlock()
				continue
			}
			m = &natMapping{client: from, back: back}
			r.maps[from.String()] = m
			r.startBack(m, back, false)
		}
		back := m.back
		r.mu.Unlock()
		m.up.Add(1)
		r.up.push(buf[:n], func(p []byte) { _, _ = back.WriteToUDP(p, r.server) })
	}
}

// startBack reads the server's packets on back and forwards them to the
// client while back is the mapping's current socket. Called with r.mu held.
func (r *natRelay) startBack(m *natMapping, back *net.UDPConn, afterRebind bool) {
	r.readers.Go(func() {
		for {
			buf := make([]byte, 1500)
			n, err := back.Read(buf)
			if err != nil {
				return
			}
			r.mu.Lock()
			current, blocked := m.back == back, r.blocked[m.client.String()]
			r.mu.Unlock()
			if !current {
				r.toOld.Add(1)
				continue
			}
			if afterRebind {
				r.firstAfter.CompareAndSwap(0, time.Now().UnixNano())
			}
			if blocked {
				continue
			}
			m.down.Add(1)
			r.down.push(buf[:n], func(p []byte) { _, _ = r.front.WriteToUDP(p, m.client) })
		}
	})
}

// Rebind gives every mapping a new socket toward the server on ip (new port).
func (r *natRelay) Rebind(t *testing.T, ip net.IP) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.backIP = ip
	r.firstAfter.Store(0)
	r.rebindAt.Store(time.Now().UnixNano())
	for _, m := range r.maps {
		back, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip})
		require.NoError(t, err)
		// The old socket stays open, so the server's packets to it are
		// dropped here (and counted) instead of drawing ICMP errors.
		r.retired = append(r.retired, m.back)
		m.back = back
		r.startBack(m, back, true)
	}
}

// Block makes the client address addr dark in both directions.
func (r *natRelay) Block(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.blocked[addr] = true
}

// Clients returns the client addresses seen so far.
func (r *natRelay) Clients() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for a := range r.maps {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// Counts returns the packets forwarded for each client address, as "up/down".
func (r *natRelay) Counts() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for a, m := range r.maps {
		out[a] = fmt.Sprintf("%d/%d", m.up.Load(), m.down.Load())
	}
	return out
}

// ServerAnsweredAfterRebind is how long after the last Rebind the server's
// first packet reached a new mapping (0 if none did).
func (r *natRelay) ServerAnsweredAfterRebind() time.Duration {
	first := r.firstAfter.Load()
	if first == 0 {
		return 0
	}
	return time.Duration(first - r.rebindAt.Load())
}

func (r *natRelay) close() {
	r.mu.Lock()
	r.closed = true
	socks := slices.Clone(r.retired)
	for _, m := range r.maps {
		socks = append(socks, m.back)
	}
	r.mu.Unlock()
	_ = r.front.Close()
	for _, s := range socks {
		_ = s.Close()
	}
	r.readers.Wait() // no more pushes
	close(r.up.ch)
	close(r.down.ch)
	r.lines.Wait()
}

// startWorkload runs the migration workload (testutil.Workload) through
// the client listening on addr: 4 ping-pong connections and bulk bytes.
func startWorkload(t *testing.T, addr string, pingPongs int, bulk int64) *testutil.Workload {
	t.Helper()
	w := testutil.StartWorkload(t, func() testutil.HalfCloser { return dial(t, addr) }, pingPongs, bulk)
	w.Warm(t, bulk/4, 30*time.Second)
	return w
}

// finishWorkload waits for the bulk transfer to end and at least 4 s to pass
// since at (more than the slowest recovery a test allows for: a rescue after
// 2 s and its probe; with 2 s the workload stopped before TestClientSocketRebind's
// rescue and a ping-pong had no round trip after at), then stops the
// workload, and reports the stall around at. The
// bound on the bulk transfer only stops a hung test: under -race with both
// cores busy 32 MiB took longer than 25 s (29 MiB echoed after 35 s), with
// the stall around at still well under its 5 s; the stall is what is checked.
func finishWorkload(t *testing.T, w *testutil.Workload, what string, at time.Time) time.Duration {
	t.Helper()
	select {
	case <-w.BulkDone():
		time.Sleep(time.Until(at.Add(4 * time.Second)))
	case <-time.After(2 * time.Minute):
		t.Error("bulk transfer did not finish")
	}
	w.Finish(t, 5*time.Second)
	stall, _ := w.Report(t, what, at, 5*time.Second)
	return stall
}

// checkSameConnection asserts that the client neither reconnected nor dialed
// again and that the server kept exactly one connection, never ended.
func checkSameConnection(t *testing.T, srv *testutil.Server, cl *testutil.Client) {
	t.Helper()
	assert.Zero(t, promtest.ToFloat64(cl.Metrics.ReconnectsTotal), "client reconnects")
	dials := promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("ok")) + promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("ok_0rtt"))
	assert.Equal(t, 1.0, dials, "client dials")
	assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.ActiveConnections), "server's live QUIC connections")
	for _, r := range []string{"closed", "idle_timeout", "auth_failed", "shutdown", "error"} {
		assert.Zero(t, promtest.ToFloat64(srv.Metrics.ConnectionsTotal.WithLabelValues(r)), "server connections ended (%s)", r)
	}
	assert.Len(t, srv.ConnStats(), 1, "server connections")
}

// migrationBulk is the bulk transfer that runs across a migration.
func migrationBulk() int64 {
	if testing.Short() {
		return 8 << 20
	}
	return 32 << 20
}

// TestNATRebinding: mid-transfer the NAT in front of the client changes the
// source port (and, in the "address" cases, the source IP) the server sees.
// The server must follow the client to the new address by itself (QUIC path
// validation), open tunneled connections must carry on with verified data,
// and the client's QUIC connection must stay the same. The stall is logged.
func TestNATRebinding(t *testing.T) {
	for _, tc := range []struct {
		name string
		ip   net.IP
		bulk int64
	}{
		{"port/ping-pong", net.IPv4(127, 0, 0, 1), 0},
		{"port/ping-pong+bulk", net.IPv4(127, 0, 0, 1), migrationBulk()},
		{"address/ping-pong", net.IPv4(127, 0, 0, 2), 0},
		{"address/ping-pong+bulk", net.IPv4(127, 0, 0, 2), migrationBulk()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			echo := testutil.EchoServer(t)
			srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
			relay := startNATRelay(t, srv, 5*time.Millisecond)
			// The server follows the rebinding by itself (no rescue in the
			// logs of passing runs); the client's rescue waits 3 s, not 1 s,
			// so that late echoes on a loaded machine (-race, both cores busy)
			// do not open a second mapping before the rebind.
			cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: relay.Addr(), WaitReady: true,
				Mutate: func(c *client.Config) { c.RescueAfter = 3 * time.Second }})
			w := startWorkload(t, cl.Addr, 4, tc.bulk)
			require.Len(t, relay.Clients(), 1, "one client mapping before the rebind")
			at := time.Now()
			relay.Rebind(t, tc.ip)
			stall := finishWorkload(t, w, "NAT rebinding", at)
			answered := relay.ServerAnsweredAfterRebind()
			t.Logf("NAT rebinding to %s: server's first packet to the new mapping after %v; %d server packets went to the old mapping; rescues %v/%v/%v (switched/recovered/error)",
				tc.ip, answered.Round(100*time.Microsecond), relay.toOld.Load(),
				promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("switched")),
				promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("recovered")),
				promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("error")))
			assert.Positive(t, answered, "the server never sent to the new mapping: it did not migrate")
			assert.Less(t, stall, 5*time.Second, "stall after the rebinding")
			checkSameConnection(t, srv, cl)
		})
	}
}

// TestClientSocketRebind: the client's own UDP socket goes dark (its address
// is gone, as when an interface drops), so the client must move the
// connection to a new socket itself: its path rescue (rescue.go) opens one,
// probes a path from it and switches. Open tunneled connections carry on on
// the new socket and the QUIC connection stays the same, also with a bulk
// transfer's packets filling the congestion window (our quic-go patch 0003
// lets the rescue path's PATH_CHALLENGE out while congestion limited).
func TestClientSocketRebind(t *testing.T) {
	for _, tc := range []struct {
		name string
		bulk int64
		bug  string // known bug: skipped unless QUICTUN_E2E_BUGS=1 (the switch of test/e2e)
	}{
		{"ping-pong", 0, ""},
		{"ping-pong+bulk", migrationBulk(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.bug != "" && os.Getenv("QUICTUN_E2E_BUGS") != "1" {
				t.Skip("BUG: " + tc.bug + " (set QUICTUN_E2E_BUGS=1 to run)")
			}
			echo := testutil.EchoServer(t)
			srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
			relay := startNATRelay(t, srv, 5*time.Millisecond)
			cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: relay.Addr(), WaitReady: true,
				Mutate: func(c *client.Config) {
					// A rescue after 2 s without an echo: with 300 ms, echoes late
					// on a loaded machine (-race, both cores busy) started a
					// rescue before the socket was blocked (2 sockets seen).
					c.HeartbeatInterval, c.RescueAfter = 100*time.Millisecond, 2*time.Second
				}})
			w := startWorkload(t, cl.Addr, 4, tc.bulk)
			old := relay.Clients()
			require.Len(t, old, 1, "one client socket before the rebinding")
			at := time.Now()
			relay.Block(old[0])
			stall := finishWorkload(t, w, "client socket lost", at)
			now := relay.Clients()
			t.Logf("client socket lost: client sockets seen by the relay %v (packets up/down %v); rescues %v/%v/%v (switched/recovered/error)",
				now, relay.Counts(),
				promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("switched")),
				promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("recovered")),
				promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("error")))
			assert.Len(t, now, 2, "the client moved to exactly one new socket")
			assert.Equal(t, 1.0, promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("switched")), "path rescues switched")
			assert.Less(t, stall, 5*time.Second, "stall after losing the socket")
			checkSameConnection(t, srv, cl)
			// A client that moved to its rescue socket still closes its
			// connection as it stops (the server counted idle_timeout after
			// its idle timeout before: the rescue socket was closed first).
			cl.Stop(t)
			require.Eventually(t, func() bool {
				return promtest.ToFloat64(srv.Metrics.ConnectionsTotal.WithLabelValues("shutdown")) == 1
			}, 10*time.Second, 20*time.Millisecond, "the server saw the client's close (shutdown)")
		})
	}
}

// unreachableConn fails every write with "network is unreachable" while down
// is set, as sendmsg does while the host has no address or route.
type unreachableConn struct {
	net.PacketConn
	down *atomic.Bool
}

func (c unreachableConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if c.down.Load() {
		return 0, &net.OpError{Op: "write", Net: "udp", Addr: addr, Err: os.NewSyscallError("sendto", syscall.ENETUNREACH)}
	}
	return c.PacketConn.WriteTo(b, addr)
}

// TestUnreachableWhileRenumbering is the in-process form of a
// break-before-make renumbering: for 300 ms every send of the client fails
// with "network is unreachable", then its packets reach the server from a new
// address (the relay rebinds). The QUIC connection and the tunnels in it must
// survive: the client counts those datagrams as lost (client/senderr.go).
func TestUnreachableWhileRenumbering(t *testing.T) {
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	relay := startNATRelay(t, srv, 5*time.Millisecond)
	var down atomic.Bool
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: relay.Addr(), WaitReady: true,
		WrapConn: func(pc net.PacketConn) net.PacketConn { return unreachableConn{PacketConn: pc, down: &down} }})
	bulk := migrationBulk()
	w := startWorkload(t, cl.Addr, 4, bulk)
	at := time.Now()
	down.Store(true)
	time.Sleep(300 * time.Millisecond)
	relay.Rebind(t, net.IPv4(127, 0, 0, 2))
	down.Store(false)
	stall := finishWorkload(t, w, "unreachable for 300 ms, then a new address", at)
	t.Logf("unreachable for 300 ms, then a new address: stall %v; rescues %v/%v/%v (switched/recovered/error)", stall.Round(100*time.Microsecond),
		promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("switched")),
		promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("recovered")),
		promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("error")))
	assert.Less(t, stall, 5*time.Second, "stall after the renumbering")
	checkSameConnection(t, srv, cl)
}
