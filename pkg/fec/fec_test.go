package fec

import (
	"bytes"
	"crypto/rand"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dropConn drops outgoing datagrams for which drop returns true.
type dropConn struct {
	net.PacketConn
	n    atomic.Int64
	drop func(n int64, b []byte) bool
}

func (d *dropConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if d.drop(d.n.Add(1), b) {
		return len(b), nil
	}
	return d.PacketConn.WriteTo(b, addr)
}

func udp(t *testing.T) net.PacketConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	require.NoError(t, c.SetReadBuffer(4<<20))
	return c
}

// transfer sends count datagrams from a to b and returns what b received within the deadline.
func transfer(t *testing.T, a, b net.PacketConn, count int, gap time.Duration) (sent, got [][]byte) {
	t.Helper()
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			_ = b.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, _, err := b.ReadFrom(buf)
			if err != nil {
				return
			}
			mu.Lock()
			got = append(got, append([]byte(nil), buf[:n]...))
			mu.Unlock()
		}
	}()
	for i := range count {
		p := make([]byte, 100+i%1200)
		_, _ = rand.Read(p)
		p[0] = 0x40 | p[0]&0x3f // looks like a QUIC short-header packet
		sent = append(sent, p)
		_, err := a.WriteTo(p, b.LocalAddr())
		require.NoError(t, err)
		if gap > 0 && i%10 == 9 {
			time.Sleep(gap)
		}
	}
	<-done
	return sent, got
}

func TestRecoversLostDatagrams(t *testing.T) {
	t.Parallel()
	// Drop every 7th data frame: no group of 10 loses more than 2, and 3 parity recover them.
	raw := &dropConn{PacketConn: udp(t), drop: func(n int64, b []byte) bool { return b[0] == kindData && n%7 == 0 }}
	cfg := DefaultConfig()
	cfg.EncodeAll = true
	a, err := New(raw, cfg)
	require.NoError(t, err)
	b, err := New(udp(t), DefaultConfig())
	require.NoError(t, err)
	defer func() { _ = a.Close(); _ = b.Close() }()
	sent, got := transfer(t, a, b, 1000, time.Millisecond)
	require.Len(t, got, len(sent), "every datagram must arrive, directly or rebuilt")
	set := map[string]int{}
	for _, s := range sent {
		set[string(s)]++
	}
	for _, g := range got {
		require.Positive(t, set[string(g)], "received a datagram that was never sent")
		set[string(g)]--
	}
	assert.Positive(t, b.Stats().Recovered.Load())
	assert.Equal(t, uint64(len(sent)), a.Stats().DataSent.Load())
	assert.Zero(t, b.Stats().Malformed.Load())
	t.Logf("sent %d data + %d parity; recovered %d", a.Stats().DataSent.Load(), a.Stats().ParitySent.Load(), b.Stats().Recovered.Load())
}

func TestPartialGroupFlushes(t *testing.T) {
	t.Parallel()
	// A lone datagram (interactive traffic) is protected by its own parity after FlushDelay.
	raw := &dropConn{PacketConn: udp(t), drop: func(_ int64, b []byte) bool { return b[0] == kindData }}
	cfg := DefaultConfig()
	cfg.EncodeAll = true
	a, err := New(raw, cfg)
	require.NoError(t, err)
	b, err := New(udp(t), DefaultConfig())
	require.NoError(t, err)
	defer func() { _ = a.Close(); _ = b.Close() }()
	sent, got := transfer(t, a, b, 1, 0)
	require.Len(t, got, 1)
	assert.Equal(t, sent[0], got[0])
}

func TestPlainPacketsPassThroughAndServerAnswersInKind(t *testing.T) {
	t.Parallel()
	srv, err := New(udp(t), DefaultConfig()) // server: encodes only toward FEC peers
	require.NoError(t, err)
	plain := udp(t)
	defer func() { _ = srv.Close(); _ = plain.Close() }()
	p := []byte{0x41, 1, 2, 3}
	_, err = plain.WriteTo(p, srv.LocalAddr())
	require.NoError(t, err)
	buf := make([]byte, 100)
	_ = srv.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, addr, err := srv.ReadFrom(buf)
	require.NoError(t, err)
	assert.Equal(t, p, buf[:n])
	_, err = srv.WriteTo([]byte{0x42, 9}, addr) // plain peer: plain answer
	require.NoError(t, err)
	_ = plain.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, _, err = plain.ReadFrom(buf)
	require.NoError(t, err)
	assert.Equal(t, []byte{0x42, 9}, buf[:n])
}

