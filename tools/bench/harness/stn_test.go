package harness

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/crc32"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/tools/linkem/emu"
)

func TestLinkUpdatePerDirection(t *testing.T) {
	t.Parallel()
	ctl := emu.NewControl(emu.NewLink(emu.DefaultParams(), 1), emu.NewLink(emu.DefaultParams(), 2), emu.RealClock())
	// A previous link's loss and jitter must not survive.
	require.NoError(t, ctl.Apply(linkUpdate(LinkSpec{Name: "old", Params: map[string]string{"loss": "0.3", "jitter": "5ms"}})))
	require.NoError(t, ctl.Apply(linkUpdate(linkEdge())))
	up, down := ctl.Links[emu.C2S].Params(), ctl.Links[emu.S2C].Params()
	assert.Equal(t, 440*time.Millisecond, up.Delay, "Edge uplink delay")
	assert.Equal(t, 400*time.Millisecond, down.Delay, "Edge downlink delay")
	assert.Equal(t, int64(200_000), up.RateBits)
	assert.Equal(t, int64(240_000), down.RateBits)
	for _, p := range []emu.Params{up, down} {
		assert.Zero(t, p.Loss)
		assert.Zero(t, p.Jitter)
	}

	require.NoError(t, ctl.Apply(linkUpdate(link3G())))
	up, down = ctl.Links[emu.C2S].Params(), ctl.Links[emu.S2C].Params()
	assert.Equal(t, int64(330_000), up.RateBits)
	assert.Equal(t, int64(780_000), down.RateBits)
	assert.Equal(t, 100*time.Millisecond, up.Delay)
	assert.Equal(t, 100*time.Millisecond, down.Delay)

	// Per direction wins over both, whatever the map order.
	u := linkUpdate(LinkSpec{Params: map[string]string{"delay": "10ms", "s2c-delay": "30ms", "loss": "0.5"}})
	assert.Equal(t, "10ms", u.Both["delay"])
	assert.Equal(t, map[string]any{"delay": "30ms"}, u.S2C)
	assert.Nil(t, u.C2S)
	require.NoError(t, ctl.Apply(u))
	assert.Equal(t, 10*time.Millisecond, ctl.Links[emu.C2S].Params().Delay)
	assert.Equal(t, 30*time.Millisecond, ctl.Links[emu.S2C].Params().Delay)
	assert.InDelta(t, 0.5, ctl.Links[emu.S2C].Params().Loss, 1e-12)

	require.Error(t, ctl.Apply(linkUpdate(LinkSpec{Params: map[string]string{"c2s-rate": "fast"}})), "invalid values are refused")
}

func TestSTNProfile(t *testing.T) {
	t.Parallel()
	p, err := Profiles("stn")
	require.NoError(t, err)
	assert.Equal(t, []string{"direct", "quictun"}, p.Variants)
	names := map[string]int{}
	for _, l := range p.STNLinks {
		names[l.Link.Name] = cmp.Or(l.Number, p.STNNumber)
	}
	assert.Equal(t, map[string]int{"RTT100 loss 30%": 40, "RTT100 loss 50%": 10, "3G 780/330kbit 100/100ms": 40, "Edge 240/200kbit 400/440ms": 40}, names)
	assert.Equal(t, "50ms", p.STNLinks[0].Link.Params["delay"], "RTT 100 ms")
	txs, err := stnShapes(p.STNRequestSizes, p.STNResponseSizes)
	require.NoError(t, err)
	assert.Equal(t, []shortTx{{Up: 64 << 10}, {Up: 128 << 10}, {Down: 64 << 10}, {Down: 192 << 10}}, txs)
	assert.Len(t, p.STNBlackouts, 7)
	assert.Equal(t, 35*time.Second, p.STNBlackouts[6])
	for _, sc := range p.Scenarios {
		assert.Contains(t, AllScenarios(), sc)
	}

	_, err = stnShapes([]string{"1KiB"}, []string{"lots"})
	require.ErrorContains(t, err, "response size")
	_, err = stnShapes([]string{"-1"}, nil)
	require.ErrorContains(t, err, "request size")
	assert.Equal(t, "request 64KiB", shortTx{Up: 64 << 10}.String())
	assert.Equal(t, "response 1000 B", shortTx{Down: 1000}.String())
	assert.Equal(t, "response 2MiB", shortTx{Down: 2 << 20}.String())
}

