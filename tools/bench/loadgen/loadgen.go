package loadgen

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/procstat"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/tools/bench/harness"
)

// Restart signals.
const (
	SignalTerm = "term" // SIGTERM: the server drains and closes every connection
	SignalKill = "kill" // SIGKILL: the connections vanish; clients learn it from the next server's stateless reset
)

// Options configure Run.
type Options struct {
	// BinDir holds quictun-server.
	BinDir string
	// ResultsDir: the run writes <ResultsDir>/loadgen-<UTC date>/.
	ResultsDir string
	// Clients is N, the emulated clients; Concurrency bounds the handshakes
	// in flight while they connect (phase 1, and the resume phase).
	Clients, Concurrency int
	// Idle is how long the connected clients stay idle while the server's
	// CPU is measured (phase 2); it should span a keep-alive period.
	Idle time.Duration
	// Tunnels is M, the clients that open a tunnel to the echo server and
	// exchange TunnelBytes (phase 3).
	Tunnels, TunnelBytes int
	// Restarts are the server restarts of phase 4, in order (SignalTerm,
	// SignalKill).
	Restarts []string
	// Resume disconnects every client and connects them again with their
	// session tickets, at Concurrency, for 0-RTT handshakes/s.
	Resume bool
	// Quiet is how long the clients are left alone before the idle
	// measurement: a new connection sends heartbeats until it has had no
	// work for the client's IdleAfter (5 s).
	Quiet time.Duration
	// KeepAlive is the clients' QUIC keep-alive period (0: the client's
	// default, 25 s): an idle client learns of a SIGKILLed server no earlier.
	KeepAlive time.Duration
	// PhaseTimeout bounds each phase that waits for the clients (connect,
	// each restart, leave); Timeout bounds the whole run.
	PhaseTimeout, Timeout time.Duration
	// ServerArgs are extra quictun-server flags; ServerEnv extra environment
	// (nothing else is added: the server runs with this process's environment).
	ServerArgs, ServerEnv []string
	// Command is the command line, for the report.
	Command string
	// GCWait bounds the wait, once every client left, for the server's next
	// garbage collection of its own (Go forces one every 2 minutes), so the
	// memory left over is read without garbage; 0: the load generator asks
	// the server for two collections at once (its pprof handler).
	GCWait time.Duration
	// LeaveWait, when set, reads the server's memory once more this long
	// after every client left (with two collections the load generator asks
	// for), past the replay cache's window and with time for Go's scavenger
	// to return free pages: what stays for good.
	LeaveWait time.Duration
	// Settle is how long the server is left alone before a baseline or
	// leave snapshot (0: 1 s).
	Settle time.Duration
	Now    func() time.Time
}

// DefaultOptions are the defaults of `bench loadgen`.
func DefaultOptions() Options {
	return Options{BinDir: "bin", ResultsDir: "bench/runs", Clients: 1000, Concurrency: 64, Idle: 30 * time.Second,
		Tunnels: 10, TunnelBytes: 1024, Restarts: []string{SignalTerm, SignalKill}, Resume: true,
		Quiet:        client.DefaultConfig().IdleAfter + time.Second,
		PhaseTimeout: 3 * time.Minute, Timeout: 30 * time.Minute}
}

// Validate reports every problem of o at once.
func (o Options) Validate() error {
	var errs []error
	if o.Clients < 1 || o.Clients > maxClients {
		errs = append(errs, fmt.Errorf("--clients must be 1-%d", maxClients))
	}
	if o.Concurrency < 1 {
		errs = append(errs, errors.New("--concurrency must be at least 1"))
	}
	if o.Tunnels < 0 || o.Tunnels > o.Clients {
		errs = append(errs, errors.New("--tunnels must be 0-clients"))
	}
	if o.TunnelBytes < 1 {
		errs = append(errs, errors.New("--tunnel-bytes must be at least 1"))
	}
	for _, s := range o.Restarts {
		if s != SignalTerm && s != SignalKill {
			errs = append(errs, fmt.Errorf("--restarts: %q is neither %s nor %s", s, SignalTerm, SignalKill))
		}
	}
	if o.Idle < 0 || o.Quiet < 0 || o.GCWait < 0 || o.LeaveWait < 0 || o.KeepAlive < 0 || o.PhaseTimeout <= 0 || o.Timeout <= 0 {
		errs = append(errs, errors.New("--idle, --quiet and --keepalive must not be negative, --phase-timeout and --timeout positive"))
	}
	return errors.Join(errs...)
}