func TestMalformedFramesDropped(t *testing.T) {
	t.Parallel()
	b, err := New(udp(t), DefaultConfig())
	require.NoError(t, err)
	a := udp(t)
	defer func() { _ = a.Close(); _ = b.Close() }()
	for _, f := range [][]byte{
		{kindData},                                         // short
		{0x20, 0, 0, 0, 0, 0, 0, 0},                        // unknown kind
		{kindParity, 0, 0, 0, 0, 0, 0, 0, 1, 2},            // k=0
		{kindParity, 5, 3, 1, 0, 0, 0, 1, 1, 2},            // index outside the group
		bytes.Repeat([]byte{kindParity, 200, 100, 100}, 3), // k+m too large
	} {
		_, err := a.WriteTo(f, b.LocalAddr())
		require.NoError(t, err)
	}
	_, err = a.WriteTo([]byte{0x40, 7}, b.LocalAddr())
	require.NoError(t, err)
	buf := make([]byte, 100)
	_ = b.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, _, err := b.ReadFrom(buf)
	require.NoError(t, err, "malformed frames are skipped, the next valid packet is returned")
	assert.Equal(t, []byte{0x40, 7}, buf[:n])
	assert.Equal(t, uint64(5), b.Stats().Malformed.Load())
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, c := range []Config{{DataShards: 0, ParityShards: 1}, {DataShards: 10, ParityShards: 0}, {DataShards: 3, ParityShards: 4}, {DataShards: 65, ParityShards: 1}} {
		_, err := New(nil, c)
		require.ErrorIs(t, err, ErrConfig)
	}
}

func FuzzReceive(f *testing.F) {
	f.Add([]byte{kindData, 0, 0, 0, 0, 0, 0, 1, 0x40})
	f.Add([]byte{kindParity, 1, 1, 1, 0, 0, 0, 1, 0, 3, 0x40, 1, 2})
	f.Fuzz(func(t *testing.T, in []byte) {
		c, _ := New(nil, DefaultConfig())
		addr := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
		for len(in) >= headerLen {
			n := min(len(in), 64)
			frame := in[:n]
			in = in[n:]
			if frame[0] != kindData && frame[0] != kindParity {
				continue
			}
			_, _ = c.receive(frame, addr)
		}
	})
}

func TestParseSpec(t *testing.T) {
	t.Parallel()
	c, err := ParseSpec("10/3")
	require.NoError(t, err)
	assert.Equal(t, 10, c.DataShards)
	assert.Equal(t, 3, c.ParityShards)
	for _, bad := range []string{"", "10", "10/", "a/b", "10/3x", "3/4", "0/1", " 10/3"} {
		_, err := ParseSpec(bad)
		require.ErrorIs(t, err, ErrConfig, bad)
	}
}

// TestLayerAggregatesStats: Conns of one Layer (a client's first socket and
// those of path rescue) count into the same Stats.
func TestLayerAggregatesStats(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.EncodeAll = true
	l, err := NewLayer(cfg)
	require.NoError(t, err)
	first, rescue := l.Wrap(udp(t)), l.Wrap(udp(t))
	recv, err := New(udp(t), DefaultConfig())
	require.NoError(t, err)
	defer func() { _ = first.Close(); _ = rescue.Close(); _ = recv.Close() }()
	sent1, _ := transfer(t, first, recv, 20, 0)
	sent2, _ := transfer(t, rescue, recv, 30, 0)
	assert.Same(t, l.Stats(), first.Stats())
	assert.Same(t, l.Stats(), rescue.Stats())
	assert.Equal(t, uint64(len(sent1)+len(sent2)), l.Stats().DataSent.Load())
	assert.Equal(t, uint64(len(sent1)+len(sent2)), recv.Stats().DataReceived.Load())
	_, err = NewLayer(Config{DataShards: 0, ParityShards: 1})
	require.ErrorIs(t, err, ErrConfig)
}
