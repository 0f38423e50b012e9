package loadgen

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/transport"
)

// emu is one emulated client: the real client library on its own UDP
// socket, bound to its own address of 127.0.0.0/8, so the server's
// per-source limits see one client per source as in reality. Its TLS
// session cache outlives each run of the client (a restarted client keeps
// its tickets only with --session-file; the cache here stands for that
// file), so a reconnect resumes with 0-RTT.
type emu struct {
	idx   int
	ip    net.IP
	cache tls.ClientSessionCache
	// fwd is the address of the client's forward to the echo server (tunnel
	// clients only), a new listener at each start.
	fwd string

	c      *client.Client
	m      *metrics.Client
	pc     *net.UDPConn
	cancel context.CancelFunc
	done   chan struct{}
}

// fleet is every emulated client and what they share.
type fleet struct {
	o       Options
	srv     *server
	echo    string
	clients []*emu
	logger  klog.Logger
}

// clientIP is the source address of client i: 127.0.0.2 upwards, skipping
// the .0 and .255 of each /24 (the k-th address whose last byte is 1-254,
// counting 127.0.0.1 as k=0), at most 127.255.255.254 (maxClients).
func clientIP(i int) net.IP {
	k := uint32(i) + 1
	v := (k/254)<<8 | (k%254 + 1)
	ip := make(net.IP, 4)
	binary.BigEndian.PutUint32(ip, 127<<24|v)
	return ip
}

// maxClients is how many clients 127.0.0.2-127.255.255.254 holds.
const maxClients = 65536*254 - 1

func newFleet(o Options, srv *server, echo string) *fleet {
	f := &fleet{o: o, srv: srv, echo: echo, logger: klog.Background()}
	f.clients = make([]*emu, o.Clients)
	for i := range f.clients {
		// Each client counts its own dials, across its runs (not registered:
		// no registry holds N copies).
		f.clients[i] = &emu{idx: i, ip: clientIP(i), cache: transport.NewStickySessionCache(4), m: client.NewMetrics(nopRegisterer{})}
	}
	return f
}

// start creates client e (its socket, its forward when it is a tunnel
// client) and runs it until stop.
func (f *fleet) start(ctx context.Context, e *emu) error {
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: e.ip})
	if err != nil {
		return fmt.Errorf("client %d: listen on %s: %w", e.idx, e.ip, err)
	}
	fp, err := transport.ParseFingerprint(f.srv.fp)
	if err != nil {
		_ = pc.Close()
		return err
	}
	host, _, _ := net.SplitHostPort(f.srv.udp)
	tlsConf, err := transport.ClientTLSConfig(transport.ClientTLSOptions{ServerName: host,
		Fingerprints: [][32]byte{fp}, SessionCache: e.cache})
	if err != nil {
		_ = pc.Close()
		return err
	}
	q := transport.DefaultQUICOptions()
	if f.o.KeepAlive > 0 {
		q.KeepAlivePeriod = f.o.KeepAlive
	}
	cfg := client.DefaultConfig()
	// No route watch: it holds a netlink socket per connection, which a real
	// client (one per host) affords, but thousands in one process sharing one
	// routing table would only measure the load generator (and, with their
	// UDP sockets, pass this machine's 20,000 file descriptors at 10,000).
	cfg.RouteWatch = false
	cfg.ServerAddr = f.srv.udp
	cfg.TLS = tlsConf
	cfg.QUIC = transport.QUICConfig(q)
	cfg.Secret = f.srv.secret
	cfg.Metrics = e.m
	if e.idx < f.o.Tunnels {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			_ = pc.Close()
			return fmt.Errorf("client %d: forward listener: %w", e.idx, err)
		}
		e.fwd = ln.Addr().String()
		ts, err := token.NewSource(token.PluginFixed, "tcp:"+f.echo, nil)
		if err != nil {
			_ = ln.Close()
			_ = pc.Close()
			return err
		}
		cfg.Forwards = []client.Forward{{Listener: ln, Tokens: ts}}
	}
	c, err := client.New(cfg, pc)
	if err != nil {
		_ = pc.Close()
		return err
	}
	// The clients' own logs would be N copies of each line: discarded, their
	// outcome is read from their metrics.
	cctx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), logr.Discard()))
	e.c, e.pc, e.cancel, e.done = c, pc, cancel, make(chan struct{})
	go func() {
		defer close(e.done)
		_ = c.Run(cctx)
	}()
	return nil
}

