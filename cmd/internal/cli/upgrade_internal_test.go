//go:build linux

package cli

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/handover"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/resume"
)

// fakeServer is an EarlyUpgradable that records what the upgrade asked of
// it, in order.
type fakeServer struct {
	mu    sync.Mutex
	steps []string
	// gcPaced: whether the collector paced itself (GOGC on) at each
	// tunnel's import.
	gcPaced []bool
}

// importing records the collector's pacing at an import.
func (f *fakeServer) importing() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gcPaced = append(f.gcPaced, gcPercent() >= 0)
}

func (f *fakeServer) record(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps = append(f.steps, s)
}

func (f *fakeServer) HandOver(context.Context, handover.SendFunc) error {
	f.record("handover")
	return nil
}

func (f *fakeServer) HandOverSteps(context.Context, handover.Steps) error {
	f.record("handover steps")
	return nil
}

func (f *fakeServer) HandoverLimits() handover.Limits {
	return handover.Limits{MaxTunnels: 10, MaxTunnelBytes: 1 << 20, MaxTotalBytes: 10 << 20}
}

func (f *fakeServer) Import(_ context.Context, ts []handover.Tunnel) (int, error) {
	f.record("import " + strconv.Itoa(len(ts)))
	for _, t := range ts {
		f.importing()
		_ = t.Conn.Close()
	}
	return len(ts), nil
}

func (f *fakeServer) BeginImport() func() {
	f.record("begin")
	return sync.OnceFunc(func() { f.record("end") })
}

func (f *fakeServer) ImportTunnel(_ context.Context, t handover.Tunnel) error {
	f.record("tunnel " + t.UUID)
	f.importing()
	return t.Conn.Close()
}

func (f *fakeServer) LoadUsage(context.Context) { f.record("usage") }

// tunnelsOf returns n tunnels on loopback TCP sockets (closed at the end).
func tunnelsOf(t *testing.T, n int) []handover.Tunnel {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var ts []handover.Tunnel
	for i := range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		f, err := c.(*net.TCPConn).File()
		require.NoError(t, err)
		t.Cleanup(func() { _ = f.Close() })
		ts = append(ts, handover.Tunnel{UUID: "t" + strconv.Itoa(i), State: resume.State{ID: resume.ID{byte(i + 1)}, Window: time.Minute, Conn: f}})
	}
	return ts
}

// TestUpgradeEarlyServer: the new server process, told the socket is
// released, marks its import (so Serve may run while the tunnels come),
// imports each tunnel as it arrives, ends the import, reads the
// accounting's totals only once the old process said it saved them, then
// answers; a parent that does not send released (an older binary) gets
// the import before serving, as before. Either way the tunnels are taken
// with the garbage collector's pacing off, back once they are.
func TestUpgradeEarlyServer(t *testing.T) { // not parallel: it sets the environment (testutil.HandoverPair) and the collector's pacing
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, tc := range []struct {
		name     string
		released bool
		want     []string
	}{
		{"released", true, []string{"begin", "tunnel t0", "tunnel t1", "end", "usage"}},
		{"older parent", false, []string{"import 2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			waitPacing(t) // not paused by an earlier test's import
			parent, child := testutil.HandoverPair(t)
			in := &Inherited{conn: child}
			ts := tunnelsOf(t, 2)
			m := metrics.NewUpgrade(prometheus.NewRegistry(), "server")
			answered := make(chan error, 1)
			go func() {
				answered <- func() error {
					if _, err := parent.WaitReady(time.Now().Add(10 * time.Second)); err != nil {
						return err
					}
					if tc.released {
						if err := parent.SendReleased(); err != nil {
							return err
						}
					}
					if err := parent.SendTunnels(ts); err != nil {
						return err
					}
					if tc.released {
						if err := parent.SendSaved(); err != nil {
							return err
						}
					}
					n, err := parent.WaitDone(time.Now().Add(10 * time.Second))
					if err == nil && n != len(ts) {
						t.Errorf("the new process took %d tunnels, want %d", n, len(ts))
					}
					return err
				}()
			}()
			srv := &fakeServer{}
			ctx := context.Background()
			early, err := in.awaitRelease(ctx, srv)
			require.NoError(t, err)
			if tc.released {
				require.NotNil(t, early, "serve now")
				assert.Equal(t, []string{"begin"}, srv.steps, "importing before Serve runs")
				in.finishEarly(ctx, early, m)
			} else {
				require.Nil(t, early, "import first")
				require.NoError(t, in.finish(ctx, srv, m))
			}
			require.NoError(t, <-answered)
			assert.Equal(t, tc.want, srv.steps)
			assert.Equal(t, float64(2), promtest.ToFloat64(m.Tunnels.WithLabelValues(metrics.UpgradeImported)))
			// The collector's pacing was off from the ready message
			// while the tunnels came, and comes back once they are
			// taken (gcPauseGrace later).
			assert.Equal(t, []bool{false, false}, srv.gcPaced, "pacing off while importing")
			waitPacing(t)
		})
	}
}

