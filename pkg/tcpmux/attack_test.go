package tcpmux_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"

	"github.com/quictun/quictun/pkg/tcpmux"
)

// The attacks an HTTP/2 peer can make without sending data, each against a
// server whose application is busy elsewhere (it accepts no stream, as the
// quictun server does while its pre-authentication slots are taken) or
// accepts streams but has not read them yet. Ported from the attack classes
// net/http2 and nghttp2 defend against: rapid reset (CVE-2023-44487),
// refused-stream, SETTINGS, PING, empty DATA, PRIORITY, window update,
// unknown-frame and CONTINUATION floods.

// attacker is a raw HTTP/2 peer on TLS: it has done the preface and sent
// its SETTINGS. goaway receives the code of the server's GOAWAY.
type attacker struct {
	fr     *http2.Framer
	goaway chan http2.ErrCode
}

// attack connects a raw peer to a tcpmux server with cfg; the server's
// Conn comes on the returned channel (nil when its handshake failed). The
// peer reads (and drops) everything the server writes, so the server's
// answers never back up. Everything is closed when the test ends.
func attack(t *testing.T, cfg *tcpmux.Config) (*attacker, <-chan *tcpmux.Conn) {
	t.Helper()
	stls, ctls := tlsPair(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	srv := make(chan *tcpmux.Conn, 1)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	wg.Go(func() {
		nc, err := ln.Accept()
		if err != nil {
			srv <- nil
			return
		}
		c, err := tcpmux.Server(ctxT(t), nc, stls, cfg)
		if err != nil {
			c = nil
		} else {
			t.Cleanup(func() { _ = c.CloseWithError(0, "") })
		}
		srv <- c
	})
	conf := ctls.Clone()
	conf.NextProtos = []string{tcpmux.ALPN}
	tc, err := tls.Dial("tcp", ln.Addr().String(), conf)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tc.Close() })
	_, err = tc.Write([]byte(http2.ClientPreface))
	require.NoError(t, err)
	a := &attacker{fr: http2.NewFramer(tc, nil), goaway: make(chan http2.ErrCode, 1)}
	require.NoError(t, a.fr.WriteSettings())
	rd := http2.NewFramer(nil, tc)
	wg.Go(func() {
		for {
			f, err := rd.ReadFrame()
			if err != nil {
				return
			}
			if g, ok := f.(*http2.GoAwayFrame); ok {
				select {
				case a.goaway <- g.ErrCode:
				default:
				}
			}
		}
	})
	return a, srv
}

// closedWith waits for the server connection to close and returns why.
func closedWith(t *testing.T, c *tcpmux.Conn) error {
	t.Helper()
	select {
	case <-c.Context().Done():
		return context.Cause(c.Context())
	case <-time.After(testTimeout):
		t.Fatal("the server kept the connection open")
		return nil
	}
}

func TestFloodsCloseTheConnection(t *testing.T) {
	t.Parallel()
	const n = 5000 // frames of each kind: five times any budget
	block := []byte{0x83, 0x87, 0x84}
	headers := func(fr *http2.Framer, id uint32, end bool) error {
		return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true, EndStream: end})
	}
	flood := func(send func(i uint32) error) func(*http2.Framer) {
		return func(*http2.Framer) {
			for i := range uint32(n) {
				if send(i) != nil {
					return
				}
			}
		}
	}
	cases := []struct {
		name   string
		accept bool // the application accepts every stream (and reads none)
		send   func(fr *http2.Framer) func(*http2.Framer)
		flood  bool // closed as a flood (else a protocol error)
	}{
		{name: "rapid reset, nothing accepted", flood: true, send: func(fr *http2.Framer) func(*http2.Framer) {
			return flood(func(i uint32) error {
				if err := headers(fr, 2*i+1, false); err != nil {
					return err
				}
				return fr.WriteRSTStream(2*i+1, http2.ErrCodeCancel)
			})
		}},
		{name: "rapid reset, accepted and unread", accept: true, flood: true, send: func(fr *http2.Framer) func(*http2.Framer) {
			return flood(func(i uint32) error {
				if err := headers(fr, 2*i+1, false); err != nil {
					return err
				}
				return fr.WriteRSTStream(2*i+1, http2.ErrCodeCancel)
			})
		}},
		{name: "rapid reset with END_STREAM", flood: true, send: func(fr *http2.Framer) func(*http2.Framer) {
			return flood(func(i uint32) error {
				if err := headers(fr, 2*i+1, true); err != nil {
					return err
				}
				return fr.WriteRSTStream(2*i+1, http2.ErrCodeCancel)
			})
		}},
		{name: "streams over the limit", flood: true, send: func(fr *http2.Framer) func(*http2.Framer) {
			return flood(func(i uint32) error { return headers(fr, 2*i+1, false) })
		}},
		{name: "PING", flood: true, send: func(fr *http2.Framer) func(*http2.Framer) {
			return flood(func(uint32) error { return fr.WritePing(false, [8]byte{1}) })
		}},
		{name: "SETTINGS", flood: true, send: func(fr *http2.Framer) func(*http2.Framer) {
			return flood(func(uint32) error {
				return fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
			})
		}},
		{name: "PRIORITY", flood: true, send: func(fr *http2.Framer) func(*http2.Framer) {
			return flood(func(i uint32) error {
				return fr.WritePriority(2*i+1, http2.PriorityParam{StreamDep: 0, Weight: 15})
			})
		}},
		{name: "empty DATA", flood: true, send: func(fr *http2.Framer) func(*http2.Framer) {
			if headers(fr, 1, false) != nil {
				return func(*http2.Framer) {}
			}
			return flood(func(uint32) error { return fr.WriteData(1, false, nil) })
		}},
		{name: "one-byte window updates", flood: true, send: func(fr *http2.Framer) func(*http2.Framer) {
			return flood(func(uint32) error { return fr.WriteWindowUpdate(0, 1) })
		}},
		{name: "unknown extension frames", flood: true, send: func(fr *http2.Framer) func(*http2.Framer) {
			return flood(func(uint32) error { return fr.WriteRawFrame(0xa0, 0, 0, []byte("x")) })
		}},
		{name: "SETTINGS of 10,000 entries", send: func(fr *http2.Framer) func(*http2.Framer) {
			s := make([]http2.Setting, 10000)
			for i := range s {
				s[i] = http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(i)}
			}
			return func(*http2.Framer) { _ = fr.WriteSettings(s...) }
		}},
		{name: "SETTINGS with duplicates", send: func(fr *http2.Framer) func(*http2.Framer) {
			return func(*http2.Framer) {
				_ = fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 15},
					http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 14})
			}
		}},
		{name: "CONTINUATION", send: func(fr *http2.Framer) func(*http2.Framer) {
			return func(*http2.Framer) {
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block})
				for range n {
					if fr.WriteContinuation(1, false, []byte{0x84}) != nil {
						return
					}
				}
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const limit = 16
			a, srvc := attack(t, &tcpmux.Config{MaxIncomingStreams: limit})
			srv := <-srvc
			require.NotNil(t, srv)
			accepted := make(chan int, 1)
			go func() {
				if !tc.accept {
					// The application is busy: it accepts nothing until
					// the connection ends, then counts the queue.
					<-srv.Context().Done()
				}
				got := 0
				for {
					if _, err := srv.AcceptStream(context.Background()); err != nil {
						accepted <- got
						return
					}
					got++
				}
			}()
			tc.send(a.fr)(a.fr)
			err := closedWith(t, srv)
			var fe *tcpmux.FloodError
			var pe *tcpmux.ProtocolError
			if tc.flood {
				require.ErrorAs(t, err, &fe)
			} else {
				require.ErrorAs(t, err, &pe)
			}
			select {
			case code := <-a.goaway:
				if tc.flood {
					assert.Equal(t, http2.ErrCodeEnhanceYourCalm, code)
				} else {
					assert.Equal(t, http2.ErrCodeProtocol, code)
				}
			case <-time.After(testTimeout):
				t.Error("no GOAWAY")
			}
			// Never more streams in the accept queue than the limit: a
			// reset stream holds its place until it is accepted.
			if !tc.accept {
				assert.LessOrEqual(t, <-accepted, limit)
			} else {
				<-accepted
			}
		})
	}
}

