package emu

import (
	"context"
	"encoding/binary"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// seqpacketPair returns two connected packet-preserving files.
func seqpacketPair(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	a, b := os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return a, b
}

type fwdHarness struct {
	clientHost, serverHost *os.File // the hosts' ends
	c2s, s2c               *Link
	done                   chan error
	cancel                 context.CancelFunc
}

func startForwarder(t *testing.T, c2s, s2c Params) *fwdHarness {
	t.Helper()
	ch, cdev := seqpacketPair(t)
	sh, sdev := seqpacketPair(t)
	h := &fwdHarness{clientHost: ch, serverHost: sh, c2s: NewLink(c2s, 1), s2c: NewLink(s2c, 2), done: make(chan error, 1)}
	f := NewForwarder(cdev, sdev, h.c2s, h.s2c)
	ctx, cancel := context.WithCancel(t.Context())
	h.cancel = cancel
	go func() {
		h.done <- f.Run(ctx, func() { _ = cdev.Close(); _ = sdev.Close() })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-h.done:
			assert.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Error("forwarder did not stop")
		}
	})
	return h
}

func stamp(seq uint32, size int) []byte {
	b := make([]byte, size)
	binary.BigEndian.PutUint32(b, seq)
	binary.BigEndian.PutUint64(b[4:], uint64(time.Now().UnixNano()))
	return b
}

