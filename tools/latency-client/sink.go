package main

// The sink protocol used by `serve --sink-listen` and the bulk command.
//
// The client opens a TCP (or UNIX) connection and sends a 16-byte request:
//
//	offset 0  4 bytes  magic "QTSK"
//	offset 4  1 byte   version (1)
//	offset 5  1 byte   direction: 'U' (client→server) or 'D' (server→client)
//	offset 6  2 bytes  reserved, zero
//	offset 8  8 bytes  count, big endian; 0 means "until told to stop"
//
// Upload ('U'): the client sends its payload as raw bytes and half-closes its
// write side. The server reads to EOF, then replies with a 12-byte trailer
// (8-byte big-endian byte count, 4-byte CRC-32C of the bytes it received) and
// closes. A count other than 0 is what the client promises to send; the
// server reports what it actually received either way.
//
// Download ('D'): the server sends frames, each a 4-byte big-endian length L
// (1..65536) followed by L payload bytes, until it has sent count bytes or,
// when count is 0 or the client stops early, until the client half-closes or
// sends any byte. It then sends a frame with L = 0, the same 12-byte trailer
// describing the bytes it sent, and half-closes. The framing lets the client
// find the trailer without a second connection; it costs 4 bytes per 64 KiB.
//
// In both directions the receiver compares the trailer with its own count and
// CRC-32C, so truncation, duplication, reordering or corruption by anything
// in the path (such as a tunnel) is detected. The payload is pseudo-random
// so that such errors change the checksum.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"time"
)

