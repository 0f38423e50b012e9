package tcpmux

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/net/http2"
)

// ALPN is the application protocol a tcpmux connection negotiates.
const ALPN = "h2"

// Extension frame types (see the package doc).
const (
	frameResetWrite  http2.FrameType = 0xf0
	frameStopSending http2.FrameType = 0xf1
)

const (
	// maxFrameSize is the largest frame this side accepts (and advertises).
	maxFrameSize = 1 << 16
	// http2DefaultWindow is HTTP/2's initial window (RFC 9113 §6.9.2).
	http2DefaultWindow = 65535
	// maxQueuedControlFrames bounds the control frames waiting to be
	// written; a peer that makes more (PINGs, SETTINGS, data we must
	// acknowledge) without reading our answers is disconnected.
	maxQueuedControlFrames = 10000
	// closeWriteTimeout bounds writing the GOAWAY of CloseWithError.
	closeWriteTimeout = time.Second
)

// headerBlock opens a stream: HPACK static-table entries 3 (:method POST),
// 7 (:scheme https) and 4 (:path /).
var headerBlock = []byte{0x83, 0x87, 0x84}

// Config bounds a Conn. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// MaxIncomingStreams is how many streams the peer may have open at once
	// (SETTINGS_MAX_CONCURRENT_STREAMS); RaiseMaxIncomingStreams raises it.
	MaxIncomingStreams int64
	// StreamReceiveWindow is each stream's receive buffer: a stream's
	// throughput is at most this much per round trip.
	StreamReceiveWindow uint32
	// ConnReceiveWindow bounds the data buffered for all streams together.
	ConnReceiveWindow uint32
	// HandshakeTimeout bounds the TLS handshake and the HTTP/2 preface and
	// SETTINGS exchange.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection on which nothing arrived for this
	// long, and one whose peer takes none of our bytes for this long.
	IdleTimeout time.Duration
	// KeepAlivePeriod is the interval of PINGs that keep an idle
	// connection alive; it must be well below the peer's IdleTimeout.
	KeepAlivePeriod time.Duration
}

// DefaultConfig returns the defaults: 100 streams, windows of 4 MiB per
// stream and 16 MiB per connection, 10 s handshake, 30 s idle timeout,
// PINGs every 10 s.
func DefaultConfig() Config {
	return Config{
		MaxIncomingStreams:  100,
		StreamReceiveWindow: 4 << 20,
		ConnReceiveWindow:   16 << 20,
		HandshakeTimeout:    10 * time.Second,
		IdleTimeout:         30 * time.Second,
		KeepAlivePeriod:     10 * time.Second,
	}
}

func (c *Config) complete() Config {
	d := DefaultConfig()
	if c == nil {
		return d
	}
	o := *c
	if o.MaxIncomingStreams <= 0 {
		o.MaxIncomingStreams = d.MaxIncomingStreams
	}
	if o.StreamReceiveWindow == 0 {
		o.StreamReceiveWindow = d.StreamReceiveWindow
	}
	if o.ConnReceiveWindow == 0 {
		o.ConnReceiveWindow = d.ConnReceiveWindow
	}
	o.StreamReceiveWindow = min(o.StreamReceiveWindow, math.MaxInt32)
	o.ConnReceiveWindow = max(min(o.ConnReceiveWindow, math.MaxInt32), http2DefaultWindow)
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = d.HandshakeTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = d.IdleTimeout
	}
	if o.KeepAlivePeriod <= 0 {
		o.KeepAlivePeriod = min(d.KeepAlivePeriod, o.IdleTimeout/3)
	}
	return o
}

// ErrStreamLimit is returned by OpenStream when the peer's stream limit is
// reached; OpenStreamSync waits instead.
var ErrStreamLimit = errors.New("tcpmux: too many open streams")

// ProtocolError is why a connection was closed when its peer broke the
// protocol (malformed frames, flow-control violations, a bad preface).
type ProtocolError struct {
	Reason string
	// Remote: the peer reported our error (a GOAWAY with a protocol code).
	Remote bool
}

