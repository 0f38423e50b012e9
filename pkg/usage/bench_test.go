package usage

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil/quictest"
	"github.com/quictun/quictun/pkg/splice"
)

// BenchmarkSpliceAccounting is the splice path (TCP -> splice.Pipe -> QUIC
// stream, 64 KiB writes) without and with accounting: with it, the pipe's
// counters are tracked by an account and the ledger runs (Run: a tick a
// second folds them into rates). The data path itself is the same code
// either way: the accounting reads the counters the pipe keeps anyway. Run
// both with -count and compare interleaved runs (benchstat): on a shared
// 2-core machine the run-to-run spread is larger than any difference.
func BenchmarkSpliceAccounting(b *testing.B) {
	for _, accounted := range []bool{false, true} {
		b.Run("accounting="+strconv.FormatBool(accounted), func(b *testing.B) {
			cli, srv := quictest.Pair(b)
			pipeStr, peer := benchStreamPair(b, cli, srv)
			pipeConn, app := benchTCPPair(b)
			p := splice.New(pipeConn, pipeStr)
			if accounted {
				l, err := New(Config{})
				require.NoError(b, err)
				defer l.Get("key=alice").Track(&p.FromStream, &p.ToStream)()
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); _ = l.Run(ctx, Hooks{}) }()
				defer func() { cancel(); <-done }()
			}
			runPipe(b, p, app, peer)
		})
	}
}

// runPipe pushes b.N chunks of 64 KiB through p and checks they arrived.
func runPipe(b *testing.B, p *splice.Pipe, app *net.TCPConn, peer *quic.Stream) {
	done := make(chan error, 1)
	go func() { done <- p.Run() }()
	chunk := make([]byte, 64<<10)
	total := int64(b.N) * int64(len(chunk))
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	got := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(io.Discard, peer)
		got <- n
	}()
	b.ResetTimer()
	for range b.N {
		if _, err := app.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	require.NoError(b, app.CloseWrite())
	if n := <-got; n != total {
		b.Fatalf("peer read %d bytes, want %d", n, total)
	}
	b.StopTimer()
	_ = peer.Close()
	require.NoError(b, <-done)
}

// BenchmarkTrack is the accounting's whole cost per tunnel: the account
// lookup, Track at its start and done at its end.
func BenchmarkTrack(b *testing.B) {
	l, err := New(Config{})
	require.NoError(b, err)
	var up, down atomic.Int64
	b.ReportAllocs()
	for b.Loop() {
		l.Get("key=alice").Track(&up, &down)()
	}
}

func benchStreamPair(tb testing.TB, cli, srv *quic.Conn) (a, b *quic.Stream) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := cli.OpenStreamSync(ctx)
	require.NoError(tb, err)
	_, err = a.Write([]byte{'x'})
	require.NoError(tb, err)
	b, err = srv.AcceptStream(ctx)
	require.NoError(tb, err)
	_, err = io.ReadFull(b, make([]byte, 1))
	require.NoError(tb, err)
	return a, b
}

func benchTCPPair(tb testing.TB) (a, b *net.TCPConn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	defer func() { _ = ln.Close() }()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(tb, err)
	r := <-ch
	require.NotNil(tb, r)
	tb.Cleanup(func() { _ = d.Close(); _ = r.Close() })
	return r.(*net.TCPConn), d.(*net.TCPConn)
}
