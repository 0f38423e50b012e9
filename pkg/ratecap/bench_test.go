package ratecap

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	qc "github.com/quic-go/quic-go/congestion"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil/quictest"
	"github.com/quictun/quictun/pkg/transport"
)

// farAbove is a cap far above what loopback carries (100 Gbit/s).
const farAbove = 100e9 / 8

// BenchmarkCapsDataPath (issue 35: the caps cost the data path <= 2 %) is a
// bulk transfer over a QUIC connection on loopback in each direction, as
// the server carries it, without caps and with a cap far above the rate:
// download, the server writes and its sender's controller is wrapped and
// bound to a budget (Controller); upload, the server reads through a
// capped Stream (reads of at most 16 KiB, each booked in the budget);
// caps=link100Gbit is an uncapped identity under --link-rate, paced by the
// link's rest (also far above the rate), which it shares with the others.
// Compare interleaved runs (-count, benchstat): on a shared machine the
// run-to-run spread can exceed the difference.
//
//	go test -run '^$' -bench BenchmarkCapsDataPath -count 6 ./pkg/ratecap/
func BenchmarkCapsDataPath(b *testing.B) {
	for _, dir := range []string{"download", "upload"} {
		for _, mode := range []string{"off", "100Gbit", "link100Gbit"} {
			b.Run("dir="+dir+"/caps="+mode, func(b *testing.B) { benchTransfer(b, dir == "upload", mode) })
		}
	}
}

// benchTransfer moves b.N chunks of 64 KiB from the server to the client
// (upload false) or the other way, capped (mode 100Gbit), paced by the
// link's rest (link100Gbit) or not (off).
func benchTransfer(b *testing.B, upload bool, mode string) {
	q := transport.QUICConfig(transport.DefaultQUICOptions())
	sq := q.Clone()
	var budget Shares // the identity's, as Table.For gives it
	switch mode {
	case "100Gbit":
		budget.Down.SetRate(farAbove)
		budget.Up.SetRate(farAbove)
	case "link100Gbit":
		var down, up linkShare
		down.setLink(farAbove)
		up.setLink(farAbove)
		budget.Down.rest, budget.Up.rest = &down, &up
	}
	capped := mode != "off"
	if capped {
		sq.Congestion = Factory(q.Congestion)
	}
	cli, srv := quictest.PairWith(b, sq, q)
	if capped {
		ctl, ok := srv.CongestionController().(*Controller)
		require.True(b, ok, "the server's controller is wrapped")
		ctl.Bind(&budget.Down)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, ss := streamPair(b, ctx, cli, srv)
	var dst io.Reader = cs
	var src io.Writer = ss
	if upload {
		src = cs
		dst = ss
		if capped {
			dst = NewStream(ctx, ss, &budget.Up, nil)
		}
	}
	chunk := make([]byte, 64<<10)
	total := int64(b.N) * int64(len(chunk))
	b.SetBytes(int64(len(chunk)))
	got := make(chan int64, 1)
	go func() {
		buf := make([]byte, 64<<10)
		var n int64
		for {
			k, err := dst.Read(buf)
			n += int64(k)
			if err != nil {
				got <- n
				return
			}
		}
	}()
	b.ResetTimer()
	for range b.N {
		if _, err := src.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	require.NoError(b, src.(io.Closer).Close())
	if n := <-got; n != total {
		b.Fatalf("read %d bytes, want %d", n, total)
	}
	b.StopTimer()
}

// streamPair opens a stream from the client and accepts it on the server.
func streamPair(tb testing.TB, ctx context.Context, cli, srv *quic.Conn) (c, s *quic.Stream) {
	tb.Helper()
	c, err := cli.OpenStreamSync(ctx)
	require.NoError(tb, err)
	_, err = c.Write([]byte{'x'})
	require.NoError(tb, err)
	s, err = srv.AcceptStream(ctx)
	require.NoError(tb, err)
	_, err = io.ReadFull(s, make([]byte, 1))
	require.NoError(tb, err)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		tb.Fatal("no stream within the deadline")
	}
	return c, s
}

// BenchmarkControllerPerPacket is what the cap adds to each packet the
// server sends: the controller's pacing check, the booking of the packet
// in the identity's budget and the next send time, against the inner
// controller alone (caps=off: not bound, a server without caps) and bound
// to a budget without a cap (caps=none: an identity without a cap on a
// server with caps or an auth hook), and such a budget under --link-rate
// (caps=link100Gbit: paced by the link's rest, refreshed every 100 ms).
func BenchmarkControllerPerPacket(b *testing.B) {
	for _, tc := range []struct {
		name string
		bind bool
		rate float64
		link float64
	}{{"caps=off", false, 0, 0}, {"caps=none", true, 0, 0}, {"caps=100Gbit", true, farAbove, 0}, {"caps=link100Gbit", true, 0, farAbove}} {
		b.Run(tc.name, func(b *testing.B) {
			c := Wrap(openController{})
			if tc.bind {
				var bk Bucket
				bk.SetRate(tc.rate)
				if tc.link > 0 {
					bk.rest = &linkShare{}
					bk.rest.setLink(tc.link)
					bk.rest.capped.Store(&[]*Bucket{})
				}
				c.Bind(&bk)
			}
			now := qc.Time(time.Hour)
			b.ReportAllocs()
			for b.Loop() {
				now += 96 // 1200 B at 100 Gbit/s
				if c.HasPacingBudget(now) {
					c.OnPacketSent(qc.SentPacket{Time: now, Bytes: 1200, AckEliciting: true})
				}
				_ = c.TimeUntilSend(0)
			}
		})
	}
}

// nopStream is a splice.Stream that moves every byte at once.
type nopStream struct{}

func (nopStream) Read(p []byte) (int, error)       { return len(p), nil }
func (nopStream) Write(p []byte) (int, error)      { return len(p), nil }
func (nopStream) Close() error                     { return nil }
func (nopStream) CancelRead(quic.StreamErrorCode)  {}
func (nopStream) CancelWrite(quic.StreamErrorCode) {}

// BenchmarkStreamPerCall is what a capped Stream adds to one read and one
// write of a tunnel on QUIC (reads booked in the upload budget, writes
// passed on: the sender paces them), against the stream alone: the clock
// is read once per read, not per write, and not at all without a cap. The
// cap is far above even this loop's rate (reads that take no time), so
// that it never waits.
//
//	go test -run '^$' -bench BenchmarkStreamPerCall -count 5 ./pkg/ratecap/
func BenchmarkStreamPerCall(b *testing.B) {
	for _, tc := range []struct {
		name string
		wrap bool
		rate float64
	}{{"caps=off", false, 0}, {"caps=none", true, 0}, {"caps=8Pbit", true, 1e15}} {
		b.Run(tc.name, func(b *testing.B) {
			var up Bucket
			up.SetRate(tc.rate)
			var str io.ReadWriter = nopStream{}
			if tc.wrap {
				str = NewStream(context.Background(), nopStream{}, &up, nil)
			}
			buf := make([]byte, 32<<10)
			b.ReportAllocs()
			for b.Loop() {
				_, _ = str.Read(buf)
				_, _ = str.Write(buf)
			}
		})
	}
}