func (e *ProtocolError) Error() string {
	if e.Remote {
		return "tcpmux: peer reported a protocol error: " + e.Reason
	}
	return "tcpmux: protocol error: " + e.Reason
}

// ctrlFrame is a queued control frame (or a stream's FIN).
type ctrlFrame struct {
	typ      http2.FrameType
	streamID uint32
	flags    http2.Flags
	value    uint32 // window increment, error code
	settings []http2.Setting
	ping     [8]byte
}

// Conn is one multiplexed TLS connection. Its methods are safe for
// concurrent use.
type Conn struct {
	nc       net.Conn
	tls      tls.ConnectionState
	isClient bool
	cfg      Config

	fr *http2.Framer // reads; only the reader goroutine
	fw *http2.Framer // writes; only the holder of wsem
	bw *bufio.Writer

	ctx    context.Context
	cancel context.CancelCauseFunc
	// wsem is held by the one goroutine writing frames.
	wsem chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	closeErr error
	streams  map[uint32]*Stream
	nextID   uint32
	// lastPeerID is the highest stream ID the peer opened.
	lastPeerID uint32
	// localOpen and remoteOpen count the open streams each side opened.
	localOpen, remoteOpen int64
	peerMaxStreams        int64
	maxIncoming           int64
	peerInitialWindow     int64
	peerMaxFrame          uint32
	// sendWindow is the connection's send credit; credit is closed (and
	// replaced) when it grows.
	sendWindow int64
	credit     chan struct{}
	// slotFree is closed (and replaced) when a locally opened stream ends
	// or the peer raises its limit.
	slotFree chan struct{}
	// recvAvail is the connection-level credit the peer still has;
	// recvUnacked the bytes consumed and not yet given back.
	recvAvail, recvUnacked int64
	// lingering: closed by CloseWithError; the reader drains until the
	// peer's FIN.
	lingering    bool
	ctrl         []ctrlFrame
	ctrlNotify   chan struct{}
	accepted     []*Stream
	acceptNotify chan struct{}
}

// Dial connects to address over TCP and runs Client on the connection.
func Dial(ctx context.Context, address string, tlsConf *tls.Config, cfg *Config) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, err
	}
	c, err := Client(ctx, nc, tlsConf, cfg)
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	return c, nil
}

// Client runs the client side of the handshake on nc (TLS with tlsConf, its
// ALPN replaced by ALPN, then the HTTP/2 preface and SETTINGS) and returns
// the connection. It owns nc from then on, also on error (closed).
func Client(ctx context.Context, nc net.Conn, tlsConf *tls.Config, cfg *Config) (*Conn, error) {
	return handshake(ctx, nc, tlsConf, cfg, true)
}

// Server runs the server side of the handshake on nc. It owns nc from then
// on, also on error (closed).
func Server(ctx context.Context, nc net.Conn, tlsConf *tls.Config, cfg *Config) (*Conn, error) {
	return handshake(ctx, nc, tlsConf, cfg, false)
}

