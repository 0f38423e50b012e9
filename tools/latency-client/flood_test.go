package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// udpListener opens a UDP socket on loopback with a large receive buffer,
// closed when the test ends.
func udpListener(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	_ = c.SetReadBuffer(4 << 20)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

type received struct {
	pkts [][]byte
	from []string
	err  error
}

// drain reads datagrams from c until idle has passed without one, and
// returns them with their sources.
func drain(c *net.UDPConn, idle time.Duration) received {
	var r received
	buf := make([]byte, 64<<10)
	for {
		_ = c.SetReadDeadline(time.Now().Add(idle))
		n, addr, err := c.ReadFromUDP(buf)
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				r.err = err
			}
			return r
		}
		r.pkts = append(r.pkts, bytes.Clone(buf[:n]))
		r.from = append(r.from, addr.String())
	}
}

// drainAsync reads like drain, concurrently with the sender, so large
// datagrams do not overflow the receive buffer.
func drainAsync(c *net.UDPConn, idle time.Duration) <-chan received {
	ch := make(chan received, 1)
	go func() { ch <- drain(c, idle) }()
	return ch
}

func floodTo(c *net.UDPConn, kind floodKind, size int64) *floodOptions {
	o := newFloodOptions()
	o.target = c.LocalAddr().String()
	o.kind = kind
	o.size = byteSize(size)
	return o
}

// TestFloodCountsAndTargets sends a counted, paced flood of each kind and
// checks that exactly those datagrams reach the target, with the kind's
// shape and fresh connection IDs, and that nothing reaches a bystander.
func TestFloodCountsAndTargets(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind floodKind
		size int64
	}{{kindRandom, 100}, {kindRandom, 1}, {kindInitial, 1200}, {kindInitial, 20000}, {kindShortHeader, 42}, {kindShortHeader, 1200}} {
		t.Run(string(tc.kind)+"/"+formatByteSize(tc.size), func(t *testing.T) {
			t.Parallel()
			target, bystander := udpListener(t), udpListener(t)
			got, stray := drainAsync(target, 500*time.Millisecond), drainAsync(bystander, 500*time.Millisecond)
			o := floodTo(target, tc.kind, tc.size)
			o.count = 300
			o.rate = 3000 // slow enough that loopback drops nothing
			require.NoError(t, o.validate())
			r, err := runFlood(testCtx(t), o)
			require.NoError(t, err)
			assert.Equal(t, "count", r.Stopped)
			assert.Equal(t, int64(300), r.Packets)
			assert.Equal(t, 300*tc.size, r.Bytes)
			assert.Zero(t, r.SendErrors)
			assert.InDelta(t, float64(r.Packets)/r.Seconds, r.PPS, 1e-6*r.PPS)

			rcv := <-got
			require.NoError(t, rcv.err)
			pkts, from := rcv.pkts, rcv.from
			require.Len(t, pkts, 300)
			dcids := map[string]bool{}
			for i, p := range pkts {
				assert.Equal(t, r.Local, from[i])
				require.Len(t, p, int(tc.size))
				switch tc.kind {
				case kindInitial:
					assert.Equal(t, byte(0xc0), p[0]&0xf0, "long header, fixed bit, type Initial")
					assert.Equal(t, uint32(quicVersion1), binary.BigEndian.Uint32(p[1:5]))
					dl := int(p[5])
					require.True(t, dl >= 8 && dl <= 20, "DCID length %d", dl)
					dcids[string(p[6:6+dl])] = true
					i := 6 + dl
					assert.Equal(t, byte(8), p[i], "SCID length")
					i += 9
					assert.Equal(t, byte(0), p[i], "token length")
					i++
					var length int
					if p[i]>>6 == 1 {
						length = int(binary.BigEndian.Uint16(p[i:]) & 0x3fff)
						i += 2
					} else {
						require.Equal(t, byte(2), p[i]>>6)
						length = int(binary.BigEndian.Uint32(p[i:]) & 0x3fffffff)
						i += 4
					}
					assert.Equal(t, len(p)-i, length, "the Length field covers the rest of the datagram")
				case kindShortHeader:
					assert.Equal(t, byte(0x40), p[0]&0xc0, "short header, fixed bit")
					dcids[string(p[1:9])] = true
				case kindRandom:
					dcids[string(p[:min(len(p), 8)])] = true
				}
			}
			if tc.size >= 8 {
				assert.Len(t, dcids, 300, "every datagram has its own connection ID or leading bytes")
			}
			other := <-stray
			require.NoError(t, other.err)
			assert.Empty(t, other.pkts, "a socket that was not the target received datagrams")
		})
	}
}

