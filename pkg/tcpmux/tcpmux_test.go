package tcpmux_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/sync/errgroup"

	"github.com/quictun/quictun/pkg/tcpmux"
	"github.com/quictun/quictun/pkg/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testTimeout = 30 * time.Second

// tlsPair is quictun's server identity and a client pinned to it.
func tlsPair(t *testing.T) (srv, cli *tls.Config) {
	t.Helper()
	st, err := transport.LoadOrCreateState(t.TempDir(), "", "")
	require.NoError(t, err)
	pin, err := transport.ParseFingerprint(st.Fingerprint())
	require.NoError(t, err)
	cli, err = transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}})
	require.NoError(t, err)
	return transport.ServerTLSConfig(st, nil), cli
}

// pair returns a connected client and server over loopback TCP; a proxy
// between them can be frozen (freeze). Both are closed when the test ends.
func pair(t *testing.T, scfg, ccfg *tcpmux.Config) (cli, srv *tcpmux.Conn, freeze func()) {
	t.Helper()
	stls, ctls := tlsPair(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	p := newProxy(t, ln.Addr().String())
	var g errgroup.Group
	g.Go(func() error {
		nc, err := ln.Accept()
		if err != nil {
			return err
		}
		srv, err = tcpmux.Server(ctx, nc, stls, scfg)
		return err
	})
	cli, err = tcpmux.Dial(ctx, p.addr(), ctls, ccfg)
	require.NoError(t, err)
	require.NoError(t, g.Wait())
	t.Cleanup(func() {
		_ = cli.CloseWithError(0, "")
		_ = srv.CloseWithError(0, "")
	})
	return cli, srv, p.freeze
}

// proxy forwards one TCP connection; freeze stops it forwarding (a peer
// that stalls, as a black-holing middlebox does).
type proxy struct {
	ln     net.Listener
	frozen chan struct{}
	once   sync.Once
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, frozen: make(chan struct{})}
	var wg sync.WaitGroup
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); p.freeze(); close(done); wg.Wait() })
	wg.Go(func() {
		a, err := ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", target)
		if err != nil {
			_ = a.Close()
			return
		}
		var inner sync.WaitGroup
		cp := func(dst, src net.Conn) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				select {
				case <-p.frozen:
					return
				default:
				}
				if n > 0 {
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					if tc, ok := dst.(*net.TCPConn); ok {
						_ = tc.CloseWrite()
					}
					return
				}
			}
		}
		inner.Go(func() { cp(a, b) })
		inner.Go(func() { cp(b, a) })
		<-done
		_ = a.Close()
		_ = b.Close()
		inner.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// freeze stops forwarding; the connections are closed only when the test