func handshake(ctx context.Context, nc net.Conn, tlsConf *tls.Config, cfg *Config, isClient bool) (_ *Conn, err error) {
	o := cfg.complete()
	conf := tlsConfig(tlsConf, isClient)
	var tc *tls.Conn
	if isClient {
		tc = tls.Client(nc, conf)
	} else {
		tc = tls.Server(nc, conf)
	}
	defer func() {
		if err != nil {
			_ = tc.Close()
		}
	}()
	deadline := time.Now().Add(o.HandshakeTimeout)
	hctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	st := tc.ConnectionState()
	if st.NegotiatedProtocol != ALPN {
		return nil, fmt.Errorf("tls handshake: peer did not negotiate %q", ALPN)
	}
	// The preface exchange: bounded by the same deadline, and by ctx.
	stop := context.AfterFunc(hctx, func() { _ = tc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	_ = tc.SetDeadline(deadline)

	c := &Conn{
		nc: tc, tls: st, isClient: isClient, cfg: o,
		bw:                bufio.NewWriterSize(tc, maxFrameSize+64),
		wsem:              make(chan struct{}, 1),
		streams:           map[uint32]*Stream{},
		peerMaxStreams:    math.MaxInt64, // until the peer's SETTINGS
		maxIncoming:       o.MaxIncomingStreams,
		peerInitialWindow: http2DefaultWindow,
		peerMaxFrame:      16384,
		sendWindow:        http2DefaultWindow,
		credit:            make(chan struct{}),
		slotFree:          make(chan struct{}),
		recvAvail:         int64(o.ConnReceiveWindow),
		ctrlNotify:        make(chan struct{}, 1),
		acceptNotify:      make(chan struct{}, 1),
	}
	c.nextID = 2
	if isClient {
		c.nextID = 1
	}
	br := bufio.NewReaderSize(tc, maxFrameSize+64)
	c.fr = http2.NewFramer(nil, br)
	c.fr.SetMaxReadFrameSize(maxFrameSize)
	c.fw = http2.NewFramer(c.bw, nil)

	if isClient {
		if _, err := c.bw.WriteString(http2.ClientPreface); err != nil {
			return nil, err
		}
	}
	if err := c.fw.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: uint32(min(o.MaxIncomingStreams, math.MaxUint32))},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: o.StreamReceiveWindow},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: maxFrameSize},
	); err != nil {
		return nil, err
	}
	if inc := o.ConnReceiveWindow - http2DefaultWindow; inc > 0 {
		if err := c.fw.WriteWindowUpdate(0, inc); err != nil {
			return nil, err
		}
	}
	if err := c.bw.Flush(); err != nil {
		return nil, fmt.Errorf("write preface: %w", err)
	}
	if !isClient {
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(br, preface); err != nil {
			return nil, fmt.Errorf("read preface: %w", err)
		}
		if string(preface) != http2.ClientPreface {
			return nil, &ProtocolError{Reason: "bad connection preface"}
		}
	}
	f, err := c.fr.ReadFrame()
	if err != nil {
		return nil, fmt.Errorf("read settings: %w", err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return nil, &ProtocolError{Reason: "first frame is not SETTINGS"}
	}
	if err := c.applySettings(sf); err != nil {
		return nil, err
	}
	if !stop() {
		return nil, fmt.Errorf("handshake: %w", context.Cause(hctx))
	}
	_ = tc.SetDeadline(time.Time{})

	c.ctx, c.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	c.wg.Add(2)
	go c.readLoop()
	go c.controlLoop()
	return c, nil
}

// tlsConfig is base for a tcpmux connection: TLS 1.3 with ALPN, also in
// the configs a server's GetConfigForClient returns; no session
// resumption on the client (tickets are the QUIC connections').
func tlsConfig(base *tls.Config, isClient bool) *tls.Config {
	conf := base.Clone()
	conf.NextProtos = []string{ALPN}
	conf.MinVersion = tls.VersionTLS13
	if isClient {
		conf.ClientSessionCache = nil
	}
	if get := conf.GetConfigForClient; get != nil {
		conf.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			hc, err := get(hello)
			if hc == nil || err != nil {
				return hc, err
			}
			hc = hc.Clone()
			hc.NextProtos = []string{ALPN}
			hc.MinVersion = tls.VersionTLS13
			return hc, nil
		}
	}
	return conf
}

// applySettings applies the peer's SETTINGS and queues their
// acknowledgement.
func (c *Conn) applySettings(sf *http2.SettingsFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applySettingsLocked(sf)
}

func (c *Conn) applySettingsLocked(sf *http2.SettingsFrame) error {
	err := sf.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return &ProtocolError{Reason: err.Error()}
		}
		switch s.ID {
		case http2.SettingMaxConcurrentStreams:
			if int64(s.Val) > c.peerMaxStreams || c.peerMaxStreams == math.MaxInt64 {
				broadcast(&c.slotFree)
			}
			c.peerMaxStreams = int64(s.Val)
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerInitialWindow
			c.peerInitialWindow = int64(s.Val)
			for _, st := range c.streams {
				st.sendWindow += delta
				if st.sendWindow > math.MaxInt32 {
					return &ProtocolError{Reason: "stream window overflow"}
				}
				signal(st.writeNotify)
			}
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame = min(s.Val, maxFrameSize)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.queueLocked(ctrlFrame{typ: http2.FrameSettings, flags: http2.FlagSettingsAck})
	return nil
}

