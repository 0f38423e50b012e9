package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/server"
)

// soakKind is a kind of phase in the soak's fault schedule. The order is the
// order of severity: a transfer that overlaps several phases is counted under
// the most severe one.
type soakKind int

const (
	soakCalm soakKind = iota
	soakDup
	soakReorder
	soakLoss10
	soakLoss20
	soakMix
	soakLoss30
	soakBlackoutShort  // under 10 s
	soakBlackoutMedium // 10 s to under 60 s
	soakBlackoutLong   // 60 s to 90 s
	soakRestart
	soakKinds
)

var soakKindNames = [soakKinds]string{"calm", "dup", "reorder", "loss10", "loss20", "mix", "loss30",
	"blackout<10s", "blackout10-59s", "blackout60-90s", "restart"}

func (k soakKind) String() string { return soakKindNames[k] }

// soakPhase is one step of the schedule: faults on the link for d, or a
// server restart followed by d of calm.
type soakPhase struct {
	kind   soakKind
	faults linkFaults
	d      time.Duration
}

const (
	soakOneWay = 5 * time.Millisecond
	// soakCalmLoss is the loss between faults. Throughput is loss-bound (one
	// QUIC connection: about 25-40 MiB/s both ways without loss, 9 at 0.1 %,
	// 3.5 at 1 %), and the soak must verify 10 GiB an hour.
	soakCalmLoss = 0.0005
)

// soakCycle is the fault schedule, about 15.5 minutes, repeated: every fault
// is followed by calm, and each cycle has a long blackout of 60, 70, 80 or
// 90 s in turn (90 s is the idle timeout: that one may end the QUIC
// connection, and the streams on it fail loudly). With bulk data in flight
// the connection is congestion-limited through a blackout, and quic-go then
// sends no path probes (only backed-off PTO probes, up to 60 s apart), so
// recovery after a long blackout can take tens of seconds; the summary's
// "max recovery" column shows it.
func soakCycle(i int) []soakPhase {
	calm := func(d time.Duration) soakPhase {
		return soakPhase{kind: soakCalm, faults: linkFaults{Loss: soakCalmLoss}, d: d}
	}
	dark := func(d time.Duration) soakPhase {
		k := soakBlackoutShort
		switch {
		case d >= 60*time.Second:
			k = soakBlackoutLong
		case d >= 10*time.Second:
			k = soakBlackoutMedium
		}
		return soakPhase{kind: k, faults: linkFaults{Dark: true}, d: d}
	}
	fault := func(k soakKind, f linkFaults) soakPhase { return soakPhase{kind: k, faults: f, d: 45 * time.Second} }
	reorder := linkFaults{Loss: soakCalmLoss, Reorder: 0.05, ReorderBy: 15 * time.Millisecond} // RTT 10 ms
	restart := soakPhase{kind: soakRestart, faults: linkFaults{Loss: soakCalmLoss}, d: 10 * time.Second}
	return []soakPhase{
		calm(40 * time.Second),
		dark(3 * time.Second), calm(40 * time.Second),
		fault(soakLoss10, linkFaults{Loss: 0.10}), calm(40 * time.Second),
		fault(soakReorder, reorder), calm(40 * time.Second),
		restart, calm(30 * time.Second),
		fault(soakLoss20, linkFaults{Loss: 0.20}), calm(40 * time.Second),
		dark(time.Duration(15+10*(i%4)) * time.Second), calm(40 * time.Second),
		fault(soakDup, linkFaults{Loss: soakCalmLoss, Dup: 0.05}), calm(40 * time.Second),
		dark(time.Duration(60+10*(i%4)) * time.Second), calm(60 * time.Second),
		fault(soakLoss30, linkFaults{Loss: 0.30}), calm(40 * time.Second),
		fault(soakMix, linkFaults{Loss: 0.10, Reorder: 0.05, ReorderBy: 15 * time.Millisecond, Dup: 0.05}), calm(40 * time.Second),
		dark(time.Duration(1+i%8) * time.Second), calm(40 * time.Second),
		restart,
	}
}