// receive reads stamped packets until timeout passes without one.
func receive(t *testing.T, f *os.File, idle time.Duration) (seqs []uint32, delays []time.Duration) {
	t.Helper()
	buf := make([]byte, MaxPacket)
	for {
		require.NoError(t, f.SetReadDeadline(time.Now().Add(idle)))
		n, err := f.Read(buf)
		if err != nil {
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			return seqs, delays
		}
		require.GreaterOrEqual(t, n, 12)
		seqs = append(seqs, binary.BigEndian.Uint32(buf))
		delays = append(delays, time.Duration(time.Now().UnixNano()-int64(binary.BigEndian.Uint64(buf[4:]))))
	}
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func TestForwarderDelayAccuracy(t *testing.T) {
	// Up to three attempts: a CPU shared with other test packages can delay
	// a whole attempt; a broken forwarder fails all three.
	var m, mBack time.Duration
	for attempt := range 3 {
		m, mBack = measureDelays(t)
		t.Logf("attempt %d: c2s 5ms: median %v; s2c 250us: median %v", attempt+1, m, mBack)
		if m < 5*time.Millisecond+700*time.Microsecond && mBack < 950*time.Microsecond {
			break
		}
	}
	// Never early; late by well under a timer slack (spinning).
	assert.GreaterOrEqual(t, m, 5*time.Millisecond)
	assert.Less(t, m, 5*time.Millisecond+700*time.Microsecond)
	assert.GreaterOrEqual(t, mBack, 250*time.Microsecond)
	assert.Less(t, mBack, 950*time.Microsecond)
}

func measureDelays(t *testing.T) (c2s, s2c time.Duration) {
	t.Helper()
	h := startForwarder(t, Params{Delay: 5 * time.Millisecond}, Params{Delay: 250 * time.Microsecond})
	const n = 100
	go func() {
		for i := range n {
			_, _ = h.clientHost.Write(stamp(uint32(i), 200))
			_, _ = h.serverHost.Write(stamp(uint32(i), 200))
			time.Sleep(2 * time.Millisecond)
		}
	}()
	type res struct {
		seqs   []uint32
		delays []time.Duration
	}
	sc := make(chan res, 1)
	go func() {
		s, d := receive(t, h.clientHost, time.Second)
		sc <- res{s, d}
	}()
	seqs, delays := receive(t, h.serverHost, time.Second)
	back := <-sc
	require.Len(t, seqs, n)
	require.Len(t, back.seqs, n)
	for i := range seqs {
		assert.Equal(t, uint32(i), seqs[i], "order c2s")
		assert.Equal(t, uint32(i), back.seqs[i], "order s2c")
	}
	return median(delays), median(back.delays)
}

func TestForwarderLossAndBlackout(t *testing.T) {
	h := startForwarder(t, Params{Loss: 0.2}, Params{})
	const n = 2000
	for i := range n {
		_, err := h.clientHost.Write(stamp(uint32(i), 100))
		require.NoError(t, err)
		if i%100 == 0 {
			time.Sleep(time.Millisecond) // let the forwarder drain the socket buffer
		}
	}
	seqs, _ := receive(t, h.serverHost, 300*time.Millisecond)
	got := float64(n-len(seqs)) / n
	assert.InDelta(t, 0.2, got, 0.05)
	s := h.c2s.Stats(time.Now())
	assert.Equal(t, uint64(n), s.RxPackets)
	assert.Equal(t, uint64(len(seqs)), s.TxPackets)
	assert.Equal(t, uint64(n-len(seqs)), s.Dropped["loss"])

	// Blackout in s2c: nothing passes while it lasts, then traffic resumes.
	h.s2c.Blackout(time.Now(), 200*time.Millisecond)
	for i := range 10 {
		_, err := h.serverHost.Write(stamp(uint32(i), 100))
		require.NoError(t, err)
	}
	seqs, _ = receive(t, h.clientHost, 100*time.Millisecond)
	assert.Empty(t, seqs)
	time.Sleep(150 * time.Millisecond)
	_, err := h.serverHost.Write(stamp(99, 100))
	require.NoError(t, err)
	seqs, _ = receive(t, h.clientHost, 200*time.Millisecond)
	assert.Equal(t, []uint32{99}, seqs)
	assert.Equal(t, uint64(10), h.s2c.Stats(time.Now()).Dropped["blackout"])
}

func TestForwarderBlackoutDropsInFlight(t *testing.T) {
	h := startForwarder(t, Params{Delay: 50 * time.Millisecond}, Params{})
	for i := range 5 {
		_, err := h.clientHost.Write(stamp(uint32(i), 100))
		require.NoError(t, err)
	}
	time.Sleep(10 * time.Millisecond)
	h.c2s.Blackout(time.Now(), 100*time.Millisecond)
	seqs, _ := receive(t, h.serverHost, 200*time.Millisecond)
	assert.Empty(t, seqs)
	assert.Equal(t, uint64(5), h.c2s.Stats(time.Now()).Dropped["blackout"])
}

func TestForwarderRateLimit(t *testing.T) {
	var rate float64
	for attempt := range 3 {
		rate = measureRate(t)
		t.Logf("attempt %d: 8mbit: measured %.2f Mbit/s", attempt+1, rate/1e6)
		if rate > 7.2e6 {
			break // only a busy CPU makes it slower; faster is a bug
		}
	}
	assert.InEpsilon(t, 8e6, rate, 0.1)
}

// measureRate offers 400 KB at 8 Mbit/s (1 MB/s) as fast as the socket
// takes it and returns the delivered rate.
func measureRate(t *testing.T) float64 {
	t.Helper()
	h := startForwarder(t, Params{RateBits: 8e6, QueueBytes: 1 << 20}, Params{})
	const n, size = 400, 1000
	go func() {
		for i := range n {
			_, _ = h.clientHost.Write(stamp(uint32(i), size))
		}
	}()
	start := time.Now()
	seqs, _ := receive(t, h.serverHost, 200*time.Millisecond)
	require.Len(t, seqs, n)
	elapsed := time.Since(start) - 200*time.Millisecond
	return float64(n*size*8) / elapsed.Seconds()
}

// TestDelayLineLateness checks the lateness popDue reports and the Stats
// counters it feeds.
func TestDelayLineLateness(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	dl := newDelayLine()
	for i, ms := range []int{0, 1, 2, 10} {
		dl.push(heldPacket{deliver: t0.Add(time.Duration(ms) * time.Millisecond), data: []byte{byte(i)}})
	}
	out, next, ok, sum, late := dl.popDue(t0.Add(2500*time.Microsecond), nil)
	assert.Equal(t, [][]byte{{0}, {1}, {2}}, out)
	assert.True(t, ok)
	assert.Equal(t, t0.Add(10*time.Millisecond), next)
	assert.Equal(t, 2500*time.Microsecond+1500*time.Microsecond+500*time.Microsecond, sum)
	assert.Equal(t, 2, late, "2.5 ms and 1.5 ms late; 0.5 ms is not")
	out, _, ok, sum, late = dl.popDue(t0.Add(10*time.Millisecond), out[:0])
	assert.Len(t, out, 1)
	assert.False(t, ok)
	assert.Zero(t, sum)
	assert.Zero(t, late)

	l := NewLink(DefaultParams(), 1)
	l.countLate(4*time.Millisecond, 2)
	l.countLate(0, 0)
	st := l.Stats(t0)
	assert.Equal(t, uint64(2), st.LatePackets)
	assert.Equal(t, uint64(4*time.Millisecond), st.LatenessNS)
}
