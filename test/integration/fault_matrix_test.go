package integration

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// errCorrupted means a transfer ended without an error but with wrong data:
// bytes lost, duplicated, reordered or altered inside a tunneled connection.
// It must never happen.
var errCorrupted = errors.New("transfer completed with wrong data")

// verifiedTransfer opens a connection to the echo server behind addr, sends n
// pseudo-random bytes while reading the echo, half-closes, and checks the
// byte count and SHA-256 of what came back. The whole transfer must finish
// within timeout. A transfer that fails returns the error that made it fail
// (it failed loudly); one that completes with wrong data returns errCorrupted.
func verifiedTransfer(addr string, n int64, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(timeout))
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], mrand.Uint64())
	binary.LittleEndian.PutUint64(seed[8:], mrand.Uint64())
	sent := sha256.New()
	werr := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, io.TeeReader(io.LimitReader(mrand.NewChaCha8(seed), n), sent))
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got := sha256.New()
	m, rerr := io.Copy(got, c)
	if err := <-werr; err != nil {
		return fmt.Errorf("write after %d bytes echoed: %w", m, err)
	}
	if rerr != nil {
		return fmt.Errorf("read after %d bytes: %w", m, rerr)
	}
	if m != n || string(sent.Sum(nil)) != string(got.Sum(nil)) {
		return fmt.Errorf("%w: %d bytes echoed of %d sent, SHA-256 %x, want %x", errCorrupted, m, n, got.Sum(nil), sent.Sum(nil))
	}
	return nil
}

// transferSize returns a size between lo and hi, uniform in its logarithm.
func transferSize(rng *mrand.Rand, lo, hi int64) int64 {
	return int64(float64(lo) * math.Pow(float64(hi)/float64(lo), rng.Float64()))
}

// faultTally counts the transfers of one fault case and keeps the first errors.
type faultTally struct {
	ok, failed, corrupted, bytes atomic.Int64
	mu                           sync.Mutex
	errs                         []string
}

func (f *faultTally) record(n int64, err error) {
	switch {
	case err == nil:
		f.ok.Add(1)
		f.bytes.Add(2 * n) // verified both ways
		return
	case errors.Is(err, errCorrupted):
		f.corrupted.Add(1)
	default:
		f.failed.Add(1)
	}
	f.mu.Lock()
	if len(f.errs) < 5 {
		f.errs = append(f.errs, err.Error())
	}
	f.mu.Unlock()
}

// TestFaultMatrix sends random data both ways over several concurrent
// tunneled connections through an emulated link with heavy loss, reordering,
// duplication, a mix of them, and a blackout. No transfer may fail: QUIC
// recovers from all of these, and the blackout is far shorter than the idle
// timeout. Above all, none may complete with wrong data. The figures go to
// the log as a table.
func TestFaultMatrix(t *testing.T) {
	conns, caseTime, blackout, sizeScale := 4, 3500*time.Millisecond, 3*time.Second, int64(1)
	if testing.Short() {
		conns, caseTime, blackout, sizeScale = 2, 1500*time.Millisecond, 1500*time.Millisecond, 4
	}
	const oneWay = 2 * time.Millisecond
	reorder := linkFaults{Reorder: 0.05, ReorderBy: 5 * time.Millisecond} // RTT is 4 ms: held-back packets arrive after later ones
	// maxSize keeps the last transfer of a lossy case from running long past caseTime.
	cases := []struct {
		name     string
		faults   linkFaults
		blackout bool
		maxSize  int64
	}{
		{name: "loss10", faults: linkFaults{Loss: 0.10}, maxSize: 256 << 10},
		{name: "loss20", faults: linkFaults{Loss: 0.20}, maxSize: 128 << 10},
		{name: "loss30", faults: linkFaults{Loss: 0.30}, maxSize: 64 << 10},
		{name: "reorder5", faults: reorder, maxSize: 1 << 20},
		{name: "dup5", faults: linkFaults{Dup: 0.05}, maxSize: 1 << 20},
		{name: "mix", faults: linkFaults{Loss: 0.10, Reorder: 0.05, ReorderBy: 5 * time.Millisecond, Dup: 0.05}, maxSize: 256 << 10},
		{name: "blackout", blackout: true, maxSize: 1 << 20},
	}
	rows := []string{fmt.Sprintf("%-9s %-32s %5s %6s %9s %10s %8s  %s", "case", "faults", "ok", "failed", "corrupted", "MiB", "MiB/s", "link")}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			echo := copyEchoServer(t)
			srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
			link := newFaultLink(t, srv.Addr, oneWay, uint64(i+1))
			cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: link.Addr(), WaitReady: true})
			link.set(tc.faults)

			tally := &faultTally{}
			ctx, cancel := context.WithTimeout(context.Background(), caseTime)
			defer cancel()
			start := time.Now()
			var wg sync.WaitGroup
			for w := range conns {
				wg.Go(func() {
					rng := mrand.New(mrand.NewPCG(uint64(i), uint64(w)))
					for ctx.Err() == nil {
						n := transferSize(rng, 1<<10, tc.maxSize/sizeScale)
						tally.record(n, verifiedTransfer(cl.Addr, n, time.Minute))
					}
				})
			}
			desc := tc.faults.String()
			if tc.blackout {
				// Dark from a quarter of the case on, with transfers in flight.
				desc = fmt.Sprintf("dark for %s", blackout)
				time.Sleep(caseTime / 4)
				link.set(linkFaults{Dark: true})
				time.Sleep(blackout)
				link.set(tc.faults)
			}
			wg.Wait()
			elapsed := time.Since(start)
			mib := float64(tally.bytes.Load()) / (1 << 20)
			rows = append(rows, fmt.Sprintf("%-9s %-32s %5d %6d %9d %10.1f %8.2f  %s", tc.name, desc, tally.ok.Load(), tally.failed.Load(),
				tally.corrupted.Load(), mib, mib/elapsed.Seconds(), link.counts.String()))
			t.Logf("%s: %d transfers ok (%.1f MiB verified, both ways) in %s, %d failed, %d corrupted; link %s; rescues switched %v; errors %q",
				desc, tally.ok.Load(), mib, elapsed.Round(time.Millisecond), tally.failed.Load(), tally.corrupted.Load(), link.counts.String(),
				promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("switched")), tally.errs)

			require.Zero(t, tally.corrupted.Load(), "a transfer completed with wrong data: %q", tally.errs)
			assert.Zero(t, tally.failed.Load(), "transfers failed: %q", tally.errs)
			assert.Positive(t, tally.ok.Load())
			assert.Zero(t, promtest.ToFloat64(cl.Metrics.ReconnectsTotal), "the tunnel's QUIC connection must survive")
			if tc.faults.Loss > 0 || tc.blackout {
				assert.Positive(t, link.counts.dropped.Load())
			}
			if tc.faults.Reorder > 0 {
				assert.Positive(t, link.counts.reordered.Load())
			}
			if tc.faults.Dup > 0 {
				assert.Positive(t, link.counts.duplicated.Load())
			}
		})
	}
	t.Logf("fault matrix, %d concurrent connections, %s per case, one-way delay %s:\n%s", conns, caseTime, oneWay, strings.Join(rows, "\n"))
}