// run is one load generator run.
type run struct {
	o    Options
	res  *Results
	srv  *server
	fl   *fleet
	echo *echoServer
	// loadgenBase is this process before any client.
	loadgenBase *Loadgen
	// raw is the directory of the server logs and heap profiles.
	raw string
}

// Run runs the phases against a quictun-server from BinDir and writes
// results.json and report.md into <ResultsDir>/loadgen-<date>/ (also when a
// phase fails: what was measured until then). It returns the directory.
func Run(ctx context.Context, o Options) (dir string, err error) {
	if err := o.Validate(); err != nil {
		return "", err
	}
	fdNote, err := raiseNoFile(o.Clients, o.Tunnels)
	if err != nil {
		return "", err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Settle <= 0 {
		o.Settle = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	started := o.Now()
	dir = filepath.Join(o.ResultsDir, "loadgen-"+started.UTC().Format("2006-01-02T150405Z"))
	logDir := filepath.Join(dir, "raw")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return "", fmt.Errorf("create output dir: %w", err)
	}
	work, err := os.MkdirTemp("", "quictun-loadgen-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	r := &run{o: o, raw: logDir, res: &Results{Version: 1, Command: o.Command, Started: started.UTC(), Machine: harness.MachineInfo(),
		LoadBefore: loadavg(), Clients: o.Clients, Concurrency: o.Concurrency, TunnelClients: o.Tunnels,
		IdleSeconds: o.Idle.Seconds(), QuietSeconds: o.Quiet.Seconds(), ClientKeepAlive: cmp.Or(o.KeepAlive, transport.DefaultQUICOptions().KeepAlivePeriod).String()}}
	if fdNote != "" {
		r.res.Notes = append(r.res.Notes, fdNote)
	}
	defer func() {
		if r.fl != nil {
			r.fl.stopAll()
		}
		if r.srv != nil {
			r.srv.stop(5 * time.Second)
		}
		if r.echo != nil {
			r.echo.close()
		}
		r.res.LoadAfter = loadavg()
		r.res.Finished = o.Now().UTC()
		if err != nil {
			r.res.Errors = append(r.res.Errors, err.Error())
		}
		err = errors.Join(err, r.res.save(dir))
	}()
	if r.echo, err = startEcho(); err != nil {
		return dir, err
	}
	if r.srv, err = newServer(ctx, o, work, logDir, r.echo.addr()); err != nil {
		return dir, err
	}
	r.res.ServerCommand = r.srv.commandLine()
	if out, verr := exec.CommandContext(ctx, r.srv.bin, "version").Output(); verr == nil {
		r.res.ServerVersion = strings.TrimSpace(string(out))
	}
	r.fl = newFleet(o, r.srv, r.echo.addr())
	if err := r.srv.start(ctx); err != nil {
		return dir, err
	}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"baseline", r.baseline},
		{"connect", r.connect},
		{"idle", r.idle},
		{"tunnels", r.tunnels},
		{"restarts", r.restarts},
		{"resume", r.resume},
		{"leave", r.leave},
	}
	for _, s := range steps {
		if ctx.Err() != nil {
			return dir, context.Cause(ctx)
		}
		klog.InfoS("Started phase", "phase", s.name, "clients", o.Clients)
		if err := s.fn(ctx); err != nil {
			return dir, fmt.Errorf("phase %s: %w", s.name, err)
		}
		_ = r.res.save(dir)
	}
	return dir, nil
}