// ends, so neither end sees a FIN or RST: a black hole.
func (p *proxy) freeze() {
	p.once.Do(func() { close(p.frozen) })
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// open opens a stream on a, sends one byte so b sees it, and accepts it.
func open(t *testing.T, a, b *tcpmux.Conn) (sa, sb *tcpmux.Stream) {
	t.Helper()
	ctx := ctxT(t)
	sa, err := a.OpenStreamSync(ctx)
	require.NoError(t, err)
	_, err = sa.Write([]byte{'x'})
	require.NoError(t, err)
	sb, err = b.AcceptStream(ctx)
	require.NoError(t, err)
	one := make([]byte, 1)
	_, err = io.ReadFull(sb, one)
	require.NoError(t, err)
	return sa, sb
}

func TestHalfCloseBothWays(t *testing.T) {
	t.Parallel()
	cli, srv, _ := pair(t, nil, nil)
	for _, dir := range []struct {
		name string
		a, b *tcpmux.Conn
	}{{"client opens", cli, srv}, {"server opens", srv, cli}} {
		sa, sb := open(t, dir.a, dir.b)
		// The opener finishes first; the acceptor still answers.
		_, err := sa.Write([]byte("request"))
		require.NoError(t, err)
		require.NoError(t, sa.Close())
		got, err := io.ReadAll(sb)
		require.NoError(t, err, dir.name)
		assert.Equal(t, "request", string(got), dir.name)
		_, err = sb.Write([]byte("response after the peer's FIN"))
		require.NoError(t, err, dir.name)
		require.NoError(t, sb.Close())
		got, err = io.ReadAll(sa)
		require.NoError(t, err, dir.name)
		assert.Equal(t, "response after the peer's FIN", string(got), dir.name)
		assert.Error(t, sa.Context().Err(), "the context ends with the write direction")
		_, err = sa.Write([]byte("late"))
		assert.Error(t, err, "write after Close")
	}
}

func TestResetCodesBothWays(t *testing.T) {
	t.Parallel()
	cli, srv, _ := pair(t, nil, nil)
	for _, dir := range []struct {
		name string
		a, b *tcpmux.Conn
	}{{"client opens", cli, srv}, {"server opens", srv, cli}} {
		sa, sb := open(t, dir.a, dir.b)
		// CancelWrite: the peer's Read fails with the code; the other
		// direction still works (QUIC's RESET_STREAM, not RST_STREAM).
		sa.CancelWrite(42)
		_, err := io.ReadAll(sb)
		var se *quic.StreamError
		require.ErrorAs(t, err, &se, dir.name)
		assert.Equal(t, quic.StreamErrorCode(42), se.ErrorCode)
		assert.True(t, se.Remote)
		assert.Equal(t, sb.StreamID(), se.StreamID)
		_, err = sb.Write([]byte("still open"))
		require.NoError(t, err)
		buf := make([]byte, 10)
		_, err = io.ReadFull(sa, buf)
		require.NoError(t, err)
		assert.Equal(t, "still open", string(buf))

		// CancelRead: the peer's Write fails with the code.
		sa.CancelRead(43)
		require.Eventually(t, func() bool {
			_, err := sb.Write(make([]byte, 1024))
			return errors.As(err, &se)
		}, testTimeout, 10*time.Millisecond, dir.name)
		assert.Equal(t, quic.StreamErrorCode(43), se.ErrorCode)
		assert.True(t, se.Remote)
		_, err = sa.Read(buf)
		require.ErrorAs(t, err, &se)
		assert.False(t, se.Remote, "a local CancelRead")
	}
	// Both ended on both sides: nothing is left open.
	require.Eventually(t, func() bool {
		s, err := cli.OpenStream()
		if err != nil {
			return false
		}
		s.CancelWrite(0)
		s.CancelRead(0)
		return true
	}, testTimeout, 10*time.Millisecond)
}

// transfer sends n pseudo-random bytes on w in chunks and returns their hash.
func transfer(w io.WriteCloser, n int64, seed uint64) ([32]byte, error) {
	h := sha256.New()
	src := rand.NewChaCha8([32]byte{byte(seed)})
	buf := make([]byte, 32<<10)
	for n > 0 {
		m := min(int64(len(buf)), n)
		_, _ = src.Read(buf[:m])
		h.Write(buf[:m])
		if _, err := w.Write(buf[:m]); err != nil {
			return [32]byte{}, err
		}
		n -= m
	}
	return [32]byte(h.Sum(nil)), w.Close()
}

func hashAll(r io.Reader) ([32]byte, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return [32]byte(h.Sum(nil)), n, err
}

func Test100MBWithHash(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("100 MB each way")
	}
	size := int64(100 << 20)
	if raceEnabled {
		size = 20 << 20
	}
	cli, srv, _ := pair(t, nil, nil)
	sa, sb := open(t, cli, srv)
	var g errgroup.Group
	var sentUp, sentDown, gotUp, gotDown [32]byte
	var nUp, nDown int64
	g.Go(func() (err error) { sentUp, err = transfer(sa, size, 1); return })
	g.Go(func() (err error) { sentDown, err = transfer(sb, size, 2); return })
	g.Go(func() (err error) { gotUp, nUp, err = hashAll(sb); return })
	g.Go(func() (err error) { gotDown, nDown, err = hashAll(sa); return })
	require.NoError(t, g.Wait())
	assert.Equal(t, size, nUp)
	assert.Equal(t, size, nDown)
	assert.Equal(t, sentUp, gotUp, "upstream hash")
	assert.Equal(t, sentDown, gotDown, "downstream hash")
}

