package integration

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"path/filepath"
	"strconv"
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
// over from where A stopped: TrackFrom).
//
// The client reaches the servers through a proxy adding 50 ms round trips:
// its resume requests go as 0-RTT data on its new connection to B
// (resumed_0rtt counted on both ends), not a round trip later.
//
// It found a BBR bug (pkg/congestion, TestBBRFirstPacketsSentWithOthersInFlight):
// the client's new 0-RTT connection, re-attaching every tunnel at once after
// its handshake, paced itself to a halt (14 runs in 50 stalled until the
// idle timeout).
func TestServerHandOver(t *testing.T) { // not parallel: it sets the environment (handoverPair)
	const tunnels = 5
	echo := testutil.EchoServer(t)
	sideA, sideB := newResumeSide(server.NewResumeMetrics), newResumeSide(server.NewResumeMetrics)
	cliSide := newResumeSide(client.NewResumeMetrics)
	usagePath := filepath.Join(t.TempDir(), "usage.json")
	ledgerA, err := usage.New(usage.Config{Path: usagePath})
	require.NoError(t, err)
	ledgerB, err := usage.New(usage.Config{Path: usagePath, Deferred: true}) // as a process started by an upgrade
	require.NoError(t, err)
	a := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo},
		Mutate: func(c *server.Config) { c.Resume, c.Usage = sideA.egress(time.Minute), ledgerA }})
	// 50 ms round trips: the re-attachments go on the new connection long
	// before its handshake completes.
	var never atomic.Bool
	proxy := lossyProxy(t, a, 25*time.Millisecond, &never, nil)
	cl := testutil.StartClient(t, a, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true, ServerAddr: proxy,
		Mutate: func(c *client.Config) { c.Resume = cliSide.ingress(time.Minute) }})

	const ended = 1 << 20 // a tunnel that ends on A before the upgrade
	done0 := dial(t, cl.Addr)
	echoCheck(t, done0, ended)
	_ = done0.Close()
	require.Eventually(t, func() bool { return sideA.table.Len() == 0 }, 10*time.Second, time.Millisecond)
	load := startEchoLoad(t, cl.Addr, tunnels)
	require.Eventually(t, func() bool { return sideA.table.Len() == tunnels }, 10*time.Second, time.Millisecond)

	// The two ends of the handover socket, in one process: what A sends
	// arrives as B would receive it in its own process.
	parent, child := handoverPair(t)
	udpFile, err := a.PacketConn().(*net.UDPConn).File()
	require.NoError(t, err)
	require.NoError(t, parent.SendListeners([]handover.Listener{{Name: "udp", File: udpFile}}))
	require.NoError(t, udpFile.Close())
	ls, err := child.RecvListeners()
	require.NoError(t, err)
	require.Len(t, ls, 1)
	pcB, err := net.FilePacketConn(ls[0].File)
	require.NoError(t, err)
	require.NoError(t, ls[0].File.Close())
	done := make(chan error, 1)
	imported := make(chan struct{}) // A waits for B's answer, as for the new process's (WaitDone)
	go func() {
		done <- a.HandOver(context.Background(), func(ts []handover.Tunnel) error {
			if err := parent.SendTunnels(ts); err != nil {
				return err
			}
			<-imported
			return nil
		})
	}()
	ts, err := child.RecvTunnels(handover.Limits{MaxTunnels: 100, MaxTunnelBytes: 8 << 20, MaxTotalBytes: 64 << 20})
	require.NoError(t, err)
	require.Len(t, ts, tunnels)
	var n int
	var ierr error
	testutil.StartServer(t, testutil.ServerOptions{StateDir: a.StateDir, Allow: []string{"tcp:" + echo}, PacketConn: pcB.(*net.UDPConn),
		Mutate:    func(c *server.Config) { c.Resume, c.Usage = sideB.egress(time.Minute), ledgerB },
		BeforeRun: func(s *server.Server) { n, ierr = s.Import(context.Background(), ts) }})
	require.NoError(t, ierr)
	assert.Equal(t, tunnels, n)
	close(imported)
	require.NoError(t, <-done)
	assert.Zero(t, sideA.table.Len(), "A let go of every tunnel")
	a.Stop(t) // as the old process exits (after the new one imported): its Run has returned, its ledger saved nothing more

	load.waitMoving(t, "the tunnels move on through B")
	load.check(t)
	assert.Equal(t, float64(tunnels), promtest.ToFloat64(sideB.metrics.Resumed), "B continued each tunnel")
	assert.Equal(t, float64(tunnels), promtest.ToFloat64(cliSide.metrics.Resumed))
	for side, m := range map[string]*resumeSide{"client": cliSide, "server B": sideB} {
		assert.Equal(t, float64(tunnels), promtest.ToFloat64(m.metrics.ResumedEarly),
			"%s: each resume request went as 0-RTT data, without waiting for the new connection's handshake", side)
	}
	for _, r := range resume.GaveUpReasons() {
		assert.Zero(t, promtest.ToFloat64(cliSide.metrics.GaveUp.WithLabelValues(r)), r)
	}
	require.Eventually(t, func() bool { return sideB.table.Len() == 0 && cliSide.table.Len() == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return sideA.budget.Used() == 0 && sideB.budget.Used() == 0 }, 10*time.Second, 10*time.Millisecond,
		"every buffer given back")
	moved := int64(ended)
	for _, e := range load.es {
		moved += e.n
	}
	var up, down int64
	require.Eventually(t, func() bool {
		up, down = 0, 0
		for _, u := range ledgerB.Snapshot() {
			up, down = up+u.BytesUpstream, down+u.BytesDownstream
		}
		return up == moved && down == moved
	}, 10*time.Second, 10*time.Millisecond, "B's accounting: every byte each way once")
	t.Logf("accounted %d bytes each way (moved %d)", up, moved)
	require.NoError(t, ledgerB.Save())
	again, err := usage.New(usage.Config{Path: usagePath})
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
	parent, cf, err := handover.Pair()
	require.NoError(t, err)
	t.Cleanup(func() { _ = parent.Close() })
	// As the child inherits it: a descriptor of its own, named in the
	// environment (cf's own is closed: one owner per descriptor).
	fd, err := syscall.Dup(int(cf.Fd()))
	require.NoError(t, err)
	require.NoError(t, cf.Close())
	t.Setenv(handover.EnvFD, strconv.Itoa(fd))
	child, err = handover.FromEnv()
	require.NoError(t, err)
	t.Cleanup(func() { _ = child.Close() })
	return parent, child
}