// snapshot reads the server's memory, goroutines and connections.
func (r *run) snapshot(ctx context.Context) (Snapshot, error) {
	m, err := r.srv.scrape(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	return Snapshot{RSSBytes: r.srv.rss(), Goroutines: m["go_goroutines"], HeapInuseBytes: m["go_memstats_heap_inuse_bytes"],
		ActiveConnections: m["quictun_server_active_connections"], ReplayCacheEntries: m["quictun_server_replay_cache_entries"]}, nil
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// baseline is the server's figures with no client (phase 0).
func (r *run) baseline(ctx context.Context) error {
	if err := sleep(ctx, r.o.Settle); err != nil {
		return err
	}
	// The server's own idle cost (Go's system monitor, timers), to take
	// out of the cost per idle client.
	w := max(r.o.Settle, min(10*time.Second, r.o.Idle/3))
	cpu0, t0 := r.srv.cpu(), time.Now()
	if err := sleep(ctx, w); err != nil {
		return err
	}
	s, err := r.snapshot(ctx)
	s.CPUCores = (r.srv.cpu() - cpu0) / time.Since(t0).Seconds()
	if err == nil {
		err = r.live(ctx, &s, "heap-baseline.pb.gz")
	}
	r.res.Baseline = s
	r.loadgenBase = loadgenFigures(1, nil)
	return err
}

// connect brings every client up (phase 1): full handshakes and hellos.
func (r *run) connect(ctx context.Context) error {
	c, err := r.connectPhase(ctx)
	r.res.Connect = c
	if c != nil {
		c.ClientRescues = r.fl.rescues()
	}
	if err != nil {
		return err
	}
	if c.ZeroRTT > 0 {
		// A client whose first connection was lost while the others
		// connected (a busy machine: its hello or echoes too late)
		// reconnected with the ticket that connection gave it.
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("connect: %d clients lost their first connection and reconnected with 0-RTT during the phase", c.ZeroRTT))
	}
	r.res.Loadgen = loadgenFigures(r.o.Clients, r.loadgenBase)
	return nil
}

// connectPhase starts every client at Concurrency and measures the rate.
func (r *run) connectPhase(ctx context.Context) (*Connect, error) {
	before := r.dialCounts()
	cpu0, gen0, t0 := r.srv.cpu(), selfCPU(), time.Now()
	lat, err := r.fl.connectAll(ctx, r.o.PhaseTimeout)
	d := time.Since(t0)
	c := &Connect{Seconds: d.Seconds(), Handshakes: Handshakes{ServerCPUSeconds: r.srv.cpu() - cpu0, LoadgenCPUSeconds: selfCPU() - gen0}}
	if len(lat) > 0 {
		slices.Sort(lat)
		c.P50Millis, c.P99Millis, c.MaxMillis = ms(lat[len(lat)/2]), ms(lat[len(lat)*99/100]), ms(lat[len(lat)-1])
	}
	after := r.dialCounts()
	c.Full, c.ZeroRTT = int(after.full-before.full), int(after.zeroRTT-before.zeroRTT)
	c.Rejected0RTT, c.DialErrors = int(after.rejected-before.rejected), int(after.errors-before.errors)
	n := float64(c.Full + c.ZeroRTT)
	c.PerSecond = n / d.Seconds()
	if c.ServerCPUSeconds > 0 {
		c.PerServerCPUSecond = n / c.ServerCPUSeconds
	}
	if m, serr := r.srv.scrape(ctx); serr == nil {
		c.ServerRefused = labelled(m, "quictun_server_refused_connections_total")
		c.ServerPreauthRejections = labelled(m, "quictun_server_preauth_rejections_total")
	}
	return c, err
}

// idle measures the server while every client sits idle (phase 2).
func (r *run) idle(ctx context.Context) error {
	if err := sleep(ctx, r.o.Quiet); err != nil {
		return err
	}
	cpu0, gen0, busy0, t0 := r.srv.cpu(), selfCPU(), machineBusy(), time.Now()
	if err := sleep(ctx, r.o.Idle); err != nil {
		return err
	}
	d := time.Since(t0).Seconds()
	cpu, gen, busy := r.srv.cpu()-cpu0, selfCPU()-gen0, machineBusy()-busy0
	s, err := r.snapshot(ctx)
	if err != nil {
		return err
	}
	n := float64(r.o.Clients)
	b := r.res.Baseline
	r.res.Idle = &Idle{Seconds: d, Snapshot: s, ServerCPUSeconds: cpu, ServerCores: cpu / d,
		ServerCPUPerClientMicrosPerSecond: max(0, cpu/d-b.CPUCores) / n * 1e6, LoadgenCores: gen / d,
		OtherCores:          max(0, busy/d-cpu/d-gen/d),
		RSSPerClientBytes:   float64(s.RSSBytes-b.RSSBytes) / n,
		HeapPerClientBytes:  (s.HeapInuseBytes - b.HeapInuseBytes) / n,
		GoroutinesPerClient: (s.Goroutines - b.Goroutines) / n,
		ServerConnections:   s.ActiveConnections,
		ClientsReady:        r.readyCount(),
	}
	if err := r.live(ctx, &r.res.Idle.Snapshot, "heap-idle.pb.gz"); err != nil {
		return err
	}
	if b.LiveHeapBytes > 0 {
		r.res.Idle.LiveHeapPerClientBytes = (r.res.Idle.Snapshot.LiveHeapBytes - b.LiveHeapBytes) / n
		r.res.Idle.StackPerClientBytes = (r.res.Idle.Snapshot.StackInuseBytes - b.StackInuseBytes) / n
	}
	if int(s.ActiveConnections) != r.o.Clients {
		return fmt.Errorf("server counts %v connections, want %d", s.ActiveConnections, r.o.Clients)
	}
	return nil
}

// live has the server collect its garbage and records its live heap and
// stacks in s (after s's RSS was read: the collection does not lower RSS
// at once, but the next figures would no longer be the undisturbed ones).
func (r *run) live(ctx context.Context, s *Snapshot, profile string) error {
	m, err := r.collectTwice(ctx, profile)
	if err != nil {
		return err
	}
	s.LiveHeapBytes, s.StackInuseBytes = m["go_memstats_heap_alloc_bytes"], m["go_memstats_stack_inuse_bytes"]
	return nil
}

// readyCount is how many clients are ready.
func (r *run) readyCount() int {
	n := 0
	for _, e := range r.fl.clients {
		if e.c != nil && e.c.Ready() {
			n++
		}
	}
	return n
}

// tunnels has the first Tunnels clients each open a tunnel to the echo
// server through their forward and exchange TunnelBytes (phase 3).
func (r *run) tunnels(ctx context.Context) error {
	if r.o.Tunnels == 0 {
		return nil
	}
	t := &Tunnels{Tried: r.o.Tunnels}
	r.res.Tunnels = t
	durs := make([]time.Duration, r.o.Tunnels)
	errs := make([]error, r.o.Tunnels)
	sem := make(chan struct{}, max(1, r.o.Concurrency))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, e := range r.fl.clients[:r.o.Tunnels] {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s := time.Now()
			errs[i] = echoThrough(ctx, e.fwd, r.o.TunnelBytes)
			durs[i] = time.Since(s)
		})
	}
	wg.Wait()
	t.Seconds = time.Since(t0).Seconds()
	for i, err := range errs {
		if err == nil {
			t.OK++
		} else if len(t.FirstErrors) < 5 {
			t.FirstErrors = append(t.FirstErrors, fmt.Sprintf("client %d: %v", i, err))
		}
	}
	slices.Sort(durs)
	t.P50Millis = ms(durs[len(durs)/2])
	t.MaxMillis = ms(durs[len(durs)-1])
	if t.OK != t.Tried {
		return fmt.Errorf("%d of %d tunnels failed: %v", t.Tried-t.OK, t.Tried, t.FirstErrors)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// echoThrough connects to addr, writes n random bytes and reads them back.
func echoThrough(ctx context.Context, addr string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	out := make([]byte, n)
	_, _ = rand.Read(out)
	if _, err := c.Write(out); err != nil {
		return err
	}
	in := make([]byte, n)
	if _, err := io.ReadFull(c, in); err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	if string(in) != string(out) {
		return errors.New("echo differs")
	}
	return nil
}

// restarts restarts the server once per Restarts signal (phase 4).
func (r *run) restarts(ctx context.Context) error {
	for _, sig := range r.o.Restarts {
		rs, err := r.restart(ctx, sig)
		r.res.Restarts = append(r.res.Restarts, rs)
		if err != nil {
			return fmt.Errorf("%s: %w", sig, err)
		}
	}
	return nil
}

// restart stops the server with sig, starts it again on the same state
// directory and waits until every client has completed a new connection
// (to the new server) and is ready on it.
func (r *run) restart(ctx context.Context, sig string) (Restart, error) {
	rs := Restart{Signal: sig}
	// Idle clients, as in the idle phase: a client that still heartbeats
	// (its connection is new) learns of a SIGKILL at its next heartbeat, an
	// idle one only at its next keep-alive.
	if err := sleep(ctx, r.o.Quiet); err != nil {
		return rs, err
	}
	n := len(r.fl.clients)
	base := make([]float64, n)
	for i, e := range r.fl.clients {
		f, z := e.dials()
		base[i] = f + z
	}
	before := r.dialCounts()
	rescues0, tcp0 := r.fl.rescues(), r.fl.tcpDials()
	t0, rcv0 := time.Now(), udpRcvbufErrors()
	if sig == SignalKill {
		r.srv.proc.Kill()
		r.srv.proc = nil
	} else {
		r.srv.stop(time.Minute)
	}
	rs.ExitSeconds = time.Since(t0).Seconds()
	if err := r.srv.start(ctx); err != nil {
		return rs, err
	}
	rs.ServerUpSeconds = time.Since(t0).Seconds()
	cpu0, gen0 := r.srv.cpu(), selfCPU()
	backAt := make([]time.Duration, n)
	pending := make([]int, n)
	for i := range pending {
		pending[i] = i
	}
	deadline := time.Now().Add(r.o.PhaseTimeout)
	// A pass reads two counters of each ready client not back yet (~1 µs
	// each; after a SIGKILL every client still looks ready until it
	// notices): every 50 ms for up to 1000 clients, less often for more,
	// so the polling takes at most a few percent of a core.
	tick := time.NewTicker(max(50*time.Millisecond, time.Duration(n)*50*time.Microsecond))
	defer tick.Stop()
	for len(pending) > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return rs, context.Cause(ctx)
		case <-tick.C:
		}
		now := time.Since(t0)
		pending = slices.DeleteFunc(pending, func(i int) bool {
			e := r.fl.clients[i]
			if !e.c.Ready() {
				return false
			}
			if f, z := e.dials(); f+z > base[i] {
				backAt[i] = now
				return true
			}
			return false
		})
	}
	rs.ServerCPUSeconds, rs.LoadgenCPUSeconds = r.srv.cpu()-cpu0, selfCPU()-gen0
	rs.NotBack = len(pending)
	rs.UDPRcvbufErrors = udpRcvbufErrors() - rcv0
	rs.ClientRescues, rs.ClientTCPDials = since(r.fl.rescues(), rescues0), since(r.fl.tcpDials(), tcp0)
	after := r.dialCounts()
	rs.Full, rs.ZeroRTT = int(after.full-before.full), int(after.zeroRTT-before.zeroRTT)
	rs.Rejected0RTT, rs.DialErrors = int(after.rejected-before.rejected), int(after.errors-before.errors)
	var back []time.Duration
	for i, d := range backAt {
		if !slices.Contains(pending, i) {
			back = append(back, d)
		}
	}
	slices.Sort(back)
	if len(back) > 0 {
		q := func(p float64) float64 { return back[int(p*float64(len(back)-1))].Seconds() }
		rs.FirstBackSeconds, rs.P50BackSeconds, rs.P90BackSeconds, rs.AllBackSeconds = q(0), q(0.5), q(0.9), q(1)
		if spread := rs.AllBackSeconds - rs.FirstBackSeconds; spread > 0 {
			rs.PerSecond = float64(len(back)) / spread
		}
		if rs.ServerCPUSeconds > 0 {
			rs.PerServerCPUSecond = float64(rs.Full+rs.ZeroRTT) / rs.ServerCPUSeconds
		}
	}
	if m, err := r.srv.scrape(ctx); err == nil {
		rs.ServerRefused = labelled(m, "quictun_server_refused_connections_total")
		rs.ServerPreauthRejections = labelled(m, "quictun_server_preauth_rejections_total")
		rs.ServerConnections = m["quictun_server_active_connections"]
		rs.ServerDropped = labelled(m, "quictun_server_dropped_datagrams_total")
	}
	if rs.NotBack > 0 {
		return rs, fmt.Errorf("%d of %d clients not back within %v", rs.NotBack, n, r.o.PhaseTimeout)
	}
	return rs, nil
}