const (
	sinkMagic            = "QTSK"
	sinkVersion          = 1
	sinkRequestSize      = 16
	sinkTrailerSize      = 12
	sinkMaxFrame         = 64 << 10
	dirUp           byte = 'U'
	dirDown         byte = 'D'
	// patternSize is deliberately not a power of two, so that a repeated
	// or dropped block of any power-of-two size changes the checksum.
	patternSize = 1<<20 + 4093
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sinkRequest is the decoded 16-byte request.
type sinkRequest struct {
	direction byte
	count     uint64
}

func (r sinkRequest) encode() []byte {
	b := make([]byte, sinkRequestSize)
	copy(b, sinkMagic)
	b[4] = sinkVersion
	b[5] = r.direction
	binary.BigEndian.PutUint64(b[8:], r.count)
	return b
}

func decodeSinkRequest(b []byte) (sinkRequest, error) {
	if len(b) != sinkRequestSize || string(b[:4]) != sinkMagic {
		return sinkRequest{}, errors.New("not a sink request: bad magic")
	}
	if b[4] != sinkVersion {
		return sinkRequest{}, fmt.Errorf("unsupported sink protocol version %d", b[4])
	}
	if b[5] != dirUp && b[5] != dirDown {
		return sinkRequest{}, fmt.Errorf("unknown sink direction %q", b[5])
	}
	return sinkRequest{direction: b[5], count: binary.BigEndian.Uint64(b[8:])}, nil
}

// sinkTrailer is what a sender or receiver reports at the end of a transfer.
type sinkTrailer struct {
	count uint64
	crc   uint32
}

func (t sinkTrailer) encode() []byte {
	b := make([]byte, sinkTrailerSize)
	binary.BigEndian.PutUint64(b, t.count)
	binary.BigEndian.PutUint32(b[8:], t.crc)
	return b
}

func decodeSinkTrailer(b []byte) sinkTrailer {
	return sinkTrailer{count: binary.BigEndian.Uint64(b), crc: binary.BigEndian.Uint32(b[8:])}
}

// pattern is a pseudo-random byte sequence stored twice in a row, so that
// any window of up to patternSize bytes starting anywhere in the first copy
// is one contiguous slice.
type pattern struct {
	buf []byte
	off int
}

func newPattern() *pattern {
	var seed [32]byte
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	for i := 0; i < len(seed); i += 8 {
		binary.LittleEndian.PutUint64(seed[i:], r.Uint64())
	}
	cc := rand.NewChaCha8(seed)
	buf := make([]byte, 2*patternSize)
	_, _ = cc.Read(buf[:patternSize])
	copy(buf[patternSize:], buf[:patternSize])
	return &pattern{buf: buf}
}

// next returns the next n bytes (n <= patternSize) of the endless sequence.
func (p *pattern) next(n int) []byte {
	b := p.buf[p.off : p.off+n]
	p.off = (p.off + n) % patternSize
	return b
}

// handleSink serves one sink-protocol connection.
func handleSink(conn net.Conn, cfg ServerConfig) error {
	dc := deadlineConn{Conn: conn, idle: cfg.IdleTimeout}
	req := make([]byte, sinkRequestSize)
	if _, err := io.ReadFull(dc, req); err != nil {
		return fmt.Errorf("read sink request: %w", err)
	}
	r, err := decodeSinkRequest(req)
	if err != nil {
		return err
	}
	if r.direction == dirUp {
		return sinkReceive(conn, dc)
	}
	return sinkSend(conn, dc, r.count)
}

// sinkReceive counts and checksums everything up to EOF, then reports.
func sinkReceive(conn net.Conn, dc deadlineConn) error {
	bp := bufferPool.Get().(*[]byte)
	defer bufferPool.Put(bp)
	h := crc32.New(castagnoli)
	n, err := io.CopyBuffer(h, readerOnly{dc}, *bp)
	if err != nil {
		return fmt.Errorf("receive: %w", err)
	}
	if _, err := dc.Write(sinkTrailer{count: uint64(n), crc: h.Sum32()}.encode()); err != nil {
		return fmt.Errorf("write trailer: %w", err)
	}
	return closeWrite(conn)
}

// readerOnly hides WriterTo/ReaderFrom so io.CopyBuffer uses our buffer.
type readerOnly struct{ r io.Reader }

func (r readerOnly) Read(p []byte) (int, error) { return r.r.Read(p) }

// sinkSend sends count bytes (0: unbounded) in frames, stopping early when
// the client half-closes or sends anything, then sends the end frame and
// the trailer.
func sinkSend(conn net.Conn, dc deadlineConn, count uint64) error {
	stop := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		var b [1]byte
		// Any byte, EOF or error from the client means stop. The idle
		// deadline left by the request read is cleared: a long download
		// reads nothing. Closing conn when the handler ends stops this.
		_ = conn.SetReadDeadline(time.Time{})
		_, _ = conn.Read(b[:])
		close(stop)
	}()
	graceful := false
	defer func() {
		if graceful {
			// Give the client a bounded moment to read the trailer and
			// close, so that closing here cannot reset the connection
			// while the trailer is still in flight.
			t := time.NewTimer(10 * time.Second)
			select {
			case <-readerDone:
			case <-t.C:
			}
			t.Stop()
		}
		_ = conn.Close()
		<-readerDone
	}()

	p := newPattern()
	h := crc32.New(castagnoli)
	w := bufio.NewWriterSize(dc, sinkMaxFrame+4)
	var sent uint64
	var hdr [4]byte
	for count == 0 || sent < count {
		select {
		case <-stop:
			err := finishSend(conn, w, h, sent)
			graceful = err == nil
			return err
		default:
		}
		n := uint64(sinkMaxFrame)
		if count != 0 && count-sent < n {
			n = count - sent
		}
		chunk := p.next(int(n))
		binary.BigEndian.PutUint32(hdr[:], uint32(n))
		if _, err := w.Write(hdr[:]); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		if _, err := w.Write(chunk); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		_, _ = h.Write(chunk)
		sent += n
	}
	err := finishSend(conn, w, h, sent)
	graceful = err == nil
	return err
}

func finishSend(conn net.Conn, w *bufio.Writer, h hash.Hash32, sent uint64) error {
	var end [4]byte
	if _, err := w.Write(end[:]); err != nil {
		return fmt.Errorf("send end frame: %w", err)
	}
	if _, err := w.Write(sinkTrailer{count: sent, crc: h.Sum32()}.encode()); err != nil {
		return fmt.Errorf("send trailer: %w", err)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("send trailer: %w", err)
	}
	return closeWrite(conn)
}
