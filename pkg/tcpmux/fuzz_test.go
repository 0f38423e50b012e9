package tcpmux

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
)

// FuzzFrameSequences feeds a server connection a sequence of frames made
// from the input (any type, flags, stream ID and payload, so also malformed
// ones), while its application accepts streams and reads, closes or resets
// them, and checks after every sequence that nothing is unbounded or
// miscounted: the accept queue and the peer's open streams stay within the
// limit, the open-stream count matches the streams held, the control queue
// within its bound. A panic, a deadlock (the test's deadline) or a broken
// invariant fails it. `make fuzz` runs it; CI runs it for a bounded time.
func FuzzFrameSequences(f *testing.F) {
	seed := func(frames ...[]byte) []byte {
		var b []byte
		for _, fr := range frames {
			b = append(b, fr...)
		}
		return b
	}
	// Each frame in the input: type, flags, stream ID (one byte), payload
	// length (one byte), payload.
	frame := func(typ http2.FrameType, flags http2.Flags, id byte, p ...byte) []byte {
		return append([]byte{byte(typ), byte(flags), id, byte(len(p))}, p...)
	}
	hdr := func(id byte) []byte {
		return frame(http2.FrameHeaders, http2.FlagHeadersEndHeaders, id, 0x83, 0x87, 0x84)
	}
	rst := func(id byte) []byte { return frame(http2.FrameRSTStream, 0, id, 0, 0, 0, 8) }
	f.Add(seed(hdr(1), rst(1), hdr(3), rst(3), hdr(5), rst(5)))
	f.Add(seed(hdr(1), frame(http2.FrameData, 0, 1, 'h', 'i'), frame(http2.FrameData, http2.FlagDataEndStream, 1)))
	f.Add(seed(hdr(1), frame(frameResetWrite, 0, 1, 0, 0, 0, 9), frame(frameStopSending, 0, 1, 0, 0, 0, 9)))
	f.Add(seed(frame(http2.FrameSettings, 0, 0, 0, 4, 0, 0, 0, 1, 0, 4, 0, 0, 0, 2), frame(http2.FramePing, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8)))
	f.Add(seed(frame(http2.FrameWindowUpdate, 0, 0, 0, 0, 0, 1), hdr(7), frame(http2.FramePriority, 0, 7, 0, 0, 0, 0, 5)))
	f.Add(seed(hdr(1), hdr(3), hdr(5), hdr(7), hdr(9), rst(9), frame(http2.FrameGoAway, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)))
	f.Fuzz(func(t *testing.T, in []byte) {
		c, peer := fuzzConn(t)
		app := fuzzApp(c)
		fw := http2.NewFramer(peer.w, nil)
		for len(in) >= 4 {
			typ, flags, id, n := http2.FrameType(in[0]), http2.Flags(in[1]), uint32(in[2]), int(in[3])
			in = in[4:]
			n = min(n, len(in))
			if fw.WriteRawFrame(typ, flags, id, in[:n]) != nil {
				break
			}
			in = in[n:]
		}
		peer.sync(fw) // every frame handled, or the connection closed
		c.checkInvariants(t)
		_ = peer.w.Close() // first: no lingering close on a pipe
		_ = c.CloseWithError(0, "")
		app.Wait()
		peer.wg.Wait()
	})
}

// fuzzPeer is the raw peer's end of the pipe; its reader drops what the
// connection writes, and tells sync when its PING comes back.
type fuzzPeer struct {
	w      net.Conn
	pong   chan struct{}
	closed chan struct{} // the connection closed its end: the reader returned
	wg     sync.WaitGroup
}

var syncPing = [8]byte{'s', 'y', 'n', 'c'}

// fuzzConn is a server connection over a pipe (no TLS: the frames are the
// subject), with the preface exchange done.
func fuzzConn(t *testing.T) (*Conn, *fuzzPeer) {
	srv, cli := net.Pipe()
	p := &fuzzPeer{w: cli, pong: make(chan struct{}, 1), closed: make(chan struct{})}
	p.wg.Go(func() {
		defer close(p.closed)
		fr := http2.NewFramer(nil, cli)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if pf, ok := f.(*http2.PingFrame); ok && pf.IsAck() && pf.Data == syncPing {
				p.pong <- struct{}{}
			}
		}
	})
	p.wg.Go(func() {
		_, _ = cli.Write([]byte(http2.ClientPreface))
		_ = http2.NewFramer(cli, nil).WriteSettings()
	})
	ctx := context.Background()
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	o := (&Config{MaxIncomingStreams: 4, StreamReceiveWindow: 1 << 10, ConnReceiveWindow: 4 << 10,
		InitialStreamReceiveWindow: 512, InitialConnReceiveWindow: 2 << 10}).complete()
	c, err := start(ctx, hctx, srv, tls.ConnectionState{}, o, false)
	require.NoError(t, err)
	return c, p
}

// sync waits until the connection has handled every frame written before
// (its answer to a PING comes after them), or has closed.
func (p *fuzzPeer) sync(fw *http2.Framer) {
	if fw.WritePing(false, syncPing) != nil {
		return
	}
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-p.pong:
	case <-p.closed:
	case <-t.C:
	}
}

// fuzzApp accepts the connection's streams and treats each by its ID:
// read to the end, close, cancel both ways, or leave it.
func fuzzApp(c *Conn) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			s, err := c.AcceptStream(context.Background())
			if err != nil {
				return
			}
			switch s.id % 8 {
			case 1:
				wg.Go(func() { _, _ = io.Copy(io.Discard, s) })
			case 3:
				_ = s.Close()
			case 5:
				s.CancelRead(1)
				s.CancelWrite(1)
			case 7: // left open, unread: the window bounds it
			}
			if s.id%4 == 1 {
				c.OpenReceiveWindows()
			}
		}
	})
	return &wg
}

// checkInvariants checks the bounds and the stream accounting.
func (c *Conn) checkInvariants(t *testing.T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	require.LessOrEqual(t, int64(len(c.accepted)), c.maxIncoming, "accept queue over the limit")
	require.LessOrEqual(t, c.remoteOpen, c.maxIncoming, "peer's open streams over the limit")
	held := int64(0)
	for _, s := range c.streams {
		if !s.local {
			held++
		}
	}
	for _, s := range c.accepted {
		if s.ended {
			held++ // ended, counted until accepted
		}
	}
	if c.closeErr == nil {
		require.Equal(t, held, c.remoteOpen, "open-stream count")
	}
	require.LessOrEqual(t, len(c.ctrl), maxQueuedControlFrames)
	var buffered int64
	for _, s := range c.streams {
		buffered += s.buffered
		require.LessOrEqual(t, s.buffered, int64(c.streamWindow), "stream buffer over its window")
	}
	require.LessOrEqual(t, buffered, int64(c.connWindow), "buffers over the connection window")
}
