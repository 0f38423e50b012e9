package integration

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/handover"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/usage"
	"github.com/quictun/quictun/server"
)

// echoRounds moves 4 KiB rounds through c (an echo tunnel) until stop,
// then half-closes and reads to EOF; it returns the SHA-256 of what was
// sent and received and counts its rounds.
type echoRounds struct {
	rounds      atomic.Int64
	sent, recvd [32]byte
	n           int64
	err         error
}

func (e *echoRounds) run(c net.Conn, stop <-chan struct{}) {
	sh, rh := sha256.New(), sha256.New()
	buf, back := make([]byte, 4<<10), make([]byte, 4<<10)
	defer func() { copy(e.sent[:], sh.Sum(nil)); copy(e.recvd[:], rh.Sum(nil)) }()
	for {
		select {
		case <-stop:
			if e.err = c.(interface{ CloseWrite() error }).CloseWrite(); e.err == nil {
				_, e.err = io.Copy(rh, c)
			}
			return
		default:
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		_, _ = rand.Read(buf)
		if _, e.err = c.Write(buf); e.err != nil {
			return
		}
		sh.Write(buf)
		if _, e.err = io.ReadFull(c, back); e.err != nil {
			return
		}
		rh.Write(back)
		e.n += int64(len(buf))
		e.rounds.Add(1)
	}
}

// TestServerHandOver (issue 34 part 2, in process): server A hands its
// UDP socket and its resumable tunnels over (Server.HandOver, through a
// pkg/handover socket pair as between two processes) to server B, built
// on that socket, which imports them (Server.Import) before it runs: the
// client's connection is closed with the upgrade reason, it reconnects to
// B at once and re-attaches each tunnel; no byte is lost, doubled or
// reordered (SHA-256 both ways, 5 tunnels moving data through an echo the
// whole time), and nothing is left held at the end. The accounting goes on
// exactly: B's totals, read once A saved its last (usage.Config.Deferred,
// SaveFinal), are every byte the tunnels moved, through A and B, and those
// of a tunnel that ended on A just before the upgrade (which a periodic
// save had not written), each counted once (B counts the tunnels it took
// over from where A stopped: TrackFrom). The client reaches the servers
// through a proxy adding 50 ms round trips: its resume requests go as
// 0-RTT data on its new connection to B (resumed_0rtt counted on both
// ends), not a round trip later (startHandOver, check).
//
// It found a BBR bug (pkg/congestion, TestBBRFirstPacketsSentWithOthersInFlight):
// the client's new 0-RTT connection, re-attaching every tunnel at once after
// its handshake, paced itself to a halt (14 runs in 50 stalled until the
// idle timeout).
func TestServerHandOver(t *testing.T) { // not parallel: it sets the environment (handoverPair)
	f := startHandOver(t, nil)
	done := make(chan error, 1)
	imported := make(chan struct{}) // A waits for B's answer, as for the new process's (WaitDone)
	go func() {
		done <- f.a.HandOver(context.Background(), func(ts []handover.Tunnel) error {
			if err := f.parent.SendTunnels(ts); err != nil {
				return err
			}
			<-imported
			return nil
		})
	}()
	ts, err := f.child.RecvTunnels(handover.Limits{MaxTunnels: 100, MaxTunnelBytes: 8 << 20, MaxTotalBytes: 64 << 20})
	require.NoError(t, err)
	require.Len(t, ts, f.tunnels)
	var n int
	var ierr error
	f.startB(t, nil, func(s *server.Server) { n, ierr = s.Import(context.Background(), ts) })
	require.NoError(t, ierr)
	assert.Equal(t, f.tunnels, n)
	close(imported)
	require.NoError(t, <-done)
	f.check(t)
}

// TestServerHandOverEarly (issue 34 part 2, in process): as
// TestServerHandOver, but A releases the socket (handover released) as
// soon as it stopped reading it and B serves from then on, before it has
// the tunnels: the client reconnects to B and asks for each tunnel while
// B has none of them yet; each request waits for the import
// (resume.Table.LookupWait) instead of being refused, and every tunnel
// goes on (SHA-256 both ways, accounting exact, with the totals read once
// A said it saved them). A's and B's reads of the socket never overlap:
// no read of A starts or is in progress once B read.
func TestServerHandOverEarly(t *testing.T) { // not parallel: it sets the environment (handoverPair)
	watch := &readWatch{bReading: make(chan struct{})}
	f := startHandOver(t, watch.wrap(false))
	done := make(chan error, 1)
	go func() {
		done <- f.a.HandOverSteps(context.Background(), handover.Steps{
			Released: func() error {
				if err := f.parent.SendReleased(); err != nil {
					return err
				}
				// A goes on once B reads: a read of A from now on
				// would overlap.
				<-watch.bReading
				return nil
			},
			Send: f.parent.SendTunnels,
			Saved: func() error {
				if err := f.parent.SendSaved(); err != nil {
					return err
				}
				_, err := f.parent.WaitDone(time.Now().Add(time.Minute))
				return err
			},
		})
	}()
	released, err := f.child.RecvReleased()
	require.NoError(t, err)
	require.True(t, released)
	var endImport func()
	b := f.startB(t, watch.wrap(true), func(s *server.Server) { endImport = s.BeginImport() })
	require.Eventually(t, func() bool { return f.sideB.table.Waiting() == f.tunnels }, 20*time.Second, time.Millisecond,
		"the client asked B for each tunnel before B had it")
	// Each tunnel imported as it arrives, as the new process does.
	n := 0
	got, err := f.child.RecvTunnelsEach(handover.Limits{MaxTunnels: 100, MaxTunnelBytes: 8 << 20, MaxTotalBytes: 64 << 20}, func(ht handover.Tunnel) {
		if assert.NoError(t, b.ImportTunnel(context.Background(), ht)) {
			n++
		}
	})
	require.NoError(t, err)
	assert.Equal(t, f.tunnels, got)
	assert.Equal(t, f.tunnels, n)
	endImport()
	require.NoError(t, f.child.RecvSaved())
	b.LoadUsage(context.Background())
	require.NoError(t, f.child.SendDone(n, ""))
	require.NoError(t, <-done)
	assert.Zero(t, f.sideB.table.Waiting())
	assert.Zero(t, watch.aAfterB.Load(), "reads of A that started once B read")
	assert.Zero(t, watch.aDuringB.Load(), "reads of A in progress when B read")
	assert.Positive(t, watch.bReads.Load())
	assert.Zero(t, promtest.ToFloat64(f.sideB.metrics.Refused.WithLabelValues(resume.RefusedUnknown)), "no request refused as unknown")
	f.check(t)
}

// readWatch records the reads of one UDP socket by server A, then B.
type readWatch struct {
	aReading                  atomic.Int64 // A's reads in progress
	bStarted                  atomic.Bool
	bReading                  chan struct{} // closed at B's first read
	bOnce                     sync.Once
	bReads, aAfterB, aDuringB atomic.Int64
}

// wrap returns the WrapConn of A (b false) or B.
func (w *readWatch) wrap(b bool) func(net.PacketConn) net.PacketConn {
	return func(pc net.PacketConn) net.PacketConn { return watchedConn{PacketConn: pc, w: w, b: b} }
}

type watchedConn struct {
	net.PacketConn
	w *readWatch
	b bool
}

func (c watchedConn) ReadFrom(p []byte) (int, net.Addr, error) {
	w := c.w
	if c.b {
		w.bStarted.Store(true)
		w.bOnce.Do(func() { close(w.bReading) })
		w.bReads.Add(1)
		if w.aReading.Load() > 0 {
			w.aDuringB.Add(1)
		}
		return c.PacketConn.ReadFrom(p)
	}
	w.aReading.Add(1)
	defer w.aReading.Add(-1)
	if w.bStarted.Load() {
		w.aAfterB.Add(1)
	}
	return c.PacketConn.ReadFrom(p)
}

// handOverFixture is server A with a client's resumable tunnels moving
// data through an echo, and a handover socket pair on which A's UDP
// socket was sent (as between two processes).
type handOverFixture struct {
	tunnels               int
	echo                  string
	sideA, sideB, cliSide *resumeSide
	usagePath             string
	ledgerA, ledgerB      *usage.Ledger
	a                     *testutil.Server
	load                  *echoLoad
	parent, child         *handover.Conn
	pcB                   *net.UDPConn
	ended                 int64 // bytes each way of a tunnel that ended on A before the upgrade
}

// startHandOver starts A (its socket wrapped by wrapA, if set), the
// client, a tunnel that ends before the upgrade and 5 moving ones, and
// sends A's socket on the handover pair.
func startHandOver(t *testing.T, wrapA func(net.PacketConn) net.PacketConn) *handOverFixture {
	t.Helper()
	f := &handOverFixture{tunnels: 5, echo: testutil.EchoServer(t), ended: 1 << 20,
		sideA: newResumeSide(server.NewResumeMetrics), sideB: newResumeSide(server.NewResumeMetrics), cliSide: newResumeSide(client.NewResumeMetrics)}
	f.usagePath = filepath.Join(t.TempDir(), "usage.json")
	var err error
	f.ledgerA, err = usage.New(usage.Config{Path: f.usagePath})
	require.NoError(t, err)
	f.ledgerB, err = usage.New(usage.Config{Path: f.usagePath, Deferred: true}) // as a process started by an upgrade
	require.NoError(t, err)
	f.a = testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + f.echo}, WrapConn: wrapA,
		Mutate: func(c *server.Config) { c.Resume, c.Usage = f.sideA.egress(time.Minute), f.ledgerA }})
	// 50 ms round trips: the re-attachments go on the client's new
	// connection long before its handshake completes.
	var never atomic.Bool
	proxy := lossyProxy(t, f.a, 25*time.Millisecond, &never, nil)
	cl := testutil.StartClient(t, f.a, testutil.ClientOptions{Token: "tcp:" + f.echo, WaitReady: true, ServerAddr: proxy,
		Mutate: func(c *client.Config) { c.Resume = f.cliSide.ingress(time.Minute) }})

	done0 := dial(t, cl.Addr)
	echoCheck(t, done0, f.ended)
	_ = done0.Close()
	require.Eventually(t, func() bool { return f.sideA.table.Len() == 0 }, 10*time.Second, time.Millisecond)
	f.load = startEchoLoad(t, cl.Addr, f.tunnels)
	require.Eventually(t, func() bool { return f.sideA.table.Len() == f.tunnels }, 10*time.Second, time.Millisecond)

	// The two ends of the handover socket, in one process: what A sends
	// arrives as B would receive it in its own process.
	f.parent, f.child = handoverPair(t)
	udpFile, err := f.a.PacketConn().(*net.UDPConn).File()
	require.NoError(t, err)
	require.NoError(t, f.parent.SendListeners([]handover.Listener{{Name: "udp", File: udpFile}}))
	require.NoError(t, udpFile.Close())
	ls, err := f.child.RecvListeners()
	require.NoError(t, err)
	require.Len(t, ls, 1)
	pcB, err := net.FilePacketConn(ls[0].File)
	require.NoError(t, err)
	require.NoError(t, ls[0].File.Close())
	f.pcB = pcB.(*net.UDPConn)
	return f
}

