package integration

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
)

// twoServers starts two servers sharing one state directory (one
// certificate and ticket key, as the Helm chart's replicas share them),
// each behind a proxy whose dark flag blackholes it, and a client of both.
func twoServers(t *testing.T, mode client.Mode, mutate func(*client.Config)) (srv [2]*testutil.Server, dark [2]*atomic.Bool, cl *testutil.Client, echo string) {
	t.Helper()
	echo = testutil.EchoServer(t)
	state := t.TempDir()
	var addrs []string
	for i := range srv {
		srv[i] = testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Allow: []string{"tcp:" + echo}})
		dark[i] = &atomic.Bool{}
		addrs = append(addrs, lossyProxy(t, srv[i], 0, dark[i], nil))
	}
	cl = testutil.StartClient(t, srv[0], testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true,
		Mutate: func(c *client.Config) {
			c.Servers, c.Mode = addrs, mode
			c.Backoff.Max = 300 * time.Millisecond
			if mutate != nil {
				mutate(c)
			}
		}})
	// Both connected (the standby too) before the test starts.
	require.Eventually(t, func() bool { return healthy(cl) == 2 }, 20*time.Second, 10*time.Millisecond, "both servers connected")
	return srv, dark, cl, echo
}

func active(s *testutil.Server) int { return int(promtest.ToFloat64(s.Metrics.ActiveStreams)) }

// TestSpreadAcrossServers (issue 23): in spread mode, 100 tunnels held open
// over two servers land 40-60 on each (least active streams first).
func TestSpreadAcrossServers(t *testing.T) {
	t.Parallel()
	srv, _, cl, _ := twoServers(t, client.ModeSpread, nil)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := range 100 {
		c, err := net.Dial("tcp", cl.Addr)
		require.NoError(t, err)
		conns = append(conns, c)
		echoOnce(t, c, "spread "+string(rune('a'+i%26)))
	}
	require.Eventually(t, func() bool { return active(srv[0])+active(srv[1]) == 100 }, 10*time.Second, 10*time.Millisecond)
	a, b := active(srv[0]), active(srv[1])
	t.Logf("tunnels per server: %d, %d", a, b)
	assert.True(t, a >= 40 && a <= 60 && b >= 40 && b <= 60, "each server gets 40-60 of 100 tunnels: %d, %d", a, b)
}

// opener opens a tunnel every interval in its own goroutine (an echo each,
// 10 s at most) and records when each opened and whether it got its echo.
type opener struct {
	mu    sync.Mutex
	tries []try
	stop  chan struct{}
	wg    sync.WaitGroup
}

type try struct {
	opened, answered time.Time
	ok               bool
}

func startOpener(t *testing.T, addr string, interval time.Duration) *opener {
	o := &opener{stop: make(chan struct{})}
	o.wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-o.stop:
				return
			case <-tick.C:
			}
			o.wg.Go(func() {
				tr := try{opened: time.Now()}
				c, err := net.Dial("tcp", addr)
				if err == nil {
					_ = c.SetDeadline(time.Now().Add(10 * time.Second))
					buf := make([]byte, 4)
					if _, err = c.Write([]byte("ping")); err == nil {
						_, err = c.Read(buf)
					}
					tr.ok, tr.answered = err == nil && string(buf) == "ping", time.Now()
					_ = c.Close()
				}
				o.mu.Lock()
				o.tries = append(o.tries, tr)
				o.mu.Unlock()
			})
		}
	})
	t.Cleanup(o.close)
	return o
}

func (o *opener) close() {
	select {
	case <-o.stop:
	default:
		close(o.stop)
	}
	o.wg.Wait()
}

// firstOKAfter returns how long after at the first tunnel opened after at
// got its answer (false: none yet).
func (o *opener) firstOKAfter(at time.Time) (time.Duration, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var best time.Duration
	found := false
	for _, tr := range o.tries {
		if tr.ok && tr.opened.After(at) && (!found || tr.answered.Sub(at) < best) {
			best, found = tr.answered.Sub(at), true
		}
	}
	return best, found
}