// Context is cancelled when the connection closes; its cause is the
// reason (the error stream operations return).
func (c *Conn) Context() context.Context { return c.ctx }

// LocalAddr is the connection's local TCP address.
func (c *Conn) LocalAddr() net.Addr { return c.nc.LocalAddr() }

// RemoteAddr is the peer's TCP address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// TLS is the state of the connection's TLS handshake (peer certificates,
// for identity and pinning).
func (c *Conn) TLS() tls.ConnectionState { return c.tls }

// ConnectionState is the TLS state in quic-go's form, so code written for
// *quic.Conn reads it the same way: no datagrams, no 0-RTT.
func (c *Conn) ConnectionState() quic.ConnectionState {
	return quic.ConnectionState{TLS: c.tls}
}

// HandshakeComplete is closed: a Conn exists only once its handshake is
// complete (there is no 0-RTT on TCP).
func (c *Conn) HandshakeComplete() <-chan struct{} { return closedChan }

var closedChan = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

// NumStreams is the number of streams open on the connection (either side
// opened, not yet ended both ways).
func (c *Conn) NumStreams() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.streams)
}

// RaiseMaxIncomingStreams raises the number of streams the peer may have
// open to n (never lowers it).
func (c *Conn) RaiseMaxIncomingStreams(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n <= c.maxIncoming || c.closeErr != nil {
		return
	}
	c.maxIncoming = n
	c.queueLocked(ctrlFrame{typ: http2.FrameSettings, settings: []http2.Setting{
		{ID: http2.SettingMaxConcurrentStreams, Val: uint32(min(n, math.MaxUint32))},
	}})
}

// OpenStream opens a stream, or returns ErrStreamLimit if the peer's
// limit is reached. It does not block: the peer learns of the stream with
// its first frame.
func (c *Conn) OpenStream() (*Stream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closeErr != nil {
		return nil, c.closeErr
	}
	if c.localOpen >= c.peerMaxStreams {
		return nil, ErrStreamLimit
	}
	return c.openLocked()
}

// OpenStreamSync opens a stream, waiting for the peer's limit to allow one
// until ctx is done.
func (c *Conn) OpenStreamSync(ctx context.Context) (*Stream, error) {
	for {
		c.mu.Lock()
		if c.closeErr != nil {
			c.mu.Unlock()
			return nil, c.closeErr
		}
		if c.localOpen < c.peerMaxStreams {
			s, err := c.openLocked()
			c.mu.Unlock()
			return s, err
		}
		free := c.slotFree
		c.mu.Unlock()
		select {
		case <-free:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.ctx.Done():
		}
	}
}

func (c *Conn) openLocked() (*Stream, error) {
	if c.nextID > math.MaxInt32 {
		return nil, errors.New("tcpmux: stream IDs exhausted")
	}
	id := c.nextID
	c.nextID += 2
	s := c.newStreamLocked(id, true)
	c.localOpen++
	c.queueLocked(ctrlFrame{typ: http2.FrameHeaders, streamID: id})
	return s, nil
}

func (c *Conn) newStreamLocked(id uint32, local bool) *Stream {
	s := &Stream{
		c: c, id: id, local: local,
		sendWindow:  c.peerInitialWindow,
		recvAvail:   int64(c.cfg.StreamReceiveWindow),
		readNotify:  make(chan struct{}, 1),
		writeNotify: make(chan struct{}, 1),
	}
	s.ctx, s.cancel = context.WithCancelCause(c.ctx)
	c.streams[id] = s
	return s
}

