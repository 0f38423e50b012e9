package congestion_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"
	qc "github.com/quic-go/quic-go/congestion"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/congestion"
)

// goodputFor runs one download of dur (virtual time) with the server's
// controller alg over s, both ends configured as the daemons are, and
// returns the goodput after warmup, in bit/s.
func goodputFor(t *testing.T, s linkSpec, alg congestion.Algorithm, dur, warmup time.Duration) float64 {
	t.Helper()
	var got int64
	synctest.Test(t, func(t *testing.T) {
		cconns, sconns, stop := newEmuNet(t, s, 1)
		defer stop()
		ctx, cancel := context.WithTimeout(context.Background(), dur)
		defer cancel()
		var wg sync.WaitGroup
		wg.Go(func() { require.NoError(t, download(ctx, t, cconns[0], sconns[0], alg, warmup, &got)) })
		wg.Wait()
	})
	return float64(got*8) / (dur - warmup).Seconds()
}

// The heavy-loss targets on a 100 Mbit/s link with 25 ms RTT and a 30 ms
// queue, random loss both ways (before the bottleneck, as netem and
// tools/linkem drop), in virtual time. Before bbr told random loss from
// congestion by the queue and by loss that rises with inflight (it took
// every round over 15 % loss for congestion), 20 % gave 3.7 Mbit/s, 30 %
// 1.7 and 50 % nothing. quic-go's own NewReno shows the harness can fail.
func TestHeavyLossSimnet(t *testing.T) {
	if testing.Short() {
		t.Skip("moves hundreds of MB through quic-go")
	}
	dur, warmup := 10*time.Second, 2*time.Second
	cases := heavyLossCases
	if raceEnabled {
		// Five times slower: the levels the loss model is about.
		dur, warmup = 5*time.Second, time.Second
		cases = []heavyLossCase{cases[3], cases[4], cases[5]}
	}
	const rate = 100e6
	for _, tc := range cases {
		spec := linkSpec{rateBitsPerSecond: rate, oneWay: 12500 * time.Microsecond, queuePackets: 256, loss: tc.loss}
		g := goodputFor(t, spec, tc.alg, dur, warmup)
		t.Logf("%s at %.0f%% loss: %.1f Mbit/s", tc.alg, tc.loss*100, g/1e6)
		require.GreaterOrEqual(t, g, tc.atLeast*rate, "%s at %.0f%% loss", tc.alg, tc.loss*100)
		require.LessOrEqual(t, g, tc.most*rate, "%s at %.0f%% loss", tc.alg, tc.loss*100)
	}
}

type heavyLossCase struct {
	loss          float64
	alg           congestion.Algorithm
	atLeast, most float64 // fractions of the link rate
}

var heavyLossCases = []heavyLossCase{
	// Floors a little under the bench's targets (85, 80, 65, 45, 20
	// Mbit/s; 1 %: 0.95x kernel BBR): one run in ten dips by a few
	// Mbit/s, and a test must not fail on a good build.
	{0.01, congestion.BBR, 0.80, 1.05},
	{0.10, congestion.BBR, 0.75, 1.05},
	{0.20, congestion.BBR, 0.60, 1.05},
	{0.30, congestion.BBR, 0.45, 1.05},
	{0.50, congestion.BBR, 0.20, 1.05},
	{0.01, congestion.Reno, 0, 0.4}, // Mathis: a loss-based controller cannot use the link
}