// stop ends client e (it closes its connection with shutdown) and waits
// for it to be gone.
func (e *emu) stop() {
	if e.cancel == nil {
		return
	}
	e.cancel()
	<-e.done
	_ = e.pc.Close()
	e.c, e.cancel = nil, nil
}

// dials is how many connections client e has completed (ok and ok_0rtt).
func (e *emu) dials() (full, zeroRTT float64) {
	return counter(e.m.DialsTotal.WithLabelValues("ok")), counter(e.m.DialsTotal.WithLabelValues("ok_0rtt"))
}

// rescues sums the clients' path rescues by result, leaving out zeros.
func (f *fleet) rescues() map[string]float64 {
	return f.sumByResult(func(e *emu) *prometheus.CounterVec { return e.m.PathRescuesTotal }, "switched", "recovered", "error")
}

// tcpDials sums the clients' TCP fallback connections by result, leaving
// out zeros.
func (f *fleet) tcpDials() map[string]float64 {
	return f.sumByResult(func(e *emu) *prometheus.CounterVec { return e.m.TCPDialsTotal }, "ok", "error")
}

// sumByResult sums, over the clients, the counter vec picks of each
// result, leaving out zeros.
func (f *fleet) sumByResult(vec func(*emu) *prometheus.CounterVec, results ...string) map[string]float64 {
	out := map[string]float64{}
	for _, e := range f.clients {
		for _, res := range results {
			if n := counter(vec(e).WithLabelValues(res)); n > 0 {
				out[res] += n
			}
		}
	}
	return out
}

// counter reads a counter's value.
func counter(c prometheus.Counter) float64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		return 0
	}
	return d.GetCounter().GetValue()
}

// since is now - before per key, leaving out zeros.
func since(now, before map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range now {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// connectAll starts every client that is not running, at most concurrency
// at a time, each slot freed when its client is ready (handshake done and
// hello accepted); it returns when all are ready, or fails at limit, with
// the time each client took from its start until ready.
func (f *fleet) connectAll(ctx context.Context, limit time.Duration) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	sem := make(chan struct{}, max(1, f.o.Concurrency))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	var lat []time.Duration
	for _, e := range f.clients {
		if e.cancel != nil {
			continue // running
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		if err := f.start(ctx, e); err != nil {
			<-sem
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			err := waitReady(ctx, e)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else {
				lat = append(lat, time.Since(t0))
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return lat, err
	}
	if ctx.Err() != nil {
		return lat, fmt.Errorf("clients not all connected within %v: %w", limit, ctx.Err())
	}
	return lat, nil
}

// waitReady polls until client e is ready (the client has no event for
// it; every 5 ms adds at most that to a handshake that takes a few ms here,
// and costs the load generator little at the concurrency in flight).
func waitReady(ctx context.Context, e *emu) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !e.c.Ready() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("client %d (%s) not ready: %w", e.idx, e.ip, ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// stopAll stops every client, concurrency at a time.
func (f *fleet) stopAll() {
	sem := make(chan struct{}, max(1, f.o.Concurrency))
	var wg sync.WaitGroup
	for _, e := range f.clients {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			e.stop()
		})
	}
	wg.Wait()
}

// nopRegisterer registers nothing: each emulated client gets metrics of
// its own, read directly, with no registry to hold N copies.
type nopRegisterer struct{}

func (nopRegisterer) Register(prometheus.Collector) error  { return nil }
func (nopRegisterer) MustRegister(...prometheus.Collector) {}
func (nopRegisterer) Unregister(prometheus.Collector) bool { return true }