// AcceptStream returns the next stream the peer opened, waiting until ctx
// is done or the connection closes.
func (c *Conn) AcceptStream(ctx context.Context) (*Stream, error) {
	for {
		c.mu.Lock()
		if len(c.accepted) > 0 {
			s := c.accepted[0]
			c.accepted = c.accepted[1:]
			if len(c.accepted) > 0 {
				signal(c.acceptNotify)
			}
			c.mu.Unlock()
			return s, nil
		}
		if c.closeErr != nil {
			c.mu.Unlock()
			return nil, c.closeErr
		}
		c.mu.Unlock()
		select {
		case <-c.acceptNotify:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.ctx.Done():
		}
	}
}

// CloseWithError closes the connection: the peer's operations fail with
// *quic.ApplicationError{Remote: true, ErrorCode: code, ErrorMessage: msg}
// (codes above 2^32-1 are sent as 2^32-1), ours with Remote false. It
// returns once the connection's goroutines have ended: at most about
// a second after the GOAWAY is written (the peer has read it, or gave up).
func (c *Conn) CloseWithError(code quic.ApplicationErrorCode, msg string) error {
	c.mu.Lock()
	last := c.lastPeerID
	c.mu.Unlock()
	// First the state, so that the peer closing in answer to the GOAWAY is
	// not taken for a lost connection.
	if c.closeGracefully(&quic.ApplicationError{ErrorCode: code, ErrorMessage: msg}) {
		// Best effort: the GOAWAY goes out unless the peer takes nothing.
		sent := false
		t := time.NewTimer(closeWriteTimeout)
		select {
		case c.wsem <- struct{}{}:
			_ = c.nc.SetWriteDeadline(time.Now().Add(closeWriteTimeout))
			if err := c.fw.WriteGoAway(last, http2.ErrCode(min(uint64(code), math.MaxUint32)), []byte(msg)); err == nil {
				sent = c.bw.Flush() == nil
			}
			<-c.wsem
		case <-t.C:
		}
		t.Stop()
		if sent {
			// A lingering close: closing a socket with unread data sends a
			// RST, which can destroy the GOAWAY before the peer reads it.
			// Send FIN and let the reader drain until the peer closes too.
			if tc, ok := c.nc.(*tls.Conn); ok {
				_ = tc.CloseWrite()
				if cw, ok := tc.NetConn().(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite()
				}
			}
		} else {
			_ = c.nc.Close()
		}
	}
	c.wg.Wait()
	return nil
}

// closeGracefully records err as the connection's end, leaving the socket
// to the reader, which closes it at the peer's FIN or after
// closeWriteTimeout. It reports whether the connection was still open.
func (c *Conn) closeGracefully(err error) bool {
	c.mu.Lock()
	if c.closeErr != nil {
		c.mu.Unlock()
		return false
	}
	c.closeErr = err
	c.lingering = true
	for _, s := range c.streams {
		signal(s.readNotify)
		signal(s.writeNotify)
	}
	c.ctrl = nil
	_ = c.nc.SetReadDeadline(time.Now().Add(closeWriteTimeout))
	c.mu.Unlock()
	c.cancel(err)
	return true
}

// fail closes the connection with err (the first error wins) and wakes
// every waiter. It does not wait for the goroutines.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.closeErr != nil {
		c.mu.Unlock()
		return
	}
	c.closeErr = err
	for _, s := range c.streams {
		signal(s.readNotify)
		signal(s.writeNotify)
	}
	c.ctrl = nil
	c.mu.Unlock()
	c.cancel(err)
	_ = c.nc.Close()
}

// failProtocol closes the connection for a protocol violation, telling the
// peer with a GOAWAY (best effort).
func (c *Conn) failProtocol(reason string) {
	c.mu.Lock()
	if c.closeErr == nil {
		c.queueLocked(ctrlFrame{typ: http2.FrameGoAway, streamID: c.lastPeerID, value: uint32(http2.ErrCodeProtocol)})
	}
	c.mu.Unlock()
	// Written now if nobody else is writing; failing closes the socket.
	err := &ProtocolError{Reason: reason}
	select {
	case c.wsem <- struct{}{}:
		_ = c.nc.SetWriteDeadline(time.Now().Add(closeWriteTimeout))
		if c.writeControlLocked() == nil {
			_ = c.bw.Flush()
		}
		<-c.wsem
	default:
	}
	c.fail(err)
}

