package integration

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/tcpmux"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/server"
)

// TestTCPHandshakeSlotsUnderBareConnects (issue 30 R2): eight sources
// (127.0.0.2-9) each open 20 TCP connections a second, within the default
// handshake rate and connection cap per source, and send nothing on them,
// one byte, or a whole ClientHello, then stall; meanwhile a real client
// from another address (127.0.0.1) makes 20 TLS handshakes over the
// fallback. At least 95 % of them must succeed: silent connections wait
// for their ClientHello apart from the handshakes, and each source holds at
// most its share of the handshake slots. Before, they all took the 256
// handshake slots for the 10 s handshake timeout, and 4 of 20 succeeded.
func TestTCPHandshakeSlotsUnderBareConnects(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("floods the TCP listener for several seconds")
	}
	state := t.TempDir() // one certificate for all: one pin, one ClientHello
	st, err := transport.LoadOrCreateState(state, "", "")
	require.NoError(t, err)
	pin, err := transport.ParseFingerprint(st.Fingerprint())
	require.NoError(t, err)
	conf, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}})
	require.NoError(t, err)
	hello := clientHelloRecord(t, conf)
	for _, tc := range []struct {
		name  string
		first []byte // what each flooding connection sends before it stalls
	}{
		{"silent", nil},
		{"one byte", hello[:1]},
		{"whole ClientHello", hello},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testutil.StartServer(t, testutil.ServerOptions{StateDir: state, TCP: true})
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var flood atomic.Int64
			for i := 2; i <= 9; i++ {
				wg.Go(func() { flood.Add(int64(floodTCP(fmt.Sprintf("127.0.0.%d", i), srv.TCPAddr, tc.first, stop))) })
			}
			// Let the flood reach its steady state (before the fix: every
			// handshake slot taken) before the real client starts.
			time.Sleep(2 * time.Second)
			const attempts = 20
			ok := 0
			for range attempts {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				c, err := tcpmux.Dial(ctx, srv.TCPAddr, conf, nil)
				cancel()
				if err == nil {
					ok++
					_ = c.CloseWithError(0, "")
				}
				time.Sleep(150 * time.Millisecond) // spread over the flood
			}
			close(stop)
			wg.Wait()
			refused := map[string]float64{}
			for _, r := range []string{"handshake_rate", "per_source_limit", metrics.RefusedTCPHandshakes,
				metrics.RefusedTCPHandshakesPerSource, metrics.RefusedTCPWaiting, metrics.RefusedTCPWaitingPerSource} {
				refused[r] = promtest.ToFloat64(srv.Metrics.RefusedConnectionsTotal.WithLabelValues(r))
			}
			t.Logf("%s: %d of %d handshakes from 127.0.0.1 succeeded beside %d flooding connections from 8 addresses; refused so far: %v",
				tc.name, ok, attempts, flood.Load(), refused)
			assert.GreaterOrEqual(t, ok, attempts*95/100, "a real client's handshakes succeed beside the flood")
		})
	}
}

// floodTCP connects from src to addr 20 times a second until stop, sends
// first on each connection and nothing more, and holds them all until stop
// (the server may close them earlier); it returns how many it opened.
func floodTCP(src, addr string, first []byte, stop <-chan struct{}) int {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Second}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var conns []net.Conn
	defer func() {
		for _, nc := range conns {
			_ = nc.Close()
		}
	}()
	// Bounded whatever happens: 30 s at most.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		select {
		case <-stop:
			return len(conns)
		case <-tick.C:
		}
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			continue
		}
		conns = append(conns, nc)
		if len(first) > 0 {
			_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = nc.Write(first)
		}
	}
	return len(conns)
}

// clientHelloRecord is the first TLS record a tcpmux client sends with conf
// (its ClientHello), as flooding connections replay it: the server does a
// handshake's work for each, then waits for a Finished that never comes.
func clientHelloRecord(t *testing.T, conf *tls.Config) []byte {
	t.Helper()
	conf = conf.Clone()
	conf.NextProtos, conf.MinVersion = []string{tcpmux.ALPN}, tls.VersionTLS13
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tls.Client(a, conf).Handshake() // fails once b is closed
	}()
	defer func() { _ = b.Close(); _ = a.Close(); <-done }()
	hdr := make([]byte, 5)
	_, err := io.ReadFull(b, hdr)
	require.NoError(t, err)
	rec := make([]byte, 5+int(binary.BigEndian.Uint16(hdr[3:])))
	copy(rec, hdr)
	_, err = io.ReadFull(b, rec[5:])
	require.NoError(t, err)
	return rec
}

// TestTCPConnsPerSourceAtAccept (issue 30 R2): a TCP connection holds its
// place among its source's connections (--max-conns-per-source) from
// accept, before the TLS handshake, and gives it back on every path: when
// it sent no ClientHello in time (the server closes it within 3 s, not the
// handshake's 10 s), when its peer left or sent garbage, when its
// handshake failed, and when the admitted connection ends.
func TestTCPConnsPerSourceAtAccept(t *testing.T) {
	t.Parallel()
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Mutate: func(c *server.Config) { c.MaxConnsPerSource = 1 }})
	refused := func() float64 {
		return promtest.ToFloat64(srv.Metrics.RefusedConnectionsTotal.WithLabelValues("per_source_limit"))
	}
	// dialOK dials until a connection is admitted (the server gives a
	// place back once it has noticed the end) and returns it.
	dialOK := func(msg string) *tcpmux.Conn {
		t.Helper()
		var c *tcpmux.Conn
		require.Eventually(t, func() bool {
			var err error
			c, err = dialTCP(t, srv)
			return err == nil
		}, 10*time.Second, 100*time.Millisecond, msg)
		return c
	}

	silent, err := net.Dial("tcp", srv.TCPAddr)
	require.NoError(t, err)
	_, err = dialTCP(t, srv)
	require.Error(t, err, "the silent connection holds the source's only place")
	assert.Equal(t, 1.0, refused(), "refused at accept")
	assert.Zero(t, promtest.ToFloat64(srv.Metrics.TCPHandshakeFailuresTotal), "with no TLS work")
	start := time.Now()
	_ = silent.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = silent.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the server closed the silent connection")
	assert.Less(t, time.Since(start), 8*time.Second, "at its ClientHello deadline, not the handshake's")
	_ = silent.Close()
	_ = dialOK("a silent connection that timed out gives back its place").CloseWithError(0, "")

	for _, first := range [][]byte{nil, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), {22, 3, 1, 0, 4, 1, 0, 0, 0}} {
		nc, err := net.Dial("tcp", srv.TCPAddr)
		require.NoError(t, err)
		if first != nil {
			_, err = nc.Write(first)
			require.NoError(t, err)
		}
		_ = nc.Close()
		_ = dialOK(fmt.Sprintf("a connection that left after %q gives back its place", first)).CloseWithError(0, "")
	}
	c := dialOK("the last connection's place is back")
	_, err = dialTCP(t, srv)
	require.Error(t, err, "an admitted connection holds the place, counted once")
	_ = c.CloseWithError(0, "")
	dialOK("an admitted connection that ended gives back its place")
}