// TestHeavyLossTrace prints, every half second of one download, the
// goodput and the server's bbr state: a tool for looking at a loss level
// (QUICTUN_TRACE_LOSS=0.3 go test -run TestHeavyLossTrace -v ./pkg/congestion;
// QUICTUN_SIM_SEED picks another draw of the link).
func TestHeavyLossTrace(t *testing.T) {
	loss, err := strconv.ParseFloat(os.Getenv("QUICTUN_TRACE_LOSS"), 64)
	if err != nil {
		t.Skip("set QUICTUN_TRACE_LOSS to trace a download at that loss rate")
	}
	spec := linkSpec{rateBitsPerSecond: 100e6, oneWay: 12500 * time.Microsecond, queuePackets: 256, loss: loss}
	synctest.Test(t, func(t *testing.T) {
		cconns, sconns, stop := newEmuNet(t, spec, 1)
		defer stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var ctl atomic.Pointer[congestion.BBRController]
		f := func(info qc.Info) qc.Controller {
			b := congestion.NewBBR(info, congestion.Options{})
			ctl.Store(b)
			return b
		}
		var sc atomic.Pointer[quic.Conn]
		serverConnHook = func(c *quic.Conn) { sc.Store(c) }
		defer func() { serverConnHook = nil }()
		var got int64
		var wg sync.WaitGroup
		wg.Go(func() { require.NoError(t, downloadWith(ctx, t, cconns[0], sconns[0], f, 0, &got)) })
		last := int64(0)
		for i := 1; ctx.Err() == nil; i++ {
			time.Sleep(500 * time.Millisecond)
			g := atomic.LoadInt64(&got)
			if b, c := ctl.Load(), sc.Load(); b != nil && c != nil {
				st, cs := b.Stats(), c.ConnectionStats()
				t.Logf("t=%4.1fs %5.1f Mbit/s %s cwnd=%d pacing=%.1f bw=%.1f Mbit/s cap=%d round loss=%.2f random=%.2f sent=%d lost=%d srtt=%s round trips=%d congestive=%d",
					float64(i)/2, float64(g-last)*16/1e6, st.State, st.CongestionWindowBytes, st.PacingRateBytesPerSecond*8/1e6,
					st.BandwidthBytesPerSecond*8/1e6, st.InflightCap, st.LossRate, st.RandomLoss, cs.PacketsSent, cs.PacketsLost, cs.SmoothedRTT, st.RoundTrips, st.CongestiveRoundTrips)
			}
			last = g
		}
		wg.Wait()
	})
}

// The fixed-rate mode through quic-go: 50 Mbit/s configured keeps at least
// 45 of goodput at 30 % loss (the target); beside a Cubic download
// on a 30 ms queue whose queue it would fill, its guard gives the link
// back: Cubic keeps at least a quarter of it.
func TestFixedRateSimnet(t *testing.T) {
	if testing.Short() {
		t.Skip("moves hundreds of MB through quic-go")
	}
	fixed := congestion.Factory(congestion.Fixed, congestion.Options{Rate: 50e6 / 8})
	spec := linkSpec{rateBitsPerSecond: 100e6, oneWay: 12500 * time.Microsecond, queuePackets: 256, loss: 0.3}
	dur, warmup := 10*time.Second, 2*time.Second
	if raceEnabled {
		dur, warmup = 5*time.Second, time.Second
	}
	synctest.Test(t, func(t *testing.T) {
		cconns, sconns, stop := newEmuNet(t, spec, 1)
		defer stop()
		ctx, cancel := context.WithTimeout(context.Background(), dur)
		defer cancel()
		var got int64
		require.NoError(t, downloadWith(ctx, t, cconns[0], sconns[0], fixed, warmup, &got))
		g := float64(got*8) / (dur - warmup).Seconds()
		t.Logf("fixed 50 Mbit/s at 30%% loss: %.1f Mbit/s", g/1e6)
		require.GreaterOrEqual(t, g, 45e6)
	})
	spec.loss = 0
	synctest.Test(t, func(t *testing.T) {
		cconns, sconns, stop := newEmuNet(t, spec, 2)
		defer stop()
		ctx, cancel := context.WithTimeout(context.Background(), dur)
		defer cancel()
		var got [2]int64
		var wg sync.WaitGroup
		wg.Go(func() {
			f := congestion.Factory(congestion.Fixed, congestion.Options{Rate: 90e6 / 8})
			require.NoError(t, downloadWith(ctx, t, cconns[0], sconns[0], f, warmup, &got[0]))
		})
		wg.Go(func() { require.NoError(t, download(ctx, t, cconns[1], sconns[1], congestion.Cubic, warmup, &got[1])) })
		wg.Wait()
		secs := (dur - warmup).Seconds()
		fx, cubic := float64(got[0]*8)/secs, float64(got[1]*8)/secs
		t.Logf("fixed 90 Mbit/s beside cubic: fixed %.1f Mbit/s, cubic %.1f Mbit/s (link 100)", fx/1e6, cubic/1e6)
		require.Greater(t, cubic, 25e6, "cubic's share")
	})
}