// soakLog records which phase ran when, and counts transfers under the
// most severe phase each one overlapped.
type soakLog struct {
	mu     sync.Mutex
	phases []soakPhase
	tally  [soakKinds]faultTally
	times  [soakKinds]int
	spent  [soakKinds]time.Duration
	// reconnects and rescues (path switches) that happened during each kind of phase
	reconnects, rescues [soakKinds]float64
	// After a blackout or a restart: when it ended, and the longest wait
	// from then to the next transfer that completed.
	recoverKind soakKind
	recoverFrom time.Time
	recovery    [soakKinds]time.Duration
}

// recovering starts timing the recovery from a phase of kind k that ended at end.
func (l *soakLog) recovering(k soakKind, end time.Time) {
	l.mu.Lock()
	l.recoverKind, l.recoverFrom = k, end
	l.mu.Unlock()
}

func (l *soakLog) enter(p soakPhase) {
	l.mu.Lock()
	l.phases = append(l.phases, p)
	l.times[p.kind]++
	l.mu.Unlock()
}

// now is the index of the current phase.
func (l *soakLog) now() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.phases) - 1
}

// record counts a transfer that ran from phase from to now.
func (l *soakLog) record(from int, n int64, err error) {
	l.mu.Lock()
	k := soakCalm
	for _, p := range l.phases[from:] {
		k = max(k, p.kind)
	}
	if err == nil && !l.recoverFrom.IsZero() {
		l.recovery[l.recoverKind] = max(l.recovery[l.recoverKind], time.Since(l.recoverFrom))
		l.recoverFrom = time.Time{}
	}
	l.mu.Unlock()
	l.tally[k].record(n, err)
}

// soakBulk is how many bulk workers run: QUICTUN_SOAK_BULK, default 2.
func soakBulk(t *testing.T) int {
	s := os.Getenv("QUICTUN_SOAK_BULK")
	if s == "" {
		return 2
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, "QUICTUN_SOAK_BULK")
	return n
}

// soakPingPong keeps one connection to the echo server behind addr open until
// ctx ends or for life, sending a small message every interval and checking
// that exactly it comes back; then it half-closes and expects a clean EOF. It
// returns the bytes sent and nil, a loud error, or errCorrupted.
func soakPingPong(ctx context.Context, addr string, life, interval time.Duration, rng *mrand.Rand) (int64, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, fmt.Errorf("dial: %w", err)
	}
	defer func() { _ = c.Close() }()
	var sent int64
	msg, got := make([]byte, 1024), make([]byte, 1024)
	end := time.Now().Add(life)
	for ctx.Err() == nil && time.Now().Before(end) {
		m := msg[:16+rng.IntN(1024-16)]
		for i := range m {
			m[i] = byte(rng.Uint32())
		}
		// A round trip may wait out the longest blackout and a reconnect.
		_ = c.SetDeadline(time.Now().Add(3 * time.Minute))
		if _, err := c.Write(m); err != nil {
			return sent, fmt.Errorf("write after %d bytes: %w", sent, err)
		}
		if _, err := io.ReadFull(c, got[:len(m)]); err != nil {
			return sent, fmt.Errorf("read after %d bytes: %w", sent, err)
		}
		if !bytes.Equal(m, got[:len(m)]) {
			return sent, fmt.Errorf("%w: echo of a %d-byte message differs after %d bytes", errCorrupted, len(m), sent)
		}
		sent += int64(len(m))
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return sent, fmt.Errorf("close write: %w", err)
	}
	_ = c.SetDeadline(time.Now().Add(3 * time.Minute))
	extra, err := io.Copy(io.Discard, c)
	if err != nil {
		return sent, fmt.Errorf("read to EOF: %w", err)
	}
	if extra != 0 {
		return sent, fmt.Errorf("%w: %d bytes after the last echo", errCorrupted, extra)
	}
	return sent, nil
}