// queueLocked queues a control frame for the control writer.
func (c *Conn) queueLocked(f ctrlFrame) {
	if c.closeErr != nil {
		return
	}
	if len(c.ctrl) >= maxQueuedControlFrames {
		// The peer makes us answer faster than it reads: close, without
		// blocking the caller (the reader goroutine holds c.mu).
		c.ctrl = nil
		err := &ProtocolError{Reason: "too many queued control frames: the peer does not read"}
		c.closeErr = err
		for _, s := range c.streams {
			signal(s.readNotify)
			signal(s.writeNotify)
		}
		c.cancel(err) // takes no lock of ours (AfterFuncs run on their own goroutines)
		_ = c.nc.Close()
		return
	}
	c.ctrl = append(c.ctrl, f)
	signal(c.ctrlNotify)
}

// acquireWriter takes the right to write frames, waiting until the
// deadline (zero: none), wake (if not nil) fires, or the connection closes.
// woken reports that wake fired first.
func (c *Conn) acquireWriter(deadline time.Time, wake <-chan struct{}) (woken bool, err error) {
	select {
	case c.wsem <- struct{}{}:
		return false, nil
	default:
	}
	var timer <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return false, os.ErrDeadlineExceeded
		}
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case c.wsem <- struct{}{}:
		return false, nil
	case <-wake:
		return true, nil
	case <-timer:
		return false, os.ErrDeadlineExceeded
	case <-c.ctx.Done():
		return false, c.err()
	}
}

// releaseWriter writes what the control queue holds, flushes, and gives up
// the right to write. A write error closes the connection.
func (c *Conn) releaseWriter() error {
	err := c.writeControlLocked()
	if err == nil {
		err = c.bw.Flush()
	}
	<-c.wsem
	if err != nil {
		c.fail(fmt.Errorf("tcpmux: write: %w", err))
		return c.err()
	}
	return nil
}

// writeControlLocked writes the queued control frames; the caller holds
// wsem.
func (c *Conn) writeControlLocked() error {
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.cfg.IdleTimeout))
	for {
		c.mu.Lock()
		q := c.ctrl
		c.ctrl = nil
		c.mu.Unlock()
		if len(q) == 0 {
			return nil
		}
		for _, f := range q {
			if err := c.writeFrame(f); err != nil {
				return err
			}
		}
	}
}

func (c *Conn) writeFrame(f ctrlFrame) error {
	switch f.typ {
	case http2.FrameSettings:
		if f.flags.Has(http2.FlagSettingsAck) {
			return c.fw.WriteSettingsAck()
		}
		return c.fw.WriteSettings(f.settings...)
	case http2.FrameHeaders:
		return c.fw.WriteHeaders(http2.HeadersFrameParam{StreamID: f.streamID, BlockFragment: headerBlock, EndHeaders: true})
	case http2.FrameData: // a FIN
		return c.fw.WriteData(f.streamID, true, nil)
	case http2.FrameWindowUpdate:
		return c.fw.WriteWindowUpdate(f.streamID, f.value)
	case http2.FramePing:
		return c.fw.WritePing(f.flags.Has(http2.FlagPingAck), f.ping)
	case http2.FrameRSTStream:
		return c.fw.WriteRSTStream(f.streamID, http2.ErrCode(f.value))
	case http2.FrameGoAway:
		return c.fw.WriteGoAway(f.streamID, http2.ErrCode(f.value), nil)
	case frameResetWrite, frameStopSending:
		var p [4]byte
		binary.BigEndian.PutUint32(p[:], f.value)
		return c.fw.WriteRawFrame(f.typ, 0, f.streamID, p[:])
	}
	return fmt.Errorf("tcpmux: unknown control frame %v", f.typ)
}

