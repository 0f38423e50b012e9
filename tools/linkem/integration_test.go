package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quictun/quictun/tools/linkem/emu"
	"github.com/quictun/quictun/tools/linkem/netns"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"))
}

func requireNetAdmin(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping namespace integration test under -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create network namespaces and TUN devices")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("skipping: /dev/net/tun is missing")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: the ip command (iproute2) is missing")
	}
}

type testbed struct {
	prefix string
	ctl    *emu.Client
}

// startLinkem runs `linkem up` in-process with a prefix unique to this test
// process and stops it (checking the teardown) when the test ends.
func startLinkem(t *testing.T, prefix string, flags emu.ConfigUpdate) *testbed {
	t.Helper()
	_ = netns.Teardown(context.Background(), prefix) // leftovers of a killed run
	sock := fmt.Sprintf("/tmp/linkem-test-%s.sock", prefix)
	c2s, s2c := emu.NewLink(emu.DefaultParams(), 1), emu.NewLink(emu.DefaultParams(), 2)
	ctl := emu.NewControl(c2s, s2c, emu.RealClock())
	require.NoError(t, ctl.Apply(flags))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	done := make(chan error, 1)
	go func() { done <- up(ctx, prefix, sock, ctl, emu.DefaultSpin, emu.DefaultMaxHeld) }()
	cl := emu.NewClient(sock)
	t.Cleanup(func() {
		cl.Close()
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Error("linkem up did not stop")
		}
		c, s := netns.Names(prefix)
		assert.False(t, netns.Exists(c), "namespace %s left behind", c)
		assert.False(t, netns.Exists(s), "namespace %s left behind", s)
		_, err := os.Stat(sock)
		assert.ErrorIs(t, err, os.ErrNotExist, "control socket left behind")
	})
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			require.NoError(t, err, "linkem up exited early")
			return false
		default:
		}
		_, err := cl.Stats(ctx)
		return err == nil
	}, 15*time.Second, 20*time.Millisecond)
	return &testbed{prefix: prefix, ctl: cl}
}

func (tb *testbed) ns() (client, server string) { return netns.Names(tb.prefix) }

func (tb *testbed) set(t *testing.T, u emu.ConfigUpdate) {
	t.Helper()
	_, err := tb.ctl.SetConfig(context.Background(), u)
	require.NoError(t, err)
}

// tcpPair returns a connected TCP pair: client side in the client
// namespace, server side in the server namespace.
func (tb *testbed) tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	cns, sns := tb.ns()
	var ln net.Listener
	require.NoError(t, netns.Do(sns, func() (err error) {
		ln, err = net.Listen("tcp", netns.ServerIP+":0")
		return err
	}))
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	var c net.Conn
	require.NoError(t, netns.Do(cns, func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err = d.Dial("tcp", ln.Addr().String())
		return err
	}))
	s, ok := <-accepted
	require.True(t, ok, "accept failed")
	t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

func medianDur(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// pingPong measures n round trips of size bytes over TCP.
func pingPong(t *testing.T, c, s *net.TCPConn, n, size int) []time.Duration {
	t.Helper()
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, size)
		for range n {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			if _, err := s.Write(buf); err != nil {
				return
			}
		}
	})
	defer wg.Wait()
	buf := make([]byte, size)
	rtts := make([]time.Duration, 0, n)
	require.NoError(t, c.SetDeadline(time.Now().Add(60*time.Second)))
	for range n {
		start := time.Now()
		_, err := c.Write(buf)
		require.NoError(t, err)
		_, err = io.ReadFull(c, buf)
		require.NoError(t, err)
		rtts = append(rtts, time.Since(start))
	}
	return rtts
}

// bulk sends client->server for d and returns the goodput in bit/s.
func bulk(t *testing.T, c, s *net.TCPConn, d time.Duration) float64 {
	t.Helper()
	var wg sync.WaitGroup
	var received int64
	var first, last time.Time
	wg.Go(func() {
		buf := make([]byte, 256<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 {
				if first.IsZero() {
					first = time.Now()
				}
				received += int64(n)
				last = time.Now()
			}
			if err != nil {
				return
			}
		}
	})
	buf := make([]byte, 256<<10)
	deadline := time.Now().Add(d)
	require.NoError(t, c.SetWriteDeadline(deadline))
	for time.Now().Before(deadline) {
		if _, err := c.Write(buf); err != nil {
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			break
		}
	}
	_ = c.CloseWrite()
	_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
	wg.Wait()
	return float64(received*8) / last.Sub(first).Seconds()
}

