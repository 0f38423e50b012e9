package tcpmux

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"testing"

	"golang.org/x/net/http2"
)

// BenchmarkSettingsFrame is the cost of the largest SETTINGS frame a peer
// may send (100 entries, each changing the initial window) on a connection
// with 9,000 open streams (issue 30 R4: before the one-pass apply, a frame of
// 10,920 such entries cost 10,920 walks over the streams). One op is one
// frame of 600 bytes; about 109 of them make 64 KiB.
func BenchmarkSettingsFrame(b *testing.B) {
	srv, cli := net.Pipe()
	defer func() { _ = srv.Close(); _ = cli.Close() }()
	c := newConn(srv, tls.ConnectionState{}, (&Config{MaxIncomingStreams: 10000}).complete(), false)
	c.ctx, c.cancel = context.WithCancelCause(context.Background())
	defer c.cancel(nil)
	for i := range uint32(9000) {
		c.newStreamLocked(2*i+1, false)
	}
	var buf bytes.Buffer
	fw := http2.NewFramer(&buf, nil)
	// Duplicates are refused: one entry changes the window, the rest are
	// unknown IDs (read and ignored).
	s := make([]http2.Setting, 0, maxSettingsEntries)
	for i := range maxSettingsEntries {
		id := http2.SettingID(0x10 + i)
		if i == 0 {
			id = http2.SettingInitialWindowSize
		}
		s = append(s, http2.Setting{ID: id, Val: 65535})
	}
	for i := range b.N {
		buf.Reset()
		s[0].Val = uint32(65535 + i%2) // the window moves every frame
		if err := fw.WriteSettings(s...); err != nil {
			b.Fatal(err)
		}
		f, err := http2.NewFramer(nil, &buf).ReadFrame()
		if err != nil {
			b.Fatal(err)
		}
		c.mu.Lock()
		err = c.applySettingsLocked(f.(*http2.SettingsFrame))
		c.ctrl = c.ctrl[:0]
		c.mu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
	}
}