func TestShortStats(t *testing.T) {
	t.Parallel()
	var done []time.Duration
	for i := 10; i >= 1; i-- { // unsorted on purpose
		done = append(done, time.Duration(i)*100*time.Millisecond)
	}
	m := shortStats(done, 2, 20*time.Second)
	assert.Equal(t, map[string]float64{
		"connections": 12, "ok": 10, "failures": 2, "total_s": 20,
		"mean_s": 0.55, "p50_s": 0.5, "p90_s": 0.9, "max_s": 1,
	}, m)
	assert.Equal(t, 1000*time.Millisecond, done[0], "input not reordered")

	none := shortStats(nil, 3, 90*time.Second)
	assert.Equal(t, map[string]float64{"connections": 3, "ok": 0, "failures": 3, "total_s": 90}, none, "no latency figures without a completed connection")

	one := []time.Duration{time.Second}
	assert.Equal(t, time.Second, nearestRank(one, 0.5))
	assert.Equal(t, time.Second, nearestRank(one, 0.9))

	var raw shortRaw
	raw.add(1500*time.Microsecond, nil)
	raw.add(time.Minute, errors.New("not done within 1m0s"))
	for i := range 20 {
		raw.add(time.Second, errors.New("boom "+strconv.Itoa(i%10)))
	}
	assert.Equal(t, []float64{1.5, 60000}, raw.PerConnectionMS[:2])
	assert.Len(t, raw.Failed, 21)
	assert.Equal(t, 1, raw.Failed[0])
	assert.Len(t, raw.Errors, maxShortErrors, "distinct messages are bounded")
	assert.Equal(t, 2, raw.Errors["boom 0"])
}

func TestEmuLoss(t *testing.T) {
	t.Parallel()
	a := usageSnap{At: time.Unix(0, 0), Drops: map[string]uint64{"loss": 10, "queue": 1}, TxPackets: 100, TUNDrops: 2}
	b := usageSnap{At: time.Unix(10, 0), Drops: map[string]uint64{"loss": 40, "ge": 10, "queue": 3, "blackout": 5}, TxPackets: 150, WriteErrors: 0, TUNDrops: 3}
	m := emuLoss(a, b)
	// received: 50 delivered + 30 + 10 loss + 2 queue + 5 blackout = 97; random loss 40.
	assert.InDelta(t, 40.0/97*100, m["emu_loss_pct"], 1e-9)
	assert.InDelta(t, 2, m["emu_queue_drops"], 1e-9)
	assert.InDelta(t, 1, m["emu_tun_drops"], 1e-9)
	assert.NotContains(t, emuLoss(a, a), "emu_loss_pct", "nothing received")
}

func TestBlackoutOutcome(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 23, 22, 0, 0, 0, time.UTC)
	end := t0.Add(15 * time.Second)
	m := blackoutOutcome(t0, end, 15300*time.Millisecond, nil)
	assert.Equal(t, 1.0, m["ok"])
	assert.InDelta(t, 0.3, m["done_after_s"], 1e-9)
	assert.InDelta(t, 15.3, m["took_s"], 1e-9)
	assert.Zero(t, blackoutOutcome(t0, end, 14*time.Second, nil)["done_after_s"], "never negative")
	failed := blackoutOutcome(t0, end, time.Minute, errors.New("not done within 1m0s"))
	assert.Zero(t, failed["ok"])
	assert.NotContains(t, failed, "done_after_s")
	assert.InDelta(t, 60, failed["took_s"], 1e-9)
}

