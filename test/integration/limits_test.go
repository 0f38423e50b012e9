package integration

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/server"
)

// echoOK does one verified transfer through a new tunnel.
func echoOK(addr string) error { return verifiedTransfer(addr, 1000, 10*time.Second) }

// TestConnectionFloodFromOneAddress: one source address (127.0.0.2) opens QUIC
// connections as fast as it can. Past the per-source handshake rate the server
// asks for address validation and then refuses, past the per-source cap it
// closes connections with overloaded; both are counted, and a client on
// another address keeps being served throughout.
func TestConnectionFloodFromOneAddress(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.HandshakesPerSecond, c.MaxConnsPerSource = 5, 4
	}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})

	from := dialerFrom(t, srv, net.IPv4(127, 0, 0, 2))
	var opened []*quic.Conn
	// refused: dials the handshake rate refused in their Initial
	// (CONNECTION_REFUSED); cappedEarly: dials the per-source cap closed
	// before they completed (the server closes once its handshake is done or
	// after a second; on a loaded machine the second can come first, and
	// QUIC carries no application code that early, RFC 9000 §10.2.3: the
	// client sees APPLICATION_ERROR).
	refused, cappedEarly, legitFailures := 0, 0, 0
	for i := range 40 {
		c, err := from.dial(2 * time.Second)
		var te *quic.TransportError
		switch {
		case err == nil:
			opened = append(opened, c)
		case !assert.True(t, errors.As(err, &te), "dial %d: refusal is a QUIC transport error: %#v", i, err):
		case te.ErrorCode == quic.ApplicationErrorErrorCode:
			cappedEarly++
		default:
			assert.Equal(t, quic.ConnectionRefused, te.ErrorCode, "dial %d", i)
			refused++
		}
		if i%10 == 0 && echoOK(cl.Addr) != nil {
			legitFailures++
		}
	}
	// Connections past the per-source cap are closed by the server with
	// overloaded: each closure the server counted reaches its client (on a
	// loaded machine one came later than the half second once waited).
	closed := func() int {
		n := 0
		for _, c := range opened {
			if c.Context().Err() != nil {
				n++
			}
		}
		return n
	}
	byCap := func() float64 {
		return promtest.ToFloat64(srv.Metrics.RefusedConnectionsTotal.WithLabelValues("per_source_limit"))
	}
	time.Sleep(500 * time.Millisecond) // closures not counted yet would show as one too many left open
	assert.Eventually(t, func() bool { return float64(closed()+cappedEarly) >= byCap() }, 10*time.Second, 10*time.Millisecond,
		"every closure the server counted reached its client")
	overloaded := 0
	for _, c := range opened {
		if c.Context().Err() == nil {
			continue
		}
		cause := context.Cause(c.Context())
		var ae *quic.ApplicationError
		var te *quic.TransportError
		switch {
		case errors.As(cause, &ae):
			// The server waited for the handshake to finish, so the client
			// learns the reason: overloaded.
			assert.Equal(t, proto.CodeOverloaded.ApplicationErrorCode(), ae.ErrorCode)
		case errors.As(cause, &te):
			// Its second ran out first (see cappedEarly).
			assert.Equal(t, quic.ApplicationErrorErrorCode, te.ErrorCode, "closed by the server: %#v", cause)
		default:
			assert.Fail(t, "closed by the server", "%#v", cause)
		}
		overloaded++
	}
	alive := len(opened) - overloaded
	byRate := promtest.ToFloat64(srv.Metrics.RefusedConnectionsTotal.WithLabelValues("handshake_rate"))
	t.Logf("40 dials from one address: %d refused (handshake_rate metric %v), %d accepted then closed overloaded and %d closed so before their handshake completed (per_source_limit metric %v), %d left open; the other client failed %d of 4 checks",
		refused, byRate, overloaded, cappedEarly, byCap(), alive, legitFailures)
	assert.LessOrEqual(t, alive, 4, "no more than --max-conns-per-source stay open")
	assert.Positive(t, refused, "the handshake rate refused some")
	assert.GreaterOrEqual(t, byRate, float64(refused), "every refusal counted (a retransmitted Initial counts again)")
	assert.Equal(t, float64(overloaded+cappedEarly), byCap(), "every cap closure counted")
	assert.Zero(t, legitFailures, "the client on another address is unaffected")
	require.NoError(t, echoOK(cl.Addr))
	for _, c := range opened {
		_ = c.CloseWithError(0, "")
	}
}

// TestStreamExhaustion: a client holds every stream the server allows on its
// connection; its next tunnel waits for credit up to --stream-open-timeout
// and is then reset (counted as overloaded), while another client is served.
func TestStreamExhaustion(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	const limit = 8
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo},
		QUIC: func(o *transport.QUICOptions) { o.MaxIncomingStreams = limit }})
	greedy := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true,
		Mutate: func(c *client.Config) { c.StreamOpenTimeout = 300 * time.Millisecond }})
	other := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})

	held := make([]net.Conn, 0, limit)
	for range limit {
		c := dial(t, greedy.Addr)
		msg := []byte("hold")
		_, err := c.Write(msg)
		require.NoError(t, err)
		_, err = io.ReadFull(c, msg)
		require.NoError(t, err)
		held = append(held, c)
	}
	start := time.Now()
	c := dial(t, greedy.Addr)
	_, _ = c.Write([]byte("one too many"))
	_, err := io.ReadAll(c)
	reset := errors.Is(err, syscall.ECONNRESET)
	took := time.Since(start)
	t.Logf("stream %d of a %d-stream limit: ended after %v (err %v)", limit+1, limit, took.Round(time.Millisecond), err)
	for _, code := range proto.AllCodes() {
		if v := promtest.ToFloat64(greedy.Metrics.StreamsTotal.WithLabelValues(code.String())); v > 0 {
			t.Logf("client streams %s: %v", code, v)
		}
	}
	for _, code := range proto.AllCodes() {
		if v := promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues(code.String())); v > 0 {
			t.Logf("server streams %s: %v", code.String(), v)
		}
	}
	assert.True(t, reset || err == nil, "the extra tunnel ends (reset or EOF), it does not hang: %v", err)
	assert.GreaterOrEqual(t, took, 250*time.Millisecond, "it waited for stream credit first")
	assert.Equal(t, 1.0, promtest.ToFloat64(greedy.Metrics.StreamsTotal.WithLabelValues(proto.CodeOverloaded.String())),
		"counted as overloaded")
	require.NoError(t, echoOK(other.Addr), "another client is served")

	// Closing one held tunnel frees credit: the greedy client can open again.
	_ = held[0].Close()
	require.Eventually(t, func() bool { return echoOK(greedy.Addr) == nil }, 10*time.Second, 50*time.Millisecond)
}
