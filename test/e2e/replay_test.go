package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// udpRecorder relays datagrams between one client and the server and, while
// recording, keeps a copy of what the client sends: an on-path attacker.
type udpRecorder struct {
	front, back *net.UDPConn

	mu        sync.Mutex
	client    *net.UDPAddr
	recording bool
	recorded  [][]byte
}

func newUDPRecorder(t *testing.T, server string) *udpRecorder {
	t.Helper()
	front, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	sa, err := net.ResolveUDPAddr("udp", server)
	require.NoError(t, err)
	back, err := net.DialUDP("udp", nil, sa)
	require.NoError(t, err)
	r := &udpRecorder{front: front, back: back}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := front.ReadFromUDP(buf)
			if err != nil {
				return
			}
			r.mu.Lock()
			r.client = from
			if r.recording {
				r.recorded = append(r.recorded, append([]byte(nil), buf[:n]...))
			}
			r.mu.Unlock()
			_, _ = back.Write(buf[:n])
		}
	})
	wg.Go(func() {
		buf := make([]byte, 65536)
		for {
			n, err := back.Read(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // ECONNREFUSED while the server restarts
			}
			r.mu.Lock()
			to, hold := r.client, r.recording
			r.mu.Unlock()
			if hold {
				// Hold the server's answers while recording, so the client's
				// first flight (its 0-RTT data) is complete before the handshake
				// can finish, and the server sees the stream as 0-RTT.
				time.Sleep(50 * time.Millisecond)
			}
			if to != nil {
				_, _ = front.WriteToUDP(buf[:n], to)
			}
		}
	})
	t.Cleanup(func() {
		_ = front.Close()
		_ = back.Close()
		wg.Wait()
	})
	return r
}

func (r *udpRecorder) record(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recording = on
}

func (r *udpRecorder) flight() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recorded
}

// replay sends the recorded datagrams to server from a fresh socket.
func replay(t *testing.T, server string, flight [][]byte) {
	t.Helper()
	c, err := net.Dial("udp", server)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	for _, d := range flight {
		_, _ = c.Write(d)
		time.Sleep(time.Millisecond)
	}
}

