package integration

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/server"
)

// fdSnapshot maps each open file descriptor of this process to what it
// refers to; sockets are described by protocol and addresses when /proc/net
// knows their inode.
func fdSnapshot() map[string]string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	socks := socketTable()
	out := make(map[string]string, len(ents))
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // the fd ReadDir used, gone by now
		}
		if ino, ok := strings.CutPrefix(target, "socket:["); ok {
			if d, ok := socks[strings.TrimSuffix(ino, "]")]; ok {
				target += " " + d
			}
		}
		out[e.Name()] = target
	}
	return out
}

// socketTable maps socket inodes to "proto local -> remote" from /proc/net.
func socketTable() map[string]string {
	out := map[string]string{}
	for _, proto := range []string{"udp", "tcp", "udp6", "tcp6"} {
		f, err := os.Open("/proc/net/" + proto)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 {
				continue
			}
			out[fs[9]] = fmt.Sprintf("%s %s -> %s", proto, procAddr(fs[1]), procAddr(fs[2]))
		}
		_ = f.Close()
	}
	return out
}

// procAddr decodes a /proc/net address such as 0100007F:1F90 (IPv4 only; others stay hex).
func procAddr(s string) string {
	h, p, ok := strings.Cut(s, ":")
	b, err := hex.DecodeString(h)
	port, perr := strconv.ParseUint(p, 16, 16)
	if !ok || err != nil || perr != nil || len(b) != 4 {
		return s
	}
	return net.JoinHostPort(net.IPv4(b[3], b[2], b[1], b[0]).String(), strconv.FormatUint(port, 10))
}

// fdsAdded lists the descriptors in now that are not in base (same number and target), sorted.
func fdsAdded(base, now map[string]string) []string {
	var out []string
	for fd, target := range now {
		if base[fd] != target {
			out = append(out, fd+" "+target)
		}
	}
	slices.Sort(out)
	return out
}

// TestFaultNoFDLeftForFinalizers runs reconnects, path rescues and server
// restarts through a lossy link, stops everything, and checks that every
// socket was closed by its owner: the garbage collector is off for the whole
// test, so a socket left to a finalizer stays open and is reported.
func TestFaultNoFDLeftForFinalizers(t *testing.T) {
	runtime.GC() // what earlier tests left behind must not count
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	base := fdSnapshot()

	t.Run("traffic", func(t *testing.T) {
		echo := copyEchoServer(t)
		state := t.TempDir()
		noDrain := func(c *server.Config) { c.DrainTimeout = 0 }
		srv := testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Allow: []string{"tcp:" + echo}, Mutate: noDrain})
		addr := srv.Addr
		link := newFaultLink(t, srv.Addr, 2*time.Millisecond, 1)
		cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: link.Addr(), WaitReady: true})
		echoCheck(t, dial(t, cl.Addr), 64<<10)

		// The client's path dies while a new one would work: after RescueAfter
		// (1 s) the client opens a spare socket, probes and switches to it.
		link.darkenPaths(true)
		echoCheck(t, dial(t, cl.Addr), 64<<10)
		link.darkenPaths(false)
		// A full blackout with a request in flight: rescue probes fail until the link is back.
		c := dial(t, cl.Addr)
		link.set(linkFaults{Dark: true})
		time.Sleep(2500 * time.Millisecond)
		link.set(linkFaults{})
		echoCheck(t, c, 64<<10)
		// Server restarts with transfers in flight, one with a 2 s outage in which
		// the client's dials fail: the client reconnects on its main socket.
		st := &faultTally{}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil {
					st.record(256<<10, verifiedTransfer(cl.Addr, 256<<10, time.Minute))
				}
			})
		}
		for i, outage := range []time.Duration{0, 2 * time.Second} {
			time.Sleep(500 * time.Millisecond)
			srv.Stop(t)
			time.Sleep(outage)
			srv = testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Addr: addr, Allow: []string{"tcp:" + echo}, Mutate: noDrain})
			require.Eventually(t, func() bool {
				return promtest.ToFloat64(cl.Metrics.ReconnectsTotal) > float64(i) && cl.Ready()
			}, 15*time.Second, 10*time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
		cancel()
		wg.Wait()
		require.Zero(t, st.corrupted.Load(), "%q", st.errs)
		t.Logf("transfers across restarts: %d ok, %d failed loudly", st.ok.Load(), st.failed.Load())
		echoCheck(t, dial(t, cl.Addr), 64<<10)
		t.Logf("rescues switched %v recovered %v error %v, reconnects %v",
			promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("switched")),
			promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("recovered")),
			promtest.ToFloat64(cl.Metrics.PathRescuesTotal.WithLabelValues("error")), promtest.ToFloat64(cl.Metrics.ReconnectsTotal))
		cl.Stop(t)
		srv.Stop(t)
	})

	var left []string
	ok := func() bool { left = fdsAdded(base, fdSnapshot()); return len(left) == 0 }
	require.True(t, pollFor(10*time.Second, ok),
		"%d descriptors still open after every owner stopped (the GC is off, so none was closed by a finalizer):\n%s",
		len(left), strings.Join(left, "\n"))
}

// copyEchoServer is testutil.EchoServer without splice(2): it copies through
// a buffer. An io.Copy between two TCP connections splices through a pipe
// from a pool in the Go runtime (internal/poll, splicePipePool), and pooled
// pipes are closed only when the GC empties the pool (it takes two cycles) and
// their cleanup runs, never by their user. Tests that count descriptors
// without a GC must not use splice.
func copyEchoServer(t testing.TB) string {
	t.Helper()
	return testutil.ServeTCP(t, func(c net.Conn) {
		buf := make([]byte, 32<<10)
		_, _ = io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, buf) // hides ReadFrom/WriteTo: no splice
		_ = c.(*net.TCPConn).CloseWrite()
	})
}

// TestFaultSplicePipesNeedGC documents why copyEchoServer exists:
// testutil.EchoServer (io.Copy, TCP to TCP) leaves pooled splice pipes open
// after every connection has closed, until the GC runs twice.
func TestFaultSplicePipesNeedGC(t *testing.T) {
	runtime.GC()
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	pipes := func() (n int) {
		for _, target := range fdSnapshot() {
			if strings.HasPrefix(target, "pipe:") {
				n++
			}
		}
		return n
	}
	base := pipes()
	t.Run("echo", func(t *testing.T) {
		echo := testutil.EchoServer(t)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() { echoCheck(t, dial(t, echo), 1<<20) })
		}
		wg.Wait()
	})
	left := pipes() - base
	if left == 0 {
		t.Skip("this Go version closes splice pipes without a GC; copyEchoServer is no longer needed")
	}
	t.Logf("%d pipe descriptors open after every connection closed, with the GC off", left)
	runtime.GC()
	runtime.GC()
	require.True(t, pollFor(5*time.Second, func() bool { return pipes() == base }),
		"pipes left after two GCs: %d", pipes()-base)
}

// pollFor calls cond every 50 ms until it is true or d has passed.
func pollFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}