// fakeClient is an EachUpgradable (as the client is) recording what the
// upgrade asked of it.
type fakeClient struct{ fakeServer }

func (f *fakeClient) HandOverEach(context.Context, handover.Sender) error {
	f.record("handover each")
	return nil
}

// TestUpgradeEachClient: the new client process, serving already, takes
// each tunnel as it arrives (ImportTunnel, not Import once all came; its
// re-attachment starts while the next ones come) with the collector's
// pacing off, and answers with the count.
func TestUpgradeEachClient(t *testing.T) { // not parallel: it sets the environment (testutil.HandoverPair) and the collector's pacing
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	waitPacing(t) // not paused by an earlier test's import
	parent, child := testutil.HandoverPair(t)
	in := &Inherited{conn: child}
	ts := tunnelsOf(t, 2)
	srv := &fakeClient{}
	answered := make(chan error, 1)
	go func() {
		answered <- func() error {
			if _, err := parent.WaitReady(time.Now().Add(10 * time.Second)); err != nil {
				return err
			}
			for i := range ts {
				if err := parent.SendTunnel(&ts[i]); err != nil {
					return err
				}
			}
			if err := parent.SendEnd(len(ts)); err != nil {
				return err
			}
			n, err := parent.WaitDone(time.Now().Add(10 * time.Second))
			if err == nil && n != len(ts) {
				t.Errorf("the new process took %d tunnels, want %d", n, len(ts))
			}
			return err
		}()
	}()
	m := metrics.NewUpgrade(prometheus.NewRegistry(), "client")
	require.NoError(t, in.finishServing(context.Background(), srv, m))
	require.NoError(t, <-answered)
	assert.Equal(t, []string{"tunnel t0", "tunnel t1"}, srv.steps)
	assert.Equal(t, []bool{false, false}, srv.gcPaced, "pacing off while importing")
	assert.Equal(t, float64(2), promtest.ToFloat64(m.Tunnels.WithLabelValues(metrics.UpgradeImported)))
	waitPacing(t)
}

// TestUpgradeEarlyServeEnds: Serve ending while the tunnels are still
// awaited stops the wait (the shutdown is not held for the hand-over's
// timeout) and ends the import.
func TestUpgradeEarlyServeEnds(t *testing.T) {
	parent, child := testutil.HandoverPair(t)
	in := &Inherited{conn: child}
	go func() {
		if _, err := parent.WaitReady(time.Now().Add(10 * time.Second)); err == nil {
			_ = parent.SendReleased() // and nothing more: the old process hangs
		}
	}()
	srv := &fakeServer{}
	ctx, cancel := context.WithCancel(context.Background())
	early, err := in.awaitRelease(ctx, srv)
	require.NoError(t, err)
	require.NotNil(t, early)
	done := make(chan struct{})
	go func() {
		defer close(done)
		in.finishEarly(ctx, early, metrics.NewUpgrade(prometheus.NewRegistry(), "server"))
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("finishEarly did not return once its ctx ended")
	}
	assert.Equal(t, []string{"begin", "end"}, srv.steps)
	// The import failed: the pacing comes back all the same (and must be
	// back before another test pauses it: the setting is the process's).
	waitPacing(t)
}

// waitPacing waits until the collector paces itself (a test's pause ends
// gcPauseGrace after its import).
func waitPacing(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return gcPercent() == 100 }, 10*time.Second, 10*time.Millisecond, "pacing back")
}

// TestUpgradeAsksTheNewBinary: the old server sends the released message
// only to a new binary that says it reads it (handover-features); an
// older one, which would take it for a protocol error and serve without
// the tunnels (a downgrade), gets the sequence it knows.
func TestUpgradeAsksTheNewBinary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755))
		return p
	}
	newer := script("newer", `[ "$1" = handover-features ] && echo released`)
	older := script("older", `echo "unexpected argument $1" >&2; exit 1`)
	assert.Equal(t, map[string]bool{featureReleased: true}, childFeatures(t.Context(), newer))
	assert.Empty(t, childFeatures(t.Context(), older))
	assert.Empty(t, childFeatures(t.Context(), filepath.Join(dir, "missing")))

	for _, tc := range []struct {
		releases bool
		want     string
	}{{true, "handover steps"}, {false, "handover"}} {
		f := &fakeServer{}
		u := &upgrader{srv: f, side: "server", childReleases: tc.releases}
		parent, child, err := handover.Pair()
		require.NoError(t, err)
		_ = child.Close()
		require.NoError(t, u.handOver(t.Context(), klog.Background(), parent, 1))
		_ = parent.Close()
		assert.Equal(t, []string{tc.want}, f.steps, "child reads released: %v", tc.releases)
	}
}