// err is the connection's close error.
func (c *Conn) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeErr
}

// controlLoop writes queued control frames and sends keep-alive PINGs.
func (c *Conn) controlLoop() {
	defer c.wg.Done()
	tick := time.NewTicker(c.cfg.KeepAlivePeriod)
	defer tick.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-tick.C:
			c.mu.Lock()
			c.queueLocked(ctrlFrame{typ: http2.FramePing})
			c.mu.Unlock()
		case <-c.ctrlNotify:
			if _, err := c.acquireWriter(time.Time{}, nil); err != nil {
				return
			}
			if c.releaseWriter() != nil {
				return
			}
		}
	}
}

// readLoop reads and handles frames until the connection fails.
func (c *Conn) readLoop() {
	defer c.wg.Done()
	defer func() { _ = c.nc.Close() }()
	for {
		c.mu.Lock()
		closing := c.closeErr != nil
		lingering := c.lingering
		if !closing {
			_ = c.nc.SetReadDeadline(time.Now().Add(c.cfg.IdleTimeout))
		}
		c.mu.Unlock()
		if closing && !lingering {
			return
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			var ne net.Error
			var ce http2.ConnectionError
			var se http2.StreamError
			switch {
			case closing || c.err() != nil:
			case errors.As(err, &ne) && ne.Timeout():
				c.fail(&quic.IdleTimeoutError{})
			case errors.As(err, &ce), errors.As(err, &se), errors.Is(err, http2.ErrFrameTooLarge):
				c.failProtocol(err.Error())
			default:
				c.fail(fmt.Errorf("tcpmux: read: %w", err))
			}
			return
		}
		if closing {
			continue // draining until the peer's FIN
		}
		if reason := c.handleFrame(f); reason != "" {
			c.failProtocol(reason)
			return
		}
	}
}

// handleFrame handles one frame; a non-empty result is a protocol
// violation that ends the connection.
func (c *Conn) handleFrame(f http2.Frame) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closeErr != nil {
		return ""
	}
	switch f := f.(type) {
	case *http2.DataFrame:
		return c.handleDataLocked(f)
	case *http2.HeadersFrame:
		return c.handleHeadersLocked(f)
	case *http2.RSTStreamFrame:
		if s := c.streams[f.StreamID]; s != nil {
			code := quic.StreamErrorCode(f.ErrCode)
			s.remoteResetLocked(code)
			s.remoteStopLocked(code, false)
		} else if c.unknownStreamLocked(f.StreamID) {
			return "RST_STREAM for an idle stream"
		}
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			c.sendWindow += int64(f.Increment)
			if c.sendWindow > math.MaxInt32 {
				return "connection window overflow"
			}
			broadcast(&c.credit)
		} else if s := c.streams[f.StreamID]; s != nil {
			s.sendWindow += int64(f.Increment)
			if s.sendWindow > math.MaxInt32 {
				return "stream window overflow"
			}
			signal(s.writeNotify)
		}
	case *http2.SettingsFrame:
		if !f.IsAck() {
			if err := c.applySettingsLocked(f); err != nil {
				return err.Error()
			}
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			c.queueLocked(ctrlFrame{typ: http2.FramePing, flags: http2.FlagPingAck, ping: f.Data})
		}
	case *http2.GoAwayFrame:
		err := error(&quic.ApplicationError{Remote: true, ErrorCode: quic.ApplicationErrorCode(f.ErrCode), ErrorMessage: string(f.DebugData())})
		if f.ErrCode == http2.ErrCodeProtocol && len(f.DebugData()) == 0 {
			err = &ProtocolError{Reason: "GOAWAY PROTOCOL_ERROR", Remote: true}
		}
		c.mu.Unlock()
		c.fail(err)
		c.mu.Lock()
	case *http2.UnknownFrame:
		if f.Type != frameResetWrite && f.Type != frameStopSending {
			return "" // HTTP/2: unknown frame types are ignored
		}
		p := f.Payload()
		if len(p) != 4 || f.StreamID == 0 {
			return "malformed " + f.Type.String()
		}
		code := quic.StreamErrorCode(binary.BigEndian.Uint32(p))
		s := c.streams[f.StreamID]
		if s == nil {
			if c.unknownStreamLocked(f.StreamID) {
				return "reset for an idle stream"
			}
			return ""
		}
		if f.Type == frameResetWrite {
			s.remoteResetLocked(code)
		} else {
			s.remoteStopLocked(code, true)
		}
	case *http2.PushPromiseFrame:
		return "PUSH_PROMISE"
	case *http2.ContinuationFrame:
		return "CONTINUATION"
	}
	return ""
}