// startB starts B on A's socket (wrapped by wrap, if set), beforeRun
// called before its Run.
func (f *handOverFixture) startB(t *testing.T, wrap func(net.PacketConn) net.PacketConn, beforeRun func(*server.Server)) *testutil.Server {
	t.Helper()
	return testutil.StartServer(t, testutil.ServerOptions{StateDir: f.a.StateDir, Allow: []string{"tcp:" + f.echo}, PacketConn: f.pcB,
		WrapConn: wrap, Mutate: func(c *server.Config) { c.Resume, c.Usage = f.sideB.egress(time.Minute), f.ledgerB },
		BeforeRun: beforeRun})
}

// check stops A (as the old process exits) and checks that every tunnel
// went on through B (SHA-256 both ways, resumed, nothing given up or left
// held) and B's accounting: every byte each way once, in its state file.
func (f *handOverFixture) check(t *testing.T) {
	t.Helper()
	assert.Zero(t, f.sideA.table.Len(), "A let go of every tunnel")
	f.a.Stop(t) // as the old process exits (after the new one imported): its Run has returned, its ledger saved nothing more

	f.load.waitMoving(t, "the tunnels move on through B")
	f.load.check(t)
	assert.Equal(t, float64(f.tunnels), promtest.ToFloat64(f.sideB.metrics.Resumed), "B continued each tunnel")
	assert.Equal(t, float64(f.tunnels), promtest.ToFloat64(f.cliSide.metrics.Resumed))
	for side, m := range map[string]*resumeSide{"client": f.cliSide, "server B": f.sideB} {
		assert.Equal(t, float64(f.tunnels), promtest.ToFloat64(m.metrics.ResumedEarly),
			"%s: each resume request went as 0-RTT data, without waiting for the new connection's handshake", side)
	}
	for _, r := range resume.GaveUpReasons() {
		assert.Zero(t, promtest.ToFloat64(f.cliSide.metrics.GaveUp.WithLabelValues(r)), r)
	}
	require.Eventually(t, func() bool { return f.sideB.table.Len() == 0 && f.cliSide.table.Len() == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return f.sideA.budget.Used() == 0 && f.sideB.budget.Used() == 0 }, 10*time.Second, 10*time.Millisecond,
		"every buffer given back")
	moved := f.ended
	for _, e := range f.load.es {
		moved += e.n
	}
	var up, down int64
	require.Eventually(t, func() bool {
		up, down = 0, 0
		for _, u := range f.ledgerB.Snapshot() {
			up, down = up+u.BytesUpstream, down+u.BytesDownstream
		}
		return up == moved && down == moved
	}, 10*time.Second, 10*time.Millisecond, "B's accounting: every byte each way once")
	t.Logf("accounted %d bytes each way (moved %d)", up, moved)
	require.NoError(t, f.ledgerB.Save())
	again, err := usage.New(usage.Config{Path: f.usagePath})
	require.NoError(t, err)
	up, down = 0, 0
	for _, u := range again.Snapshot() {
		up, down = up+u.BytesUpstream, down+u.BytesDownstream
	}
	assert.Equal(t, [2]int64{moved, moved}, [2]int64{up, down}, "the state file B wrote, which A's exit did not overwrite")
}