// TestFloodStopsOnTime checks the duration cap of an unpaced flood.
func TestFloodStopsOnTime(t *testing.T) {
	t.Parallel()
	target := udpListener(t) // not read: the kernel drops what overflows
	o := floodTo(target, kindRandom, 1200)
	o.duration = 300 * time.Millisecond
	start := time.Now()
	r, err := runFlood(testCtx(t), o)
	took := time.Since(start)
	require.NoError(t, err)
	assert.Equal(t, "duration", r.Stopped)
	assert.InDelta(t, 0.3, r.Seconds, 0.1, "sending time")
	assert.Less(t, took, 2*time.Second, "runFlood returned late")
	assert.Positive(t, r.Packets)
	assert.Equal(t, r.Packets*1200, r.Bytes)
	assert.InDelta(t, float64(r.Packets)/r.Seconds, r.PPS, 1e-6*r.PPS)
	assert.InDelta(t, float64(r.Bytes)*8/r.Seconds/1e6, r.MbitPerS, 1e-6*r.MbitPerS)
}

// TestFloodRate checks the pacing.
func TestFloodRate(t *testing.T) {
	t.Parallel()
	target := udpListener(t)
	o := floodTo(target, kindShortHeader, 100)
	o.rate = 2000
	o.duration = 500 * time.Millisecond
	got := drainAsync(target, 300*time.Millisecond)
	r, err := runFlood(testCtx(t), o)
	require.NoError(t, err)
	assert.InDelta(t, 1000, r.Packets, 150)
	rcv := <-got
	require.NoError(t, rcv.err)
	assert.Len(t, rcv.pkts, int(r.Packets))
}

// TestFloodStopsOnCancel checks that a cancelled context (SIGINT/SIGTERM in
// the command) ends a long flood promptly, paced or not.
func TestFloodStopsOnCancel(t *testing.T) {
	t.Parallel()
	for _, rate := range []int{0, 10} {
		target := udpListener(t)
		o := floodTo(target, kindRandom, 200)
		o.duration = time.Minute
		o.rate = rate
		ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
		start := time.Now()
		r, err := runFlood(ctx, o)
		cancel()
		require.NoError(t, err)
		assert.Equal(t, "signal", r.Stopped, "rate %d", rate)
		assert.Less(t, time.Since(start), 3*time.Second, "rate %d", rate)
		assert.Positive(t, r.Packets)
	}
}