// resume disconnects every client and connects them all again with their
// session tickets at Concurrency: 0-RTT handshakes/s (phase 5).
func (r *run) resume(ctx context.Context) error {
	if !r.o.Resume {
		return nil
	}
	d, err := r.disconnect(ctx)
	r.res.ResumeStop = d
	if err != nil {
		return err
	}
	c, err := r.connectPhase(ctx)
	r.res.Resume = c
	return err
}

// disconnect stops every client and waits until the server counts no
// connection; it records how the server saw them end.
func (r *run) disconnect(ctx context.Context) (*Disconnect, error) {
	m0, err := r.srv.scrape(ctx)
	if err != nil {
		return nil, err
	}
	t0, rcv0 := time.Now(), udpRcvbufErrors()
	r.fl.stopAll()
	d := &Disconnect{StopSeconds: time.Since(t0).Seconds(), ClientRescues: r.fl.rescues()}
	empty, err := r.waitNoConnections(ctx)
	d.ServerEmptySeconds = empty.Seconds()
	d.UDPRcvbufErrors = udpRcvbufErrors() - rcv0
	if m1, serr := r.srv.scrape(ctx); serr == nil {
		d.ServerEnded = delta(m0, m1, "quictun_server_connections_total")
		d.ServerDropped = delta(m0, m1, "quictun_server_dropped_datagrams_total")
	}
	return d, err
}