// echoLoad is tunnels moving data through an echo (echoRounds), for a
// handover in one process.
type echoLoad struct {
	es   []*echoRounds
	stop chan struct{}
	wg   sync.WaitGroup
}

// startEchoLoad opens n tunnels through addr (a client's listener in front
// of an echo) and waits until each moved 10 rounds.
func startEchoLoad(t *testing.T, addr string, n int) *echoLoad {
	t.Helper()
	l := &echoLoad{es: make([]*echoRounds, n), stop: make(chan struct{})}
	for i := range l.es {
		l.es[i] = &echoRounds{}
		c := dial(t, addr)
		l.wg.Go(func() { l.es[i].run(c, l.stop) })
	}
	t.Cleanup(l.end)
	l.waitMoving(t, "every tunnel moving data")
	return l
}

func (l *echoLoad) end() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// waitMoving waits until each tunnel moved 10 more rounds.
func (l *echoLoad) waitMoving(t *testing.T, what string) {
	t.Helper()
	from := make([]int64, len(l.es))
	for i, e := range l.es {
		from[i] = e.rounds.Load()
	}
	require.Eventually(t, func() bool {
		for i, e := range l.es {
			if e.rounds.Load() < from[i]+10 {
				return false
			}
		}
		return true
	}, 30*time.Second, time.Millisecond, what)
}

// check stops the load and checks each tunnel: no error, every byte
// echoed once and in order (SHA-256 of both directions).
func (l *echoLoad) check(t *testing.T) {
	t.Helper()
	l.end()
	for i, e := range l.es {
		require.NoError(t, e.err, "tunnel %d", i)
		assert.Equal(t, e.sent, e.recvd, "tunnel %d: every byte echoed once and in order", i)
	}
}

// handoverPair returns both ends of a handover socket pair.
func handoverPair(t *testing.T) (parent, child *handover.Conn) {
	t.Helper()
	return testutil.HandoverPair(t)
}