// TestFloodQUICPaths points quic-initial and short-header floods at a real
// quic-go server and checks that they reach the paths they are meant for:
// Initials are parsed and answered with Retry packets, short-header packets
// with stateless resets.
func TestFloodQUICPaths(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind  floodKind
		reply func(p []byte) bool
	}{
		{kindInitial, func(p []byte) bool { return p[0]&0xf0 == 0xf0 }},     // long header, type Retry
		{kindShortHeader, func(p []byte) bool { return p[0]&0xc0 == 0x40 }}, // a stateless reset looks like a short header
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			t.Parallel()
			pc := udpListener(t)
			key := quic.StatelessResetKey{1, 2, 3}
			tr := &quic.Transport{Conn: pc, StatelessResetKey: &key, VerifySourceAddress: func(net.Addr) bool { return true }}
			ln, err := tr.Listen(&tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{"flood-test"}}, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = ln.Close(); _ = tr.Close() })

			o := floodTo(pc, tc.kind, 1200)
			o.count, o.rate = 50, 1000
			r, err := runFlood(testCtx(t), o)
			require.NoError(t, err)
			assert.Equal(t, int64(50), r.Packets)
			assert.Positive(t, r.ReplyPackets, "the server answered none of the datagrams")

			// The counted replies are the kind expected: capture a few more.
			c, err := net.DialUDP("udp", nil, pc.LocalAddr().(*net.UDPAddr))
			require.NoError(t, err)
			defer c.Close()
			fill := newPacketFiller(tc.kind, [32]byte{9})
			p := make([]byte, 1200)
			fill.build(p)
			_, err = c.Write(p)
			require.NoError(t, err)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 2048)
			n, err := c.Read(buf)
			require.NoError(t, err)
			assert.True(t, tc.reply(buf[:n]), "unexpected reply % x", buf[:min(n, 8)])
		})
	}
}

func TestFloodValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mod  func(o *floodOptions)
		want string // "" = valid
	}{
		{"defaults with a target", func(*floodOptions) {}, ""},
		{"no target", func(o *floodOptions) { o.target = "" }, "--target is required"},
		{"target without port", func(o *floodOptions) { o.target = "127.0.0.1" }, "HOST:PORT"},
		{"target port 0", func(o *floodOptions) { o.target = "127.0.0.1:0" }, "port must be in"},
		{"zero duration", func(o *floodOptions) { o.duration = 0 }, "--duration"},
		{"duration over the cap", func(o *floodOptions) { o.duration = maxFloodDuration + time.Second }, "--duration"},
		{"duration at the cap", func(o *floodOptions) { o.duration = maxFloodDuration }, ""},
		{"negative rate", func(o *floodOptions) { o.rate = -1 }, "--rate"},
		{"negative count", func(o *floodOptions) { o.count = -1 }, "--count"},
		{"bad bind", func(o *floodOptions) { o.bind = "host" }, "--bind"},
		{"small initial", func(o *floodOptions) { o.kind, o.size = kindInitial, 1199 }, "1200..65507"},
		{"small short header", func(o *floodOptions) { o.kind, o.size = kindShortHeader, 41 }, "42..65507"},
		{"zero size", func(o *floodOptions) { o.size = 0 }, "1..65507"},
		{"huge size", func(o *floodOptions) { o.size = 65508 }, "1..65507"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := newFloodOptions()
			o.target = "127.0.0.1:7500"
			tc.mod(o)
			err := o.validate()
			if tc.want == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tc.want)
			}
		})
	}
	var k floodKind
	assert.Error(t, k.Set("syn"))
	assert.NoError(t, k.Set("short-header"))
}

// TestFloodCommand runs the subcommand as a user would.
func TestFloodCommand(t *testing.T) {
	t.Parallel()
	target := udpListener(t)
	var stdout, stderr bytes.Buffer
	code := execute(testCtx(t), []string{"flood", "--target", target.LocalAddr().String(), "--count", "20", "--rate", "1000",
		"--kind", "quic-initial", "--json"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	var r FloodReport
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &r))
	assert.Equal(t, int64(20), r.Packets)
	assert.Equal(t, "quic-initial", r.Kind)
	assert.Equal(t, 1200, r.Size)

	stdout.Reset()
	code = execute(testCtx(t), []string{"flood", "--target", target.LocalAddr().String(), "--count", "5"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	assert.Contains(t, stdout.String(), "Sent: 5 datagrams")

	stderr.Reset()
	code = execute(testCtx(t), []string{"flood", "--duration", "1h", "--target", target.LocalAddr().String()}, &stdout, &stderr)
	assert.Equal(t, 2, code)
	assert.True(t, strings.Contains(stderr.String(), "--duration"), stderr.String())
	code = execute(testCtx(t), []string{"flood"}, &stdout, &stderr)
	assert.Equal(t, 2, code)
}