// udpBurst sends n datagrams client->server, spaced by gap, and counts arrivals.
func (tb *testbed) udpBurst(t *testing.T, n int, gap time.Duration) int {
	t.Helper()
	cns, sns := tb.ns()
	var srv, cli net.PacketConn
	require.NoError(t, netns.Do(sns, func() (err error) {
		srv, err = net.ListenPacket("udp", netns.ServerIP+":0")
		return err
	}))
	defer srv.Close()
	var conn net.Conn
	require.NoError(t, netns.Do(cns, func() (err error) {
		conn, err = net.Dial("udp", srv.LocalAddr().String())
		return err
	}))
	defer conn.Close()
	_ = cli
	got := make(chan int, 1)
	go func() {
		buf := make([]byte, 2048)
		k := 0
		for {
			_ = srv.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if _, _, err := srv.ReadFrom(buf); err != nil {
				got <- k
				return
			}
			k++
		}
	}()
	msg := make([]byte, 200)
	for i := range n {
		_, err := conn.Write(msg)
		require.NoError(t, err)
		if gap > 0 && i%10 == 9 {
			time.Sleep(gap * 10)
		}
	}
	return <-got
}

func TestIntegrationLinkEmulator(t *testing.T) {
	requireNetAdmin(t)
	prefix := "lt" + strconv.Itoa(os.Getpid()%100000)
	tb := startLinkem(t, prefix, emu.ConfigUpdate{Both: map[string]any{"delay": "12.5ms"}})

	t.Run("WANRTT", func(t *testing.T) {
		m := bestOf(t, func() time.Duration {
			c, s := tb.tcpPair(t)
			rtts := pingPong(t, c, s, 50, 1000)
			t.Logf("configured 12.5ms one-way: median TCP RTT %v (min %v)", medianDur(rtts), slicesMin(rtts))
			return medianDur(rtts)
		}, func(m time.Duration) bool { return m < 27*time.Millisecond })
		assert.GreaterOrEqual(t, m, 25*time.Millisecond)
		assert.Less(t, m, 27*time.Millisecond)
	})
	t.Run("LANRTT", func(t *testing.T) {
		tb.set(t, emu.ConfigUpdate{Both: map[string]any{"delay": "0.25ms"}})
		m := bestOf(t, func() time.Duration {
			c, s := tb.tcpPair(t)
			rtts := pingPong(t, c, s, 500, 1000)
			t.Logf("configured 0.25ms one-way: median TCP RTT %v (min %v)", medianDur(rtts), slicesMin(rtts))
			return medianDur(rtts)
		}, func(m time.Duration) bool { return m < 1500*time.Microsecond })
		assert.GreaterOrEqual(t, m, 500*time.Microsecond)
		assert.Less(t, m, 1500*time.Microsecond)
	})
	t.Run("UDPLoss", func(t *testing.T) {
		tb.set(t, emu.ConfigUpdate{Both: map[string]any{"delay": "1ms"}, C2S: map[string]any{"loss": 0.05}})
		t.Cleanup(func() { tb.set(t, emu.ConfigUpdate{Both: map[string]any{"loss": 0}}) })
		const n = 4000
		type losses struct{ emu, e2e float64 }
		// Other losses (host queues) must stay small: a busy CPU that
		// starves the receiver adds some, so the burst is retried.
		l := bestOf(t, func() losses {
			before, err := tb.ctl.Stats(t.Context())
			require.NoError(t, err)
			got := tb.udpBurst(t, n, 50*time.Microsecond)
			after, err := tb.ctl.Stats(t.Context())
			require.NoError(t, err)
			rx := after.C2S.RxPackets - before.C2S.RxPackets
			dropped := after.C2S.Dropped["loss"] - before.C2S.Dropped["loss"]
			l := losses{emu: float64(dropped) / float64(rx), e2e: float64(n-got) / n}
			t.Logf("configured 5%% loss c2s: emulator dropped %.2f%% of %d; end to end %.2f%% of %d UDP datagrams",
				l.emu*100, rx, l.e2e*100, n)
			return l
		}, func(l losses) bool { return l.e2e-l.emu < 0.01 })
		assert.InDelta(t, 0.05, l.emu, 0.015)
		assert.InDelta(t, l.emu, l.e2e, 0.01)
	})
	t.Run("RateLimit", func(t *testing.T) {
		tb.set(t, emu.ConfigUpdate{Both: map[string]any{"delay": "5ms", "rate": "20mbit"}})
		t.Cleanup(func() { tb.set(t, emu.ConfigUpdate{Both: map[string]any{"rate": "0"}}) })
		rate := bestOf(t, func() float64 {
			c, s := tb.tcpPair(t)
			rate := bulk(t, c, s, 3*time.Second)
			t.Logf("configured 20mbit: TCP goodput %.2f Mbit/s", rate/1e6)
			return rate
		}, func(r float64) bool { return r > 17e6 })
		// Goodput excludes IP/TCP headers (~3.5 % at MSS 1448).
		assert.Greater(t, rate, 17e6)
		assert.Less(t, rate, 20.5e6)
	})
	t.Run("Blackout", func(t *testing.T) {
		tb.set(t, emu.ConfigUpdate{Both: map[string]any{"delay": "1ms"}})
		require.NoError(t, tb.ctl.Blackout(t.Context(), 2*time.Second, "both"))
		assert.Equal(t, 0, tb.udpBurst(t, 20, time.Millisecond), "datagrams crossed a blackout")
		time.Sleep(1600 * time.Millisecond)
		assert.Equal(t, 20, tb.udpBurst(t, 20, time.Millisecond))
	})
	t.Run("Ceiling", func(t *testing.T) {
		tb.set(t, emu.ConfigUpdate{Both: map[string]any{"delay": "0", "rate": "0", "loss": 0}})
		c, s := tb.tcpPair(t)
		rate := bulk(t, c, s, 3*time.Second)
		st, err := tb.ctl.Stats(t.Context())
		require.NoError(t, err)
		t.Logf("emulator ceiling, no limits: TCP bulk %.0f Mbit/s; counters c2s %d pkts, s2c %d pkts, write errors %d/%d",
			rate/1e6, st.C2S.TxPackets, st.S2C.TxPackets, st.C2S.WriteErrors, st.S2C.WriteErrors)
		assert.Greater(t, rate, 50e6, "the emulator is far slower than expected")

		before, err := tb.ctl.Stats(t.Context())
		require.NoError(t, err)
		start := time.Now()
		tb.udpBurst(t, 100000, 0)
		after, err := tb.ctl.Stats(t.Context())
		require.NoError(t, err)
		elapsed := time.Since(start) - 500*time.Millisecond // udpBurst's idle wait
		pps := float64(after.C2S.TxPackets-before.C2S.TxPackets) / elapsed.Seconds()
		t.Logf("emulator ceiling, no limits: %.0f packets/s of 200 B UDP forwarded (%d offered to the TUN, %d forwarded)",
			pps, 100000, after.C2S.TxPackets-before.C2S.TxPackets)
	})
}