// unknownStreamLocked reports whether id names a stream that was never
// opened (as opposed to one that has ended).
func (c *Conn) unknownStreamLocked(id uint32) bool {
	if (id%2 == 1) == c.isClient { // ours
		return id >= c.nextID
	}
	return id > c.lastPeerID
}

func (c *Conn) handleDataLocked(f *http2.DataFrame) string {
	n := int64(f.Length)
	if n > c.recvAvail {
		return "connection flow-control window exceeded"
	}
	c.recvAvail -= n
	s := c.streams[f.StreamID]
	if s == nil {
		if c.unknownStreamLocked(f.StreamID) {
			return "DATA for an idle stream"
		}
		c.consumedLocked(n) // a stream that has ended: discarded
		return ""
	}
	data := f.Data()
	if n > s.recvAvail {
		return "stream flow-control window exceeded"
	}
	if s.recvFin || s.recvReset {
		return "DATA after the end of the stream"
	}
	s.recvAvail -= n
	// Padding counts against the windows but is never read.
	if pad := n - int64(len(data)); pad > 0 {
		c.consumedLocked(pad)
	}
	if s.readErr != nil { // CancelRead: discarded
		c.consumedLocked(int64(len(data)))
	} else if len(data) > 0 {
		s.buf = append(s.buf, slices.Clone(data))
		s.buffered += int64(len(data))
	}
	if f.StreamEnded() {
		s.recvFin = true
		s.maybeEndLocked()
	}
	signal(s.readNotify)
	return ""
}

func (c *Conn) handleHeadersLocked(f *http2.HeadersFrame) string {
	id := f.StreamID
	if (id%2 == 1) == c.isClient || id <= c.lastPeerID {
		if c.streams[id] != nil {
			return "HEADERS on an open stream"
		}
		return "HEADERS with a bad stream ID"
	}
	if !f.HeadersEnded() {
		return "HEADERS without END_HEADERS"
	}
	c.lastPeerID = id
	if c.remoteOpen >= c.maxIncoming {
		c.queueLocked(ctrlFrame{typ: http2.FrameRSTStream, streamID: id, value: uint32(http2.ErrCodeRefusedStream)})
		return ""
	}
	s := c.newStreamLocked(id, false)
	c.remoteOpen++
	if f.StreamEnded() {
		s.recvFin = true
	}
	c.accepted = append(c.accepted, s)
	signal(c.acceptNotify)
	return ""
}

// consumedLocked gives n bytes of connection-level credit back to the peer
// once enough has accumulated.
func (c *Conn) consumedLocked(n int64) {
	c.recvUnacked += n
	if c.recvUnacked >= int64(c.cfg.ConnReceiveWindow)/4 {
		c.queueLocked(ctrlFrame{typ: http2.FrameWindowUpdate, value: uint32(c.recvUnacked)})
		c.recvAvail += c.recvUnacked
		c.recvUnacked = 0
	}
}

// removeLocked forgets an ended stream.
func (c *Conn) removeLocked(s *Stream) {
	if c.streams[s.id] != s {
		return
	}
	delete(c.streams, s.id)
	if s.local {
		c.localOpen--
		broadcast(&c.slotFree)
	} else {
		c.remoteOpen--
	}
}

// signal wakes the one waiter of ch (capacity 1) without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// broadcast wakes every waiter of *ch and replaces it.
func broadcast(ch *chan struct{}) {
	close(*ch)
	*ch = make(chan struct{})
}