// TestLegitimateResetsAreFree: streams reset after they were read cost
// nothing: 3,000 streams (three times the reset budget), opened by either
// side, each written, read and then reset both ways, leave the connection
// open.
func TestLegitimateResetsAreFree(t *testing.T) {
	t.Parallel()
	cli, srv, _ := pair(t, &tcpmux.Config{MaxIncomingStreams: 16}, &tcpmux.Config{MaxIncomingStreams: 16})
	for i := range 3000 {
		opener, acceptor := cli, srv
		if i%2 == 1 {
			opener, acceptor = srv, cli
		}
		a, b := open(t, opener, acceptor)
		a.CancelWrite(7)
		b.CancelWrite(7)
		a.CancelRead(7)
		b.CancelRead(7)
	}
	s, err := cli.OpenStreamSync(ctxT(t))
	require.NoError(t, err, "the connection survived")
	_, err = s.Write([]byte("x"))
	require.NoError(t, err)
	require.NoError(t, context.Cause(srv.Context()))
	require.NoError(t, context.Cause(cli.Context()))
}

// TestInitialWindowsUntilOpened: before OpenReceiveWindows a peer may send
// only the initial windows (more is a flow-control error); after it, the
// full ones, and data written while the small window was in force arrives
// whole.
func TestInitialWindowsUntilOpened(t *testing.T) {
	t.Parallel()
	small := &tcpmux.Config{InitialStreamReceiveWindow: 16 << 10, InitialConnReceiveWindow: 64 << 10}
	t.Run("a raw peer over the initial window", func(t *testing.T) {
		t.Parallel()
		a, srvc := attack(t, small)
		srv := <-srvc
		require.NotNil(t, srv)
		require.NoError(t, a.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x83}, EndHeaders: true}))
		for range 2 {
			if a.fr.WriteData(1, false, make([]byte, 16<<10)) != nil {
				break
			}
		}
		var pe *tcpmux.ProtocolError
		require.ErrorAs(t, closedWith(t, srv), &pe)
		assert.Contains(t, pe.Reason, "flow-control")
	})
	t.Run("opened while a writer waits", func(t *testing.T) {
		t.Parallel()
		cli, srv, _ := pair(t, small, nil)
		ctx := ctxT(t)
		const size = 4 << 20
		s, err := cli.OpenStreamSync(ctx)
		require.NoError(t, err)
		sum := make(chan [32]byte, 1)
		go func() {
			h, err := transfer(s, size, 1)
			assert.NoError(t, err)
			sum <- h
		}()
		b, err := srv.AcceptStream(ctx)
		require.NoError(t, err)
		first := make([]byte, 8<<10)
		_, err = io.ReadFull(b, first)
		require.NoError(t, err)
		srv.OpenReceiveWindows() // while the writer waits for credit
		got, m, err := hashAll(io.MultiReader(bytes.NewReader(first), b))
		require.NoError(t, err)
		assert.Equal(t, int64(size), m)
		assert.Equal(t, <-sum, got)
	})
}
