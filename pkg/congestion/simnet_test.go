package congestion_test

import (
	"context"
	mrand "math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"
	qc "github.com/quic-go/quic-go/congestion"
	"github.com/quic-go/quic-go/testutils/simnet"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/congestion"
	"github.com/quictun/quictun/pkg/transport"
)

// link is one direction of an emulated bottleneck: a FIFO drained at rate
// bytes/s with a tail-drop queue of queueBytes, a one-way delay and random
// loss (seeded, so a run is deterministic inside a synctest bubble).
type link struct {
	rate       float64
	delay      time.Duration
	loss       float64
	queueBytes int
	rng        *mrand.Rand

	mu       sync.Mutex
	nextFree time.Time
	items    chan delivery
	lost     int
	dropped  int
}

type delivery struct {
	at time.Time
	p  simnet.Packet
}

// net routes packets between two SimConns through one link per direction.
type emuNet struct {
	nodes map[string]simnet.PacketReceiver
	links map[string]*link // by source address
	mu    sync.Mutex
	done  chan struct{}
	wg    sync.WaitGroup
}

func (n *emuNet) AddNode(addr net.Addr, r simnet.PacketReceiver) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes[addr.String()] = r
}

func (n *emuNet) SendPacket(p simnet.Packet) error {
	l := n.links[p.From.String()]
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rng.Float64() < l.loss {
		l.lost++
		return nil
	}
	now := time.Now()
	start := now
	if l.nextFree.After(now) {
		start = l.nextFree
		if backlog := int(l.nextFree.Sub(now).Seconds() * l.rate); backlog+len(p.Data) > l.queueBytes {
			l.dropped++
			return nil
		}
	}
	l.nextFree = start.Add(time.Duration(float64(len(p.Data)) / l.rate * float64(time.Second)))
	select {
	case l.items <- delivery{at: l.nextFree.Add(l.delay), p: p}:
	default:
		l.dropped++
	}
	return nil
}

func (n *emuNet) run(l *link) {
	defer n.wg.Done()
	for {
		select {
		case d := <-l.items:
			if w := time.Until(d.at); w > 0 {
				select {
				case <-time.After(w):
				case <-n.done:
					return
				}
			}
			n.mu.Lock()
			r := n.nodes[d.p.To.String()]
			n.mu.Unlock()
			if r != nil {
				r.RecvPacket(d.p)
			}
		case <-n.done:
			return
		}
	}
}

type linkSpec struct {
	rateBitsPerSecond float64
	oneWay            time.Duration
	loss              float64
	queuePackets      int
}

// newEmuNet returns pairs of client and server packet conns whose traffic
// shares one bottleneck link per direction (servers to clients, clients to
// servers).
func newEmuNet(t *testing.T, s linkSpec, pairs int) (clients, servers []*simnet.SimConn, stop func()) {
	n := &emuNet{nodes: map[string]simnet.PacketReceiver{}, links: map[string]*link{}, done: make(chan struct{})}
	seed := uint64(1)
	if v, err := strconv.ParseUint(os.Getenv("QUICTUN_SIM_SEED"), 10, 64); err == nil {
		seed = v // experiments: another draw of the same link
	}
	up, down := n.newLink(s, 2*seed-1), n.newLink(s, 2*seed)
	for i := range pairs {
		ca := &net.UDPAddr{IP: net.IPv4(10, 0, 1, byte(i+1)), Port: 4001}
		sa := &net.UDPAddr{IP: net.IPv4(10, 0, 2, byte(i+1)), Port: 4002}
		n.links[ca.String()], n.links[sa.String()] = up, down
		clients = append(clients, simnet.NewBlockingSimConn(ca, n))
		servers = append(servers, simnet.NewBlockingSimConn(sa, n))
	}
	return clients, servers, func() {
		for i := range clients {
			_ = clients[i].Close()
			_ = servers[i].Close()
		}
		close(n.done)
		n.wg.Wait()
	}
}

func (n *emuNet) newLink(s linkSpec, seed uint64) *link {
	l := &link{
		rate: s.rateBitsPerSecond / 8, delay: s.oneWay, loss: s.loss,
		queueBytes: s.queuePackets * 1500, rng: mrand.New(mrand.NewPCG(seed, 42)),
		items: make(chan delivery, 1<<16),
	}
	n.wg.Add(1)
	go n.run(l)
	return l
}

// download runs a download over conns with the server's controller alg
// until ctx ends and reports how many bytes arrived after warmup.
func download(ctx context.Context, t *testing.T, cconn, sconn *simnet.SimConn, alg congestion.Algorithm, warmup time.Duration, got *int64) error {
	return downloadWith(ctx, t, cconn, sconn, congestion.Factory(alg, congestion.Options{}), warmup, got)
}