func TestManyConcurrentStreams(t *testing.T) {
	t.Parallel()
	const size = 64 << 10
	streams := 300
	if raceEnabled {
		streams = 100
	}
	// More streams than the server admits at once: OpenStreamSync waits
	// for a slot; small windows make flow control work.
	scfg := &tcpmux.Config{MaxIncomingStreams: 20, StreamReceiveWindow: 16 << 10, ConnReceiveWindow: 128 << 10}
	cli, srv, _ := pair(t, scfg, nil)
	ctx := ctxT(t)
	var g errgroup.Group
	g.Go(func() error { // echo server
		var eg errgroup.Group
		for range streams {
			s, err := srv.AcceptStream(ctx)
			if err != nil {
				return err
			}
			eg.Go(func() error {
				if _, err := io.Copy(s, s); err != nil {
					return err
				}
				return s.Close()
			})
		}
		return eg.Wait()
	})
	for i := range streams {
		g.Go(func() error {
			s, err := cli.OpenStreamSync(ctx)
			if err != nil {
				return err
			}
			var sent [32]byte
			var eg errgroup.Group
			eg.Go(func() (err error) { sent, err = transfer(s, size, uint64(i)); return })
			got, n, err := hashAll(s)
			if err := eg.Wait(); err != nil {
				return err
			}
			if err != nil || n != size || got != sent {
				return errors.Join(err, errors.New("echo differs"))
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
}

func TestStreamLimitAndRaise(t *testing.T) {
	t.Parallel()
	cli, srv, _ := pair(t, &tcpmux.Config{MaxIncomingStreams: 2}, nil)
	ctx := ctxT(t)
	for range 2 {
		_, err := cli.OpenStream()
		require.NoError(t, err)
	}
	_, err := cli.OpenStream()
	require.ErrorIs(t, err, tcpmux.ErrStreamLimit)
	srv.RaiseMaxIncomingStreams(3)
	require.Eventually(t, func() bool {
		s, err := cli.OpenStream()
		if err != nil {
			return false
		}
		_, err = s.Write([]byte("x"))
		return err == nil
	}, testTimeout, 10*time.Millisecond)
	for range 3 {
		_, err := srv.AcceptStream(ctx)
		require.NoError(t, err)
	}
}

func TestDeadlines(t *testing.T) {
	t.Parallel()
	cli, srv, _ := pair(t, &tcpmux.Config{StreamReceiveWindow: 16 << 10}, nil)
	sa, _ := open(t, cli, srv)
	require.NoError(t, sa.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err := sa.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	// The server reads nothing: the write blocks on flow control until its
	// deadline.
	require.NoError(t, sa.SetWriteDeadline(time.Now().Add(100*time.Millisecond)))
	n, err := sa.Write(make([]byte, 1<<20))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.Less(t, n, 1<<20)
	// A blocked Read is released by a deadline set from elsewhere.
	require.NoError(t, sa.SetReadDeadline(time.Time{}))
	done := make(chan error, 1)
	go func() { _, err := sa.Read(make([]byte, 1)); done <- err }()
	require.NoError(t, sa.SetReadDeadline(time.Now()))
	require.ErrorIs(t, <-done, os.ErrDeadlineExceeded)
}

func TestCloseWithErrorCode(t *testing.T) {
	t.Parallel()
	cli, srv, _ := pair(t, nil, nil)
	sa, _ := open(t, cli, srv)
	require.NoError(t, srv.CloseWithError(7, "going away"))
	<-cli.Context().Done()
	var app *quic.ApplicationError
	require.ErrorAs(t, context.Cause(cli.Context()), &app)
	assert.True(t, app.Remote)
	assert.Equal(t, quic.ApplicationErrorCode(7), app.ErrorCode)
	assert.Equal(t, "going away", app.ErrorMessage)
	_, err := sa.Read(make([]byte, 1))
	require.ErrorAs(t, err, &app)
	_, err = cli.AcceptStream(ctxT(t))
	require.ErrorAs(t, err, &app)
	require.ErrorAs(t, context.Cause(srv.Context()), &app)
	assert.False(t, app.Remote)
}

func TestIdentityAndPinning(t *testing.T) {
	t.Parallel()
	cli, srv, _ := pair(t, nil, nil)
	assert.Equal(t, tcpmux.ALPN, cli.TLS().NegotiatedProtocol)
	assert.Equal(t, uint16(tls.VersionTLS13), srv.TLS().Version)
	assert.NotEmpty(t, cli.TLS().PeerCertificates)
	assert.NotNil(t, srv.RemoteAddr())
}

func TestWrongPinRefused(t *testing.T) {
	t.Parallel()
	stls, _ := tlsPair(t)
	_, other := tlsPair(t) // pinned to another server
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	ctx := ctxT(t)
	srvErr := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		_, err = tcpmux.Server(ctx, nc, stls, nil)
		srvErr <- err
	}()
	_, err = tcpmux.Dial(ctx, ln.Addr().String(), other, nil)
	require.ErrorIs(t, err, transport.ErrFingerprintMismatch)
	require.Error(t, <-srvErr)
}

// serverOn accepts one connection on ln and runs the server handshake.
func serverOn(t *testing.T, ln net.Listener, stls *tls.Config, cfg *tcpmux.Config) chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		c, err := tcpmux.Server(ctxT(t), nc, stls, cfg)
		if err == nil {
			// The handshake passed: the connection must then fail.
			<-c.Context().Done()
			err = context.Cause(c.Context())
			_ = c.CloseWithError(0, "")
		}
		done <- err
	}()
	return done
}

func TestGarbageAndStallingPeers(t *testing.T) {
	t.Parallel()
	stls, ctls := tlsPair(t)
	cfg := &tcpmux.Config{HandshakeTimeout: 300 * time.Millisecond, IdleTimeout: 500 * time.Millisecond}
	tlsClient := func(t *testing.T, addr string) *tls.Conn {
		conf := ctls.Clone()
		conf.NextProtos = []string{tcpmux.ALPN}
		tc, err := tls.Dial("tcp", addr, conf)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tc.Close() })
		return tc
	}
	cases := []struct {
		name string
		peer func(t *testing.T, addr string)
		want func(t *testing.T, err error)
	}{
		{"plain text instead of TLS", func(t *testing.T, addr string) {
			nc, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			t.Cleanup(func() { _ = nc.Close() })
			_, _ = nc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		}, func(t *testing.T, err error) { require.ErrorContains(t, err, "tls handshake") }},
		{"silent after TCP connect", func(t *testing.T, addr string) {
			nc, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			t.Cleanup(func() { _ = nc.Close() })
		}, func(t *testing.T, err error) { require.ErrorContains(t, err, "tls handshake") }},
		{"silent after TLS", func(t *testing.T, addr string) {
			tc := tlsClient(t, addr)
			require.NoError(t, tc.Handshake())
		}, func(t *testing.T, err error) { require.ErrorContains(t, err, "preface") }},
		{"bad preface", func(t *testing.T, addr string) {
			tc := tlsClient(t, addr)
			_, _ = tc.Write([]byte("PRI * HTTP/1.1\r\n\r\nXX\r\n\r\n"))
		}, func(t *testing.T, err error) {
			var pe *tcpmux.ProtocolError
			require.ErrorAs(t, err, &pe)
		}},
		{"garbage frames after the preface", func(t *testing.T, addr string) {
			tc := tlsClient(t, addr)
			fr := http2.NewFramer(tc, tc)
			_, _ = tc.Write([]byte(http2.ClientPreface))
			_ = fr.WriteSettings()
			_, _ = tc.Write([]byte{0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1}) // a 16 MiB DATA frame header
		}, func(t *testing.T, err error) {
			var pe *tcpmux.ProtocolError
			require.ErrorAs(t, err, &pe)
		}},
		{"data beyond the window", func(t *testing.T, addr string) {
			tc := tlsClient(t, addr)
			fr := http2.NewFramer(tc, tc)
			_, _ = tc.Write([]byte(http2.ClientPreface))
			_ = fr.WriteSettings()
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x83}, EndHeaders: true})
			for range 40 { // 40 x 16 KiB: over the 512 KiB stream window below
				if fr.WriteData(1, false, make([]byte, 16384)) != nil {
					return
				}
			}
		}, func(t *testing.T, err error) {
			var pe *tcpmux.ProtocolError
			require.ErrorAs(t, err, &pe)
			assert.Contains(t, pe.Reason, "flow-control")
		}},
		{"stalls after the handshake", func(t *testing.T, addr string) {
			tc := tlsClient(t, addr)
			fr := http2.NewFramer(tc, tc)
			_, _ = tc.Write([]byte(http2.ClientPreface))
			_ = fr.WriteSettings()
		}, func(t *testing.T, err error) {
			var idle *quic.IdleTimeoutError
			require.ErrorAs(t, err, &idle)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer func() { _ = ln.Close() }()
			c := *cfg
			c.StreamReceiveWindow = 512 << 10
			done := serverOn(t, ln, stls, &c)
			tc.peer(t, ln.Addr().String())
			select {
			case err := <-done:
				require.Error(t, err)
				tc.want(t, err)
			case <-time.After(testTimeout):
				t.Fatal("the server side did not give up")
			}
		})
	}
}

func TestFrozenPeerIdleTimeout(t *testing.T) {
	t.Parallel()
	cfg := &tcpmux.Config{IdleTimeout: 500 * time.Millisecond}
	cli, srv, freeze := pair(t, cfg, cfg)
	sa, _ := open(t, cli, srv)
	freeze()
	// Both ends see silence and give up, and a Read blocked on the stream
	// returns.
	_, err := sa.Read(make([]byte, 1))
	var idle *quic.IdleTimeoutError
	require.ErrorAs(t, err, &idle)
	<-srv.Context().Done()
	require.ErrorAs(t, context.Cause(srv.Context()), &idle)
}

func TestKeepAliveKeepsIdleConnection(t *testing.T) {
	t.Parallel()
	cfg := &tcpmux.Config{IdleTimeout: 600 * time.Millisecond, KeepAlivePeriod: 100 * time.Millisecond}
	cli, srv, _ := pair(t, cfg, cfg)
	time.Sleep(2 * time.Second) // several idle timeouts without traffic
	assert.NoError(t, cli.Context().Err())
	assert.NoError(t, srv.Context().Err())
	open(t, cli, srv)
}
