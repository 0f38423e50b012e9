package transport_test

import (
	"context"
	"crypto/tls"
	"net"
	"os"
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

func newSignallingCache(c tls.ClientSessionCache) *signallingCache {
	return &signallingCache{ClientSessionCache: c, stored: make(chan struct{}, 1)}
}

// waitStored waits (at most 10 s) until a ticket was stored.
func (c *signallingCache) waitStored(t *testing.T) {
	t.Helper()
	select {
	case <-c.stored:
	case <-time.After(10 * time.Second):
		t.Fatal("no session ticket received")
	}
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
	return serveTLS(t, st, transport.ServerTLSConfig(st, nil))
}

// serveTLS is serveOnce with the TLS configuration conf.
func serveTLS(t *testing.T, st *transport.State, conf *tls.Config) (net.Addr, func()) {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	tr := &quic.Transport{Conn: pc, StatelessResetKey: &st.ResetKey, TokenGeneratorKey: &st.TokenKey}
	ln, err := tr.ListenEarly(conf, transport.QUICConfig(transport.DefaultQUICOptions()))
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
	conn, err := dialPins(t, true, addr, cache, pin)
	require.NoError(t, err)
	return conn
}

// dialPins dials addr from a new socket with a client pinning pins, using
// cache, and returns the outcome once the handshake is complete. early
// dials with 0-RTT when cache holds a ticket.
func dialPins(t *testing.T, early bool, addr net.Addr, cache tls.ClientSessionCache, pins ...[32]byte) (*quic.Conn, error) {
	t.Helper()
	ctls, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: pins, SessionCache: cache})
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
	dial := tr.Dial
	if early {
		dial = tr.DialEarly
	}
	conn, err := dial(ctx, addr, ctls, transport.QUICConfig(transport.DefaultQUICOptions()))
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = conn.CloseWithError(0, "") })
	select {
	case <-conn.HandshakeComplete():
	case <-ctx.Done():
		t.Fatal("handshake did not complete")
	}
	return conn, nil
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
	cache := newSignallingCache(transport.NewStickySessionCache(4))

	addr, stop := serveOnce(t, st)
	first := dialEarly(t, addr, cache, pin)
	assert.False(t, first.ConnectionState().Used0RTT, "no ticket yet")
	cache.waitStored(t)
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
	ctls, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}, SessionCache: cache})
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

// TestStatelessResetAfterRestart checks the stateless-reset key's purpose: a
// server that lost its connections (crash) and restarts on the same port with
// the same state tells the client at once, instead of at its idle timeout.
func TestStatelessResetAfterRestart(t *testing.T) {
	t.Parallel()
	st, err := transport.LoadOrCreateState(filepath.Join(t.TempDir(), "state"), "", "")
	require.NoError(t, err)
	pin, err := transport.ParseFingerprint(st.Fingerprint())
	require.NoError(t, err)
	qconf := transport.QUICConfig(transport.DefaultQUICOptions())

	// The "crashed" server: its socket vanishes without CONNECTION_CLOSE.
	pc1, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	addr := pc1.LocalAddr().(*net.UDPAddr)
	tr1 := &quic.Transport{Conn: pc1, StatelessResetKey: &st.ResetKey, TokenGeneratorKey: &st.TokenKey}
	ln1, err := tr1.Listen(transport.ServerTLSConfig(st, nil), qconf)
	require.NoError(t, err)

	ctls, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}})
	require.NoError(t, err)
	cpc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	ctr := &quic.Transport{Conn: cpc}
	t.Cleanup(func() {
		_ = ctr.Close()
		_ = cpc.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := ctr.Dial(ctx, addr, ctls, qconf)
	require.NoError(t, err)
	_, err = ln1.Accept(ctx)
	require.NoError(t, err)
	require.NoError(t, pc1.Close()) // crash: no CONNECTION_CLOSE reaches the client
	t.Cleanup(func() {
		_ = ln1.Close()
		_ = tr1.Close()
	})

	// Restart on the same port with the same keys.
	var pc2 *net.UDPConn
	require.Eventually(t, func() bool {
		pc2, err = net.ListenUDP("udp", addr)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	tr2 := &quic.Transport{Conn: pc2, StatelessResetKey: &st.ResetKey, TokenGeneratorKey: &st.TokenKey}
	ln2, err := tr2.Listen(transport.ServerTLSConfig(st, nil), qconf)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = ln2.Close()
		_ = tr2.Close()
		_ = pc2.Close()
	})

	// The client sends something; the new server answers with a stateless reset.
	str, err := conn.OpenStream()
	require.NoError(t, err)
	_, err = str.Write(make([]byte, 1200))
	require.NoError(t, err)
	select {
	case <-conn.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not learn of the restart (idle timeout is 90 s)")
	}
	var sr *quic.StatelessResetError
	assert.ErrorAs(t, context.Cause(conn.Context()), &sr)
}

// TestTicketOfAnUnpinnedCertificate: a server that rotated its certificate
// but kept its session-ticket key (the state dir's) still resumes sessions
// made with the old certificate, and a resumed session shows the old one.
// A client that now pins only the new certificate must not be stuck on its
// ticket (the sticky cache keeps tickets of failed handshakes): its tickets
// are kept per pin set, so it does a full handshake and verifies the new
// certificate, while a client that still pins the old one resumes.
func TestTicketOfAnUnpinnedCertificate(t *testing.T) {
	t.Parallel()
	oldDir, newDir := filepath.Join(t.TempDir(), "old"), filepath.Join(t.TempDir(), "new")
	oldSt, err := transport.LoadOrCreateState(oldDir, "", "")
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(newDir, 0o700))
	b, err := os.ReadFile(filepath.Join(oldDir, transport.TicketKeyFileName))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(newDir, transport.TicketKeyFileName), b, 0o600))
	newSt, err := transport.LoadOrCreateState(newDir, "", "") // a new certificate, the same ticket key
	require.NoError(t, err)
	oldPin, err := transport.ParseFingerprint(oldSt.Fingerprint())
	require.NoError(t, err)
	newPin, err := transport.ParseFingerprint(newSt.Fingerprint())
	require.NoError(t, err)
	cache := newSignallingCache(transport.NewStickySessionCache(4))

	addr, stop := serveOnce(t, oldSt)
	c, err := dialPins(t, false, addr, cache, oldPin)
	require.NoError(t, err)
	cache.waitStored(t)
	_ = c.CloseWithError(0, "")
	stop()

	addr, _ = serveOnce(t, newSt)
	for i := range 2 {
		c, err := dialPins(t, false, addr, cache, newPin)
		if !assert.NoError(t, err, "dial %d pinning only the new certificate", i) {
			continue
		}
		assert.Equal(t, newSt.Cert.Certificate[0], c.ConnectionState().TLS.PeerCertificates[0].Raw, "dial %d saw the new certificate", i)
	}
	c, err = dialPins(t, false, addr, cache, oldPin)
	require.NoError(t, err, "the old pin set still has its ticket")
	assert.True(t, c.ConnectionState().TLS.DidResume, "resumed the old certificate's session")
}