// productConfig is the QUIC configuration a daemon runs with (windows,
// probe-timeout cap, datagrams; the client's windows full from the start),
// with its controller made by f.
func productConfig(f qc.NewController, client bool) *quic.Config {
	o := transport.DefaultQUICOptions()
	o.FullReceiveWindows = client
	c := transport.QUICConfig(o)
	c.Congestion = f
	return c
}

// serverConnHook, when set, sees the server's connection (TestHeavyLossTrace).
var serverConnHook func(*quic.Conn)

// downloadWith is download with the server's controller made by f, both
// ends configured as the daemons are.
func downloadWith(ctx context.Context, t *testing.T, cconn, sconn *simnet.SimConn, f qc.NewController, warmup time.Duration, got *int64) error {
	stlsc, ctlsc := testutil.SelfSignedTLS(t, "simnet")
	ln, err := (&quic.Transport{Conn: sconn}).Listen(stlsc, productConfig(f, false))
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		if serverConnHook != nil {
			serverConnHook(c)
		}
		str, err := c.AcceptStream(ctx)
		if err != nil {
			return
		}
		buf := make([]byte, 64<<10)
		for {
			if _, err := str.Write(buf); err != nil {
				return
			}
		}
	}()
	ctr := &quic.Transport{Conn: cconn}
	defer ctr.Close()
	c, err := ctr.Dial(ctx, sconn.LocalAddr(), ctlsc, productConfig(congestion.Factory(congestion.Default, congestion.Options{}), true))
	if err != nil {
		return err
	}
	defer c.CloseWithError(0, "")
	str, err := c.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	if _, err := str.Write([]byte{1}); err != nil {
		return err
	}
	start := time.Now()
	buf := make([]byte, 64<<10)
	for {
		n, err := str.Read(buf)
		if time.Since(start) > warmup {
			atomic.AddInt64(got, int64(n))
		}
		if err != nil {
			return nil // ctx ended: the connection was closed
		}
		if ctx.Err() != nil {
			str.CancelRead(0)
			return nil
		}
	}
}

// Two downloads share the bottleneck: bbr against cubic (our own, the
// stand-in for a TCP Cubic flow here), on a queue of 1.2 and of 2 BDP (30
// and 50 ms at 100 Mbit/s). Cubic keeps at least a quarter of the link on
// each (the target beside kernel Cubic), and bbr at least a fifth;
// over the queues Cubic averages at least 42 %. Before bbr regrew its cap as
// Reno does after congestion, Cubic averaged 31.5-36.3 % here (two runs: the
// simulator's goroutines make runs differ); after, 48-57 % over four seeds
// (QUICTUN_SIM_SEED), 51 % on the one queue run under the race detector.
func TestFairnessBBRAgainstCubicSimnet(t *testing.T) {
	if testing.Short() {
		t.Skip("moves tens of MB through quic-go")
	}
	const rate = 100e6
	dur, warmup := 30*time.Second, 10*time.Second
	queues := []int{256, 417}
	if raceEnabled {
		dur, warmup, queues = 12*time.Second, 4*time.Second, queues[:1]
	}
	var cubicSum float64
	for _, queue := range queues {
		spec := linkSpec{rateBitsPerSecond: rate, oneWay: 12500 * time.Microsecond, queuePackets: queue}
		synctest.Test(t, func(t *testing.T) {
			cconns, sconns, stop := newEmuNet(t, spec, 2)
			defer stop()
			ctx, cancel := context.WithTimeout(context.Background(), dur)
			defer cancel()
			var got [2]int64
			var wg sync.WaitGroup
			for i, alg := range []congestion.Algorithm{congestion.BBR, congestion.Cubic} {
				wg.Go(func() { require.NoError(t, download(ctx, t, cconns[i], sconns[i], alg, warmup, &got[i])) })
			}
			wg.Wait()
			secs := (dur - warmup).Seconds()
			bbr, cubic := float64(got[0]*8)/secs, float64(got[1]*8)/secs
			t.Logf("queue %d packets: bbr %.1f Mbit/s, cubic %.1f Mbit/s (link 100)", queue, bbr/1e6, cubic/1e6)
			require.Greater(t, bbr, 0.2*rate, "bbr's share")
			require.Greater(t, cubic, 0.25*rate, "cubic's share")
			cubicSum += cubic
		})
	}
	floor := 0.42
	if raceEnabled {
		floor = 0.33 // one 12 s run on one queue: 41.8-51 % seen; the 30 s runs on both queues decide
	}
	require.Greater(t, cubicSum/float64(len(queues)), floor*rate, "cubic's mean share over the queues")
}
