package congestion_test

import (
	"context"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"
	qc "github.com/quic-go/quic-go/congestion"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/congestion"
)

// noTailCopies hides a controller's TailCopies: quic-go then sends none.
type noTailCopies struct{ qc.Controller }

// exchanges runs warm request/reply exchanges (16 B up, 1000 B down, a new
// stream each, as a tunnel carries short connections) over one connection
// on s, both ends' controllers made by f, and returns the mean time of the
// measured ones and the tail copies both ends sent.
func exchanges(t *testing.T, s linkSpec, f qc.NewController, warm, measured int) (time.Duration, uint64) {
	t.Helper()
	var mean time.Duration
	var copies uint64
	synctest.Test(t, func(t *testing.T) {
		cconns, sconns, stop := newEmuNet(t, s, 1)
		defer stop()
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		stlsc, ctlsc := testutil.SelfSignedTLS(t, "simnet")
		ln, err := (&quic.Transport{Conn: sconns[0]}).Listen(stlsc, productConfig(f, false))
		require.NoError(t, err)
		defer ln.Close()
		var sconn *quic.Conn
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() {
			c, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			sconn = c
			for {
				str, err := c.AcceptStream(ctx)
				if err != nil {
					return
				}
				req := make([]byte, 16)
				if _, err := io.ReadFull(str, req); err != nil {
					return
				}
				_, _ = str.Write(make([]byte, 1000))
				_ = str.Close()
			}
		})
		ctr := &quic.Transport{Conn: cconns[0]}
		defer ctr.Close()
		c, err := ctr.Dial(ctx, sconns[0].LocalAddr(), ctlsc, productConfig(f, true))
		require.NoError(t, err)
		defer c.CloseWithError(0, "")
		var total time.Duration
		for i := range warm + measured {
			start := time.Now()
			str, err := c.OpenStreamSync(ctx)
			require.NoError(t, err)
			_, err = str.Write(make([]byte, 16))
			require.NoError(t, err)
			n, err := io.Copy(io.Discard, str)
			require.NoError(t, err)
			require.EqualValues(t, 1000, n)
			if i >= warm {
				total += time.Since(start)
			}
		}
		mean = total / time.Duration(measured)
		copies = c.ConnectionStats().TailCopiesSent
		if sconn != nil {
			copies += sconn.ConnectionStats().TailCopiesSent
		}
	})
	return mean, copies
}

// Seed 000's short connections in the simulator: a request and a reply
// over a warm connection, RTT 100 ms, 30 % random loss each way (the bench's
// stn-short). A lost request or reply is a lost tail packet: without copies
// it waits for a probe timeout. With bbr's tail copies (3 at this loss) an
// exchange takes less than two thirds of the time it takes without.
func TestTailCopiesShortExchangesAtHeavyLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("a thousand exchanges through quic-go")
	}
	spec := linkSpec{rateBitsPerSecond: 100e6, oneWay: 50 * time.Millisecond, queuePackets: 1000, loss: 0.3}
	bbr := congestion.Factory(congestion.BBR, congestion.Options{})
	without := func(i qc.Info) qc.Controller { return noTailCopies{bbr(i)} }
	const warm, measured = 30, 200
	withMean, withCopies := exchanges(t, spec, bbr, warm, measured)
	noMean, noCopies := exchanges(t, spec, without, warm, measured)
	t.Logf("30%% loss, RTT 100 ms: exchange mean %v with tail copies (%d sent), %v without", withMean, withCopies, noMean)
	require.Zero(t, noCopies)
	require.NotZero(t, withCopies)
	require.Less(t, withMean, noMean*2/3)
}