// leave disconnects every client and checks that the server's goroutines
// and memory return to the baseline (phase 6).
func (r *run) leave(ctx context.Context) error {
	d, err := r.disconnect(ctx)
	l := &Leave{Disconnect: d}
	r.res.Leave = l
	if err != nil {
		return err
	}
	left := time.Now()
	// Goroutines end asynchronously after a connection is gone: give them
	// up to 10 s to come down to the baseline.
	b := r.res.Baseline
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := sleep(ctx, r.o.Settle); err != nil {
			return err
		}
		s, err := r.snapshot(ctx)
		if err != nil {
			return err
		}
		l.Snapshot = s
		if s.Goroutines <= b.Goroutines+leakTolerance || time.Now().After(deadline) {
			break
		}
	}
	l.GoroutinesOverBaseline = l.Snapshot.Goroutines - b.Goroutines
	if l.GoroutinesOverBaseline > leakTolerance {
		return fmt.Errorf("server has %v goroutines after every client left, %v over its baseline", l.Snapshot.Goroutines, l.GoroutinesOverBaseline)
	}
	// Heap in use counts garbage until a collection: an idle server
	// allocates little, so the next one is Go's forced collection, at most
	// 2 minutes away. Wait for a collection that began after the clients
	// left, up to GCWait, before reading the memory.
	if r.o.GCWait == 0 {
		// The server collects at once when asked (twice: sync.Pool's
		// contents survive the first).
		s, err := r.collected(ctx, "heap-after-leave.pb.gz")
		if err != nil {
			return err
		}
		l.GCAfterLeave = true
		l.Snapshot = s
		l.LiveHeapOverBaselineBytes = s.LiveHeapBytes - b.LiveHeapBytes
	} else {
		gcDeadline := left.Add(r.o.GCWait)
		for time.Now().Before(gcDeadline) {
			m, err := r.srv.scrape(ctx)
			if err == nil && m["go_memstats_last_gc_time_seconds"] > float64(left.UnixNano())/1e9 {
				l.GCAfterLeave = true
				break
			}
			if err := sleep(ctx, time.Second); err != nil {
				return err
			}
		}
		s, err := r.snapshot(ctx)
		if err != nil {
			return err
		}
		l.Snapshot = s
	}
	l.RSSOverBaselineBytes = l.Snapshot.RSSBytes - b.RSSBytes
	l.HeapOverBaselineBytes = l.Snapshot.HeapInuseBytes - b.HeapInuseBytes
	if r.o.LeaveWait <= 0 {
		return nil
	}
	if err := sleep(ctx, time.Until(left.Add(r.o.LeaveWait))); err != nil {
		return err
	}
	s, err := r.collected(ctx, "heap-later.pb.gz")
	if err != nil {
		return err
	}
	l.Later = &Later{Seconds: time.Since(left).Seconds(), Snapshot: s, GoroutinesOverBaseline: s.Goroutines - b.Goroutines,
		RSSOverBaselineBytes: s.RSSBytes - b.RSSBytes, LiveHeapOverBaselineBytes: s.LiveHeapBytes - b.LiveHeapBytes}
	return nil
}

