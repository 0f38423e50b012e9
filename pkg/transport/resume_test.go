package transport_test

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/transport"
)

// signallingCache reports every ticket stored in the wrapped cache.
type signallingCache struct {
	tls.ClientSessionCache
	stored chan struct{}
}

func (c *signallingCache) Put(key string, cs *tls.ClientSessionState) {
	c.ClientSessionCache.Put(key, cs)
	if cs != nil {
		select {
		case c.stored <- struct{}{}:
		default:
		}
	}
}

// serveOnce runs a QUIC server with st's identity and keys on a fresh loopback
// socket and returns its address and a stop func.
func serveOnce(t *testing.T, st *transport.State) (net.Addr, func()) {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	tr := &quic.Transport{Conn: pc, StatelessResetKey: &st.ResetKey, TokenGeneratorKey: &st.TokenKey}
	ln, err := tr.ListenEarly(transport.ServerTLSConfig(st, nil), transport.QUICConfig(transport.DefaultQUICOptions()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			go func() {
				<-conn.Context().Done()
			}()
		}
	}()
	stop := func() {
		cancel()
		_ = ln.Close()
		_ = tr.Close() // closes the connections too
		_ = pc.Close()
		<-done
	}
	t.Cleanup(stop)
	return pc.LocalAddr(), stop
}

func dialEarly(t *testing.T, addr net.Addr, cache tls.ClientSessionCache, pin [32]byte) *quic.Conn {
	t.Helper()
	ctls, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprint: &pin, SessionCache: cache})
	require.NoError(t, err)
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	tr := &quic.Transport{Conn: pc}
	t.Cleanup(func() {
		_ = tr.Close()
		_ = pc.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := tr.DialEarly(ctx, addr, ctls, transport.QUICConfig(transport.DefaultQUICOptions()))
	require.NoError(t, err)
	select {
	case <-conn.HandshakeComplete():
	case <-ctx.Done():
		t.Fatal("handshake did not complete")
	}
	return conn
}

// TestZeroRTTAcrossRestart checks what the state dir promises: a server
// restarted with the same state accepts the client's ticket with 0-RTT, one
// with a new state (another session-ticket key) does not.
func TestZeroRTTAcrossRestart(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "state")
	st, err := transport.LoadOrCreateState(dir, "", "")
	require.NoError(t, err)
	pin, err := transport.ParseFingerprint(st.Fingerprint())
	require.NoError(t, err)
	cache := &signallingCache{ClientSessionCache: transport.NewStickySessionCache(4), stored: make(chan struct{}, 1)}

	addr, stop := serveOnce(t, st)
	first := dialEarly(t, addr, cache, pin)
	assert.False(t, first.ConnectionState().Used0RTT, "no ticket yet")
	select {
	case <-cache.stored:
	case <-time.After(10 * time.Second):
		t.Fatal("no session ticket received")
	}
	_ = first.CloseWithError(0, "")
	stop()

	// Restart: same state dir, reloaded from disk.
	reloaded, err := transport.LoadOrCreateState(dir, "", "")
	require.NoError(t, err)
	addr, _ = serveOnce(t, reloaded)
	second := dialEarly(t, addr, cache, pin)
	assert.True(t, second.ConnectionState().Used0RTT, "0-RTT accepted by the restarted server")
	assert.True(t, second.ConnectionState().TLS.DidResume)
	_ = second.CloseWithError(0, "")

	// A server with another state dir has another identity: the pin fails.
	other, err := transport.LoadOrCreateState(filepath.Join(t.TempDir(), "other"), "", "")
	require.NoError(t, err)
	addr, _ = serveOnce(t, other)
	ctls, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprint: &pin, SessionCache: cache})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	tr := &quic.Transport{Conn: pc}
	t.Cleanup(func() {
		_ = tr.Close()
		_ = pc.Close()
	})
	_, err = tr.Dial(ctx, addr, ctls, transport.QUICConfig(transport.DefaultQUICOptions()))
	require.Error(t, err)
	assert.ErrorIs(t, err, transport.ErrFingerprintMismatch)
}