// fakeShortSink serves the sink protocol on localhost for one connection:
// uploads are answered with count and CRC-32C, downloads with count bytes;
// corrupt flips the last byte of a download.
func fakeShortSink(t *testing.T, corrupt bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		req := make([]byte, 16)
		if _, err := io.ReadFull(c, req); err != nil {
			return
		}
		h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
		tr := make([]byte, 12)
		count := binary.BigEndian.Uint64(req[8:])
		if req[5] == 'U' {
			n, _ := io.Copy(h, c)
			binary.BigEndian.PutUint64(tr, uint64(n))
		} else {
			for left := int64(count); left > 0; {
				b := make([]byte, min(left, 1000))
				for i := range b {
					b[i] = byte(left + int64(i))
				}
				_, _ = h.Write(b)
				if corrupt && left == int64(len(b)) {
					b[len(b)-1] ^= 1
				}
				var hdr [4]byte
				binary.BigEndian.PutUint32(hdr[:], uint32(len(b)))
				_, _ = c.Write(append(hdr[:], b...))
				left -= int64(len(b))
			}
			_, _ = c.Write([]byte{0, 0, 0, 0})
			binary.BigEndian.PutUint64(tr, count)
		}
		binary.BigEndian.PutUint32(tr[8:], h.Sum32())
		_, _ = c.Write(tr)
	})
	return ln.Addr().String()
}

func TestSinkUploadDownload(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		tx      shortTx
		corrupt bool
		err     string
	}{
		{"upload", shortTx{Up: 200_000}, false, ""},
		{"download", shortTx{Down: 2500}, false, ""},
		{"corrupted download", shortTx{Down: 2500}, true, "CRC-32C mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := net.Dial("tcp", fakeShortSink(t, tc.corrupt))
			require.NoError(t, err)
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if tc.tx.Up > 0 {
				err = sinkUpload(c, tc.tx.Up)
			} else {
				err = sinkDownload(c, tc.tx.Down)
			}
			if tc.err == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tc.err)
			}
		})
	}
}

// TestRunSTN runs the three STN scenarios end to end (smoke profile, one
// asymmetric link) with direct TCP and quictun, and checks the samples and
// the report.
func TestRunSTN(t *testing.T) {
	res, dir, _ := runTunnelSmoke(t, "hn", nil, ScSTNShort, ScSTNSizes, ScSTNBlackout)
	n := map[string]int{}
	for _, smp := range res.Samples {
		n[smp.Scenario]++
		assert.Empty(t, smp.Error, "%s/%s/%s/%s", smp.Scenario, smp.Link, smp.Case, smp.Variant)
		m := smp.Metrics
		switch smp.Scenario {
		case ScSTNShort, ScSTNSizes:
			assert.Zero(t, m["failures"], smp.Case)
			assert.Positive(t, m["p50_s"], smp.Case)
			assert.GreaterOrEqual(t, m["total_s"], m["mean_s"]*m["ok"]*0.99, smp.Case)
			var raw shortRaw
			require.NoError(t, json.Unmarshal(smp.Raw, &raw))
			assert.Len(t, raw.PerConnectionMS, int(m["connections"]))
			assert.Contains(t, m, "emu_loss_pct", smp.Case)
			assert.Zero(t, m["emu_loss_pct"], "%s: no loss configured", smp.Case)
		case ScSTNBlackout:
			assert.Equal(t, 1.0, m["ok"], smp.Variant)
			assert.Contains(t, m, "done_after_s", smp.Variant)
			assert.GreaterOrEqual(t, m["took_s"], 1.0, "%s: not done in the dark", smp.Variant)
		}
	}
	// smoke: LAN x 4 and the asymmetric link x 2 connections; 2 sizes; 1 blackout.
	assert.Equal(t, map[string]int{ScSTNShort: 2 * 2, ScSTNSizes: 2 * 2, ScSTNBlackout: 2}, n)
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "## 8a. Short connections (seed 000, Mars STN)")
	assert.Contains(t, string(md), "| WAN 10/2mbit 13/12ms | 2 x 16 B / 1000 B | quictun |")
	assert.Contains(t, string(md), "c2s-rate=2mbit")
	assert.Contains(t, string(md), "net.ipv4.tcp_syn_retries=")
}