// collectTwice has the server collect its garbage twice (sync.Pool's
// contents, quic-go's packet buffers and what a burst left, survive the
// first), saves its heap profile as raw/name, and returns its metrics.
func (r *run) collectTwice(ctx context.Context, name string) (metricSet, error) {
	if _, err := r.srv.collect(ctx, ""); err != nil {
		return nil, err
	}
	return r.srv.collect(ctx, filepath.Join(r.raw, name))
}

// collected is collectTwice, then a snapshot with the live heap and stacks.
func (r *run) collected(ctx context.Context, name string) (Snapshot, error) {
	m, err := r.collectTwice(ctx, name)
	if err != nil {
		return Snapshot{}, err
	}
	s, err := r.snapshot(ctx)
	s.LiveHeapBytes, s.StackInuseBytes = m["go_memstats_heap_alloc_bytes"], m["go_memstats_stack_inuse_bytes"]
	return s, err
}

// leakTolerance is how many goroutines over the baseline the server may
// keep after every client left (timers and pool workers that come and go).
const leakTolerance = 5

// waitNoConnections waits up to PhaseTimeout until the server counts no
// connection, and returns how long that took.
func (r *run) waitNoConnections(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	for {
		m, err := r.srv.scrape(ctx)
		if err == nil && m["quictun_server_active_connections"] == 0 {
			return time.Since(t0), nil
		}
		if time.Since(t0) > r.o.PhaseTimeout {
			return time.Since(t0), fmt.Errorf("server still counts %v connections %v after the clients left", m["quictun_server_active_connections"], r.o.PhaseTimeout)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return time.Since(t0), err
		}
	}
}