// TestFailoverAndFailback (issue 23): failover mode with tunnels opening
// all the time; the active server is blackholed -> new tunnels succeed on
// the other one within a few seconds (about RescueAfter plus an RTT; the
// figure through the built binaries is the bench's), its tunnels are reset;
// it comes back -> new tunnels return to it after FailbackAfter, and the
// active server moved exactly twice (no flapping).
func TestFailoverAndFailback(t *testing.T) {
	t.Parallel()
	const failback = 2 * time.Second
	srv, dark, cl, _ := twoServers(t, client.ModeFailover, func(c *client.Config) { c.FailbackAfter = failback })
	o := startOpener(t, cl.Addr, 50*time.Millisecond)
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv[0].Metrics.StreamsTotal.WithLabelValues("ok")) > 5 },
		10*time.Second, 10*time.Millisecond, "tunnels go to the first server")
	assert.Zero(t, promtest.ToFloat64(srv[1].Metrics.StreamsTotal.WithLabelValues("ok")), "the standby carries nothing")

	kill := time.Now()
	dark[0].Store(true)
	var took time.Duration
	require.Eventually(t, func() bool {
		d, ok := o.firstOKAfter(kill)
		took = d
		return ok
	}, 15*time.Second, 10*time.Millisecond, "a new tunnel succeeds after the active server went dark")
	t.Logf("first new tunnel answered %v after the blackout", took)
	assert.Less(t, took, 6*time.Second, "failover within about a second of detection (generous on a loaded machine)")
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv[1].Metrics.StreamsTotal.WithLabelValues("ok")) > 0 },
		10*time.Second, 10*time.Millisecond, "the standby took the new tunnels")
	assert.Equal(t, uint64(1), cl.Switches())
	// The dark server's connection is given up (its tunnels reset) once
	// quiet for 3 RescueAfter while the other server answers.
	require.Eventually(t, func() bool { return cl.ServerStats()[0].Connections == 0 }, 15*time.Second, 10*time.Millisecond,
		"the dark server's connection was closed")
	t.Logf("dark server's connection closed %v after the blackout", time.Since(kill))

	back := time.Now()
	dark[0].Store(false)
	okA := promtest.ToFloat64(srv[0].Metrics.StreamsTotal.WithLabelValues("ok"))
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv[0].Metrics.StreamsTotal.WithLabelValues("ok")) > okA+3 },
		30*time.Second, 10*time.Millisecond, "tunnels return to the first server")
	t.Logf("failback %v after the server came back", time.Since(back))
	assert.GreaterOrEqual(t, time.Since(back), failback, "not before it stayed healthy for FailbackAfter")
	time.Sleep(2 * time.Second)
	assert.Equal(t, uint64(2), cl.Switches(), "failed over once and back once: no flapping")
	o.close()
}

// TestStandbyIdle (issues 22 and 23): the warm standby costs what an idle
// client costs: with tunnels on the active server, the standby's connection
// sends no heartbeats (keep-alives only), and once the tunnels are done
// neither connection does.
func TestStandbyIdle(t *testing.T) {
	t.Parallel()
	const interval, idle = 50 * time.Millisecond, 500 * time.Millisecond
	srv, _, cl, _ := twoServers(t, client.ModeFailover, func(c *client.Config) { c.HeartbeatInterval, c.IdleAfter = interval, idle })
	require.Eventually(t, func() bool { return heartbeatsStopped(cl, interval) }, 20*time.Second, time.Millisecond,
		"two connected servers, no tunnels: no heartbeats")
	standbyEchoes := srv[1].LivenessStats().EchoesSent.Load()
	c, err := net.Dial("tcp", cl.Addr)
	require.NoError(t, err)
	defer c.Close()
	echoOnce(t, c, "active")
	assert.Equal(t, 1, active(srv[0]), "the tunnel went to the active server")
	require.Eventually(t, func() bool { return heartbeatsStopped(cl, interval) }, 20*time.Second, time.Millisecond,
		"both quiet again once the tunnel is idle")
	assert.Equal(t, standbyEchoes, srv[1].LivenessStats().EchoesSent.Load(), "the standby got no heartbeat while the active server had work")
	assert.Zero(t, active(srv[1]), "the standby carried nothing")
}

// TestSpreadUsesServerAgain (issue 23): in spread mode a server that went
// dark and came back takes new tunnels again within 10 s of its return.
func TestSpreadUsesServerAgain(t *testing.T) {
	t.Parallel()
	srv, dark, cl, _ := twoServers(t, client.ModeSpread, nil)
	dark[0].Store(true)
	o := startOpener(t, cl.Addr, 50*time.Millisecond) // work, so the dark server's silence shows
	require.Eventually(t, func() bool { return cl.ServerStats()[0].Connections == 0 }, 20*time.Second, 10*time.Millisecond,
		"the dark server's connection was given up")
	okB := promtest.ToFloat64(srv[1].Metrics.StreamsTotal.WithLabelValues("ok"))
	okA := promtest.ToFloat64(srv[0].Metrics.StreamsTotal.WithLabelValues("ok"))
	back := time.Now()
	dark[0].Store(false)
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv[0].Metrics.StreamsTotal.WithLabelValues("ok")) > okA+3 },
		10*time.Second, 10*time.Millisecond, "new tunnels on the returned server within 10 s")
	t.Logf("returned server used again %v after it came back", time.Since(back))
	// Least active first, ties to the server placed on longest ago: these
	// short tunnels alternate (CI once saw the other take none for 10 s
	// when ties went to the first server in order).
	require.Eventually(t, func() bool { return promtest.ToFloat64(srv[1].Metrics.StreamsTotal.WithLabelValues("ok")) > okB },
		10*time.Second, 10*time.Millisecond, "the other server kept taking tunnels")
	o.close()
}