// TestZeroRTTReplay: an attacker on the path records a client's 0-RTT flight
// (a resumed connection whose first stream opens a tunnel and sends a request)
// and sends it to the server again. The request must reach the destination
// once: the replay is reset with "replay", before and after a server restart.
func TestZeroRTTReplay(t *testing.T) {
	checkLeaks(t)
	got := make(chan string, 8)
	dest := testutil.ServeTCP(t, func(c net.Conn) {
		_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
		b, _ := io.ReadAll(io.LimitReader(c, 1<<10))
		_, _ = io.WriteString(c, "done")
		got <- string(b)
	})
	// A replayed flight never completes its handshake; a short handshake
	// timeout clears it from the server before the next replay.
	srvArgs := []string{"--handshake-timeout", "1s"}
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + dest}, Args: srvArgs})
	raw, err := os.ReadFile(srv.SecretFile)
	require.NoError(t, err)
	secret := []byte(strings.TrimSpace(string(raw)))

	tlsConf := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"quictun/1"}, MinVersion: tls.VersionTLS13, // the test client does not verify
		ServerName: "quictun-server", ClientSessionCache: newTicketSignal()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A first connection obtains a session ticket.
	c1, err := quic.DialAddr(ctx, srv.Addr, tlsConf, &quic.Config{})
	require.NoError(t, err)
	code, err := streamReset(t, c1, append(header(t, "tcp:"+dest, secret), "warm-up"...), true)
	require.Error(t, err, "warm-up stream was reset with %v", code)
	require.Equal(t, "warm-up", <-got)
	// The server sends its ticket only after a verified header (it
	// withholds it until then): closed before it came, the next
	// connection had no 0-RTT.
	select {
	case <-tlsConf.ClientSessionCache.(*ticketSignal).put:
	case <-ctx.Done():
		t.Fatal("no session ticket came")
	}
	_ = c1.CloseWithError(0, "")

	// The resumed connection sends its request as 0-RTT data, through the recorder.
	rec := newUDPRecorder(t, srv.Addr)
	rec.record(true)
	c2, err := quic.DialAddrEarly(ctx, rec.front.LocalAddr().String(), tlsConf, &quic.Config{})
	require.NoError(t, err)
	str, err := c2.OpenStream()
	require.NoError(t, err)
	_, err = str.Write(append(header(t, "tcp:"+dest, secret), "transfer 100 EUR"...))
	require.NoError(t, err)
	require.NoError(t, str.Close())
	select {
	case <-c2.HandshakeComplete():
	case <-ctx.Done():
		t.Fatal("handshake did not complete")
	}
	rec.record(false)
	if !c2.ConnectionState().Used0RTT {
		_ = c2.CloseWithError(0, "")
		t.Skip("the server did not accept 0-RTT; nothing to replay")
	}
	_ = str.SetReadDeadline(time.Now().Add(10 * time.Second))
	reply, err := io.ReadAll(str)
	require.NoError(t, err)
	require.Equal(t, "\x00done", string(reply), "reply byte OK, then the destination's answer")
	require.Equal(t, "transfer 100 EUR", <-got)
	_ = c2.CloseWithError(0, "")
	flight := rec.flight()
	t.Logf("recorded %d datagrams of the 0-RTT flight", len(flight))

	// replayN sends the flight n times and returns how often the request
	// reached the destination again. A replay that arrives while the server
	// still holds state for an earlier connection with the same connection ID
	// is dropped unseen, so each replay is repeated (bounded) until the server
	// has either refused it (streams_total{replay} grows) or delivered it.
	replayN := func(t *testing.T, d *daemon, n int) int {
		t.Helper()
		delivered := 0
		for range n {
			before := scrape(t, d).val("quictun_server_streams_total", "result", "replay")
			handled := false
			for attempt := 0; attempt < 5 && !handled; attempt++ {
				time.Sleep(1500 * time.Millisecond) // > handshake timeout: the previous replay is gone
				replay(t, d.Addr, flight)
				for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && !handled; {
					select {
					case <-got:
						delivered++
						handled = true
					case <-time.After(50 * time.Millisecond):
						handled = scrape(t, d).val("quictun_server_streams_total", "result", "replay") > before
					}
				}
			}
			require.True(t, handled, "the server never handled the replayed flight")
		}
		return delivered
	}

	// Replayed twice to the same server: both are refused.
	delivered := replayN(t, srv, 2)
	refused := waitMetric(t, srv, 5*time.Second, ge(2), "quictun_server_streams_total", "result", "replay")
	t.Logf("same server, 2 replays: refused with replay %v times, request delivered again %d times", refused, delivered)

	// The recorder held the server's answers, so the original stream was
	// certainly 0-RTT; then even the first replay must be refused. (Without the
	// hold, a 0-RTT stream the server accepted after the handshake completed
	// was not recorded and its first replay got through: seen under load.)
	assert.Zero(t, delivered, "the replayed request reached the destination again")

	t.Run("after restart", func(t *testing.T) {
		srv.kill(t)
		srv2 := startServer(t, serverOpts{StateDir: srv.StateDir, SecretFile: srv.SecretFile, UDPPort: srv.udpPort,
			AdminPort: srv.adminPort, Allow: []string{"tcp:" + dest}, Args: srvArgs})
		assert.Zero(t, replayN(t, srv2, 1), "the replayed request reached the destination again")
	})
}

// ticketSignal is a client session cache that tells when a ticket was
// stored (put).
type ticketSignal struct {
	tls.ClientSessionCache
	put chan struct{}
}

func newTicketSignal() *ticketSignal {
	return &ticketSignal{ClientSessionCache: tls.NewLRUClientSessionCache(4), put: make(chan struct{}, 1)}
}

func (c *ticketSignal) Put(key string, cs *tls.ClientSessionState) {
	c.ClientSessionCache.Put(key, cs)
	if cs != nil {
		select {
		case c.put <- struct{}{}:
		default:
		}
	}
}