// dialTotals sums the clients' dial counters.
type dialTotals struct{ full, zeroRTT, rejected, errors float64 }

func (r *run) dialCounts() dialTotals {
	var t dialTotals
	for _, e := range r.fl.clients {
		if e.m == nil {
			continue
		}
		f, z := e.dials()
		t.full += f
		t.zeroRTT += z
		t.rejected += counter(e.m.DialsTotal.WithLabelValues("0rtt_rejected"))
		t.errors += counter(e.m.DialsTotal.WithLabelValues("error")) + counter(e.m.DialsTotal.WithLabelValues("auth_failed"))
	}
	return t
}

// labelled returns the samples of a labelled metric, keyed by their labels,
// leaving out zeros.
func labelled(m metricSet, name string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if labels, ok := strings.CutPrefix(k, name+"{"); ok && v != 0 {
			out[labels[:len(labels)-1]] = v
		}
	}
	return out
}

// delta returns the non-zero increases of a labelled metric from m0 to m1,
// keyed by their labels.
func delta(m0, m1 metricSet, name string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range labelled(m1, name) {
		if n := v - m0[name+"{"+k+"}"]; n != 0 {
			out[k] = n
		}
	}
	return out
}

// selfCPU is this process's CPU seconds so far.
func selfCPU() float64 {
	v, _ := procstat.CPUSeconds(os.Getpid())
	return v
}

// loadgenFigures describes this process with n clients connected, per
// client over base (nil: none).
func loadgenFigures(n int, base *Loadgen) *Loadgen {
	rss, _ := procstat.RSSBytes(os.Getpid())
	g := runtime.NumGoroutine()
	l := &Loadgen{RSSBytes: rss, Goroutines: g}
	if base != nil {
		l.RSSPerClientBytes = float64(rss-base.RSSBytes) / float64(n)
		l.GoroutinesPerClient = float64(g-base.Goroutines) / float64(n)
	}
	return l
}

// echoServer echoes every TCP connection: the tunnels' destination.
type echoServer struct {
	ln net.Listener
	wg sync.WaitGroup
	mu sync.Mutex
	cs map[net.Conn]struct{}
}

func startEcho() (*echoServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &echoServer{ln: ln, cs: map[net.Conn]struct{}{}}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.cs[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Go(func() {
				_, _ = io.Copy(c, c)
				_ = c.Close()
				s.mu.Lock()
				delete(s.cs, c)
				s.mu.Unlock()
			})
		}
	})
	return s, nil
}

func (s *echoServer) addr() string { return s.ln.Addr().String() }

// close stops accepting, closes open connections and waits for their
// goroutines.
func (s *echoServer) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.cs {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}