// TestSoak runs mixed traffic through an emulated link for
// QUICTUN_SOAK_DURATION (make soak sets it; skipped otherwise): four
// long-lived ping-pong connections, short connections of 64 B to 16 KiB, and
// QUICTUN_SOAK_BULK bulk workers (4 to 32 MiB each way), under soakCycle's
// schedule of blackouts (1 s to 90 s), 10-30 % loss, reordering,
// duplication and server restarts. Every transfer is checked (count and
// SHA-256, or each echo byte for byte). At the end it logs a summary per
// fault kind; no transfer may have completed with wrong data, and
// goroutines, file descriptors (without a GC) and heap must be back to their
// baseline.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("QUICTUN_SOAK_DURATION"))
	if err != nil || d <= 0 {
		t.Skip("set QUICTUN_SOAK_DURATION (e.g. 1h) to run the soak; make soak does")
	}
	bulk := soakBulk(t)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseHeap, baseGoroutines, baseFDs := ms.HeapInuse, runtime.NumGoroutine(), fdSnapshot()

	log := &soakLog{}
	var linkCounts string
	// A subtest, so that everything it started is cleaned up before the checks below.
	t.Run("traffic", func(t *testing.T) {
		echo := copyEchoServer(t) // no splice pipes: they would wait for the GC (fault_fd_test.go)
		state := t.TempDir()
		noDrain := func(c *server.Config) { c.DrainTimeout = 0 }
		srv := testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Allow: []string{"tcp:" + echo}, Mutate: noDrain})
		addr := srv.Addr
		link := newFaultLink(t, srv.Addr, soakOneWay, 7)
		cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: link.Addr(), WaitReady: true})
		log.enter(soakPhase{kind: soakCalm, faults: linkFaults{Loss: soakCalmLoss}})
		link.set(linkFaults{Loss: soakCalmLoss})

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		loop := func(seed uint64, pause time.Duration, one func(rng *mrand.Rand) (int64, error)) {
			rng := mrand.New(mrand.NewPCG(seed, 1))
			for ctx.Err() == nil {
				from := log.now()
				n, err := one(rng)
				log.record(from, n, err)
				select {
				case <-ctx.Done():
				case <-time.After(pause):
				}
			}
		}
		for i := range 4 {
			wg.Go(func() {
				loop(uint64(100+i), 100*time.Millisecond, func(rng *mrand.Rand) (int64, error) {
					return soakPingPong(ctx, cl.Addr, 20*time.Second+time.Duration(rng.Int64N(int64(100*time.Second))), 100*time.Millisecond, rng)
				})
			})
		}
		for i := range 2 {
			wg.Go(func() {
				loop(uint64(200+i), 20*time.Millisecond, func(rng *mrand.Rand) (int64, error) {
					n := transferSize(rng, 64, 16<<10)
					return n, verifiedTransfer(cl.Addr, n, 3*time.Minute)
				})
			})
		}
		for i := range bulk {
			wg.Go(func() {
				loop(uint64(300+i), 200*time.Millisecond, func(rng *mrand.Rand) (int64, error) {
					n := transferSize(rng, 4<<20, 32<<20)
					return n, verifiedTransfer(cl.Addr, n, 10*time.Minute)
				})
			})
		}

		start := time.Now()
		deadline := start.Add(d)
		reconnects := func() float64 { return promtest.ToFloat64(cl.Metrics.ReconnectsTotal) }
		rescues := func() float64 { return promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("switched")) }
	schedule:
		for cycle := 0; ; cycle++ {
			for _, p := range soakCycle(cycle) {
				left := time.Until(deadline)
				if left <= 0 {
					break schedule
				}
				var ok, failed, corrupted, verified int64
				for k := range soakKinds {
					ok, failed, corrupted = ok+log.tally[k].ok.Load(), failed+log.tally[k].failed.Load(), corrupted+log.tally[k].corrupted.Load()
					verified += log.tally[k].bytes.Load()
				}
				t.Logf("%6s phase %-14s %-36s so far: %d ok, %d failed, %d corrupted, %.2f GiB verified; %v reconnects, %v rescues",
					time.Since(start).Round(time.Second), p.kind, p.faults, ok, failed, corrupted, float64(verified)/(1<<30), reconnects(), rescues())
				log.enter(p)
				r0, s0, t0 := reconnects(), rescues(), time.Now()
				if p.kind == soakRestart {
					srv.Stop(t)
					srv = testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Addr: addr, Allow: []string{"tcp:" + echo}, Mutate: noDrain})
					log.recovering(p.kind, time.Now())
				}
				link.set(p.faults)
				time.Sleep(min(p.d, time.Until(deadline)))
				if p.faults.Dark {
					log.recovering(p.kind, time.Now())
				}
				log.mu.Lock()
				log.spent[p.kind] += time.Since(t0)
				log.reconnects[p.kind] += reconnects() - r0
				log.rescues[p.kind] += rescues() - s0
				log.mu.Unlock()
			}
		}
		// Calm while the last transfers finish.
		log.enter(soakPhase{kind: soakCalm, faults: linkFaults{Loss: soakCalmLoss}})
		link.set(linkFaults{Loss: soakCalmLoss})
		cancel()
		wg.Wait()
		linkCounts = link.counts.String()
		cl.Stop(t)
		srv.Stop(t)
	})

	var rows []string
	var total faultTally
	var totalReconnects, totalRescues float64
	rows = append(rows, fmt.Sprintf("%-15s %5s %9s %8s %6s %9s %12s %10s %7s %12s  %s", "kind", "times", "time", "ok", "failed", "corrupted",
		"MiB verified", "reconnects", "rescues", "max recovery", "first errors"))
	for k := range soakKinds {
		tl := &log.tally[k]
		total.ok.Add(tl.ok.Load())
		total.failed.Add(tl.failed.Load())
		total.corrupted.Add(tl.corrupted.Load())
		total.bytes.Add(tl.bytes.Load())
		totalReconnects += log.reconnects[k]
		totalRescues += log.rescues[k]
		rows = append(rows, fmt.Sprintf("%-15s %5d %9s %8d %6d %9d %12d %10v %7v %12s  %q", k, log.times[k], log.spent[k].Round(time.Second),
			tl.ok.Load(), tl.failed.Load(), tl.corrupted.Load(), tl.bytes.Load()>>20, log.reconnects[k], log.rescues[k],
			log.recovery[k].Round(10*time.Millisecond), tl.errs))
	}
	rows = append(rows, fmt.Sprintf("%-15s %5s %9s %8d %6d %9d %12d %10v %7v", "total", "", d, total.ok.Load(), total.failed.Load(),
		total.corrupted.Load(), total.bytes.Load()>>20, totalReconnects, totalRescues))
	t.Logf("soak %s, %d bulk workers, one-way delay %s, calm loss %.4g %%; transfers are counted under the most severe phase they overlapped; "+
		"MiB verified counts each byte twice (sent and echoed); max recovery is the longest wait from the end of a blackout or restart "+
		"to the next completed transfer\n%s\nlink: %s", d, bulk, soakOneWay, 100*soakCalmLoss, strings.Join(rows, "\n"), linkCounts)
	t.Logf("verified: %.2f GiB through the tunnel (%.2f GiB of payload, each byte out and back)",
		float64(total.bytes.Load())/(1<<30), float64(total.bytes.Load())/2/(1<<30))

	require.Zero(t, total.corrupted.Load(), "a transfer completed with wrong data")
	require.Positive(t, total.ok.Load())

	// Everything the soak started must be gone.
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= baseGoroutines+5 }, 30*time.Second, 100*time.Millisecond,
		"goroutines: %d, baseline %d", runtime.NumGoroutine(), baseGoroutines)
	// No GC first: every descriptor must have been closed by its owner, not
	// by a finalizer (TestFaultNoFDLeftForFinalizers checks the same, briefly).
	var left []string
	assert.True(t, pollFor(30*time.Second, func() bool { left = fdsAdded(baseFDs, fdSnapshot()); return len(left) == 0 }),
		"descriptors open after the soak that were not before:\n%s", strings.Join(left, "\n"))
	runtime.GC()
	runtime.ReadMemStats(&ms)
	t.Logf("heap in use: %d KiB after, %d KiB before; goroutines %d (%d); fds %d (%d)",
		ms.HeapInuse>>10, baseHeap>>10, runtime.NumGoroutine(), baseGoroutines, len(fdSnapshot()), len(baseFDs))
	assert.Less(t, ms.HeapInuse, baseHeap+64<<20, "heap did not come back near its baseline")
}