func TestTeardownIdempotent(t *testing.T) {
	requireNetAdmin(t)
	prefix := "ld" + strconv.Itoa(os.Getpid()%100000)
	ctx := t.Context()
	topo, err := netns.Setup(ctx, prefix)
	require.NoError(t, err)
	c, s := netns.Names(prefix)
	assert.True(t, netns.Exists(c))
	_, err = netns.Setup(ctx, prefix)
	require.Error(t, err, "a second setup must refuse existing namespaces")
	topo.Close()
	require.NoError(t, netns.Teardown(ctx, prefix))
	require.NoError(t, netns.Teardown(ctx, prefix))
	assert.False(t, netns.Exists(c))
	assert.False(t, netns.Exists(s))
	err = netns.Teardown(ctx, "Bad/Prefix")
	require.Error(t, err)
	assert.False(t, errors.Is(err, os.ErrNotExist))
}

// bestOf repeats a timing measurement up to three times until good accepts
// it, so a CPU shared with other test packages does not fail the accuracy
// checks; a broken emulator fails all three. It returns the last result.
func bestOf[T any](t *testing.T, measure func() T, good func(T) bool) T {
	t.Helper()
	var v T
	for attempt := range 3 {
		v = measure()
		if good(v) {
			return v
		}
		t.Logf("attempt %d out of tolerance; retrying (busy CPU?)", attempt+1)
	}
	return v
}

func slicesMin(d []time.Duration) time.Duration {
	m := d[0]
	for _, x := range d {
		m = min(m, x)
	}
	return m
}
