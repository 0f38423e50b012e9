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
	// InitialStreamReceiveWindow and InitialConnReceiveWindow, when set
	// below the two above, are the windows the connection starts with,
	// until OpenReceiveWindows opens the full ones: what a peer that has
	// not proven who it is can make this side buffer. The connection
	// window is at least HTTP/2's 65,535 bytes.
	InitialStreamReceiveWindow uint32
	InitialConnReceiveWindow   uint32
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
	o := d
	if c != nil {
		o = *c
	}
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
	if o.InitialStreamReceiveWindow == 0 || o.InitialStreamReceiveWindow > o.StreamReceiveWindow {
		o.InitialStreamReceiveWindow = o.StreamReceiveWindow
	}
	if o.InitialConnReceiveWindow == 0 || o.InitialConnReceiveWindow > o.ConnReceiveWindow {
		o.InitialConnReceiveWindow = o.ConnReceiveWindow
	}
	o.InitialConnReceiveWindow = max(o.InitialConnReceiveWindow, http2DefaultWindow)
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
	// streamWindow and connWindow are the receive windows in force: the
	// initial ones, then (OpenReceiveWindows) the full ones.
	streamWindow, connWindow uint32
	// recvAvail is the connection-level credit the peer still has;
	// recvUnacked the bytes consumed and not yet given back.
	recvAvail, recvUnacked int64
	// wasted and idleFrames are the peer's budgets of free work (flood.go).
	wasted, idleFrames budget
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
	return start(ctx, hctx, tc, st, o, isClient)
}

// start runs the HTTP/2 preface and SETTINGS exchange on nc (the TLS
// connection), bounded by hctx, and starts the connection's goroutines,
// which end with the connection, not with ctx. The caller closes nc on
// error.
func start(ctx, hctx context.Context, nc net.Conn, st tls.ConnectionState, o Config, isClient bool) (*Conn, error) {
	stop := context.AfterFunc(hctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if deadline, ok := hctx.Deadline(); ok {
		_ = nc.SetDeadline(deadline)
	}
	c := newConn(nc, st, o, isClient)
	br := bufio.NewReaderSize(nc, maxFrameSize+64)
	c.fr = http2.NewFramer(nil, br)
	c.fr.SetMaxReadFrameSize(maxFrameSize)
	if err := c.writePreface(); err != nil {
		return nil, err
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
	_ = nc.SetDeadline(time.Time{})

	c.ctx, c.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	c.wg.Add(2)
	go c.readLoop()
	go c.controlLoop()
	return c, nil
}

// newConn is a connection over nc before its preface exchange.
func newConn(nc net.Conn, st tls.ConnectionState, o Config, isClient bool) *Conn {
	now := time.Now()
	c := &Conn{
		nc: nc, tls: st, isClient: isClient, cfg: o,
		bw:                bufio.NewWriterSize(nc, maxFrameSize+64),
		wsem:              make(chan struct{}, 1),
		streams:           map[uint32]*Stream{},
		peerMaxStreams:    math.MaxInt64, // until the peer's SETTINGS
		maxIncoming:       o.MaxIncomingStreams,
		peerInitialWindow: http2DefaultWindow,
		peerMaxFrame:      16384,
		sendWindow:        http2DefaultWindow,
		credit:            make(chan struct{}),
		slotFree:          make(chan struct{}),
		streamWindow:      o.InitialStreamReceiveWindow,
		connWindow:        o.InitialConnReceiveWindow,
		recvAvail:         int64(o.InitialConnReceiveWindow),
		wasted:            newBudget(maxWastedStreams, wastedStreamsPerSecond, now),
		idleFrames:        newBudget(maxIdleFrames, idleFramesPerSecond, now),
		ctrlNotify:        make(chan struct{}, 1),
		acceptNotify:      make(chan struct{}, 1),
	}
	c.nextID = 2
	if isClient {
		c.nextID = 1
	}
	c.fw = http2.NewFramer(c.bw, nil)
	return c
}

// writePreface writes the client preface (on the client), our SETTINGS and
// the connection window beyond HTTP/2's default.
func (c *Conn) writePreface() error {
	if c.isClient {
		if _, err := c.bw.WriteString(http2.ClientPreface); err != nil {
			return err
		}
	}
	if err := c.fw.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: uint32(min(c.cfg.MaxIncomingStreams, math.MaxUint32))},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: c.streamWindow},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: maxFrameSize},
	); err != nil {
		return err
	}
	if inc := c.connWindow - http2DefaultWindow; inc > 0 {
		if err := c.fw.WriteWindowUpdate(0, inc); err != nil {
			return err
		}
	}
	if err := c.bw.Flush(); err != nil {
		return fmt.Errorf("write preface: %w", err)
	}
	return nil
}

// tlsConfig is base for a tcpmux connection: TLS 1.3 with ALPN, also in
// the configs a server's GetConfigForClient returns. A client resumes
// with base's ClientSessionCache: give it a cache for TCP of its own, not
// the QUIC connections' (a TCP resumption carries no early data).
func tlsConfig(base *tls.Config, isClient bool) *tls.Config {
	conf := base.Clone()
	conf.NextProtos = []string{ALPN}
	conf.MinVersion = tls.VersionTLS13
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
	// Bounded as net/http2 bounds it, and applied in one pass: the cost of
	// a frame does not grow with its entries times the open streams.
	if sf.NumSettings() > maxSettingsEntries {
		return &ProtocolError{Reason: fmt.Sprintf("SETTINGS with %d entries", sf.NumSettings())}
	}
	if sf.HasDuplicates() {
		return &ProtocolError{Reason: "SETTINGS with duplicate entries"}
	}
	maxStreams, window, frame := c.peerMaxStreams, c.peerInitialWindow, c.peerMaxFrame
	err := sf.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return &ProtocolError{Reason: err.Error()}
		}
		switch s.ID {
		case http2.SettingMaxConcurrentStreams:
			maxStreams = int64(s.Val)
		case http2.SettingInitialWindowSize:
			window = int64(s.Val)
		case http2.SettingMaxFrameSize:
			frame = min(s.Val, maxFrameSize)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if maxStreams > c.peerMaxStreams || c.peerMaxStreams == math.MaxInt64 {
		broadcast(&c.slotFree)
	}
	c.peerMaxStreams, c.peerMaxFrame = maxStreams, frame
	if delta := window - c.peerInitialWindow; delta != 0 {
		c.peerInitialWindow = window
		for _, st := range c.streams {
			st.sendWindow += delta
			if st.sendWindow > math.MaxInt32 {
				return &ProtocolError{Reason: "stream window overflow"}
			}
			signal(st.writeNotify)
		}
	}
	c.queueLocked(ctrlFrame{typ: http2.FrameSettings, flags: http2.FlagSettingsAck})
	return nil
}

// OpenReceiveWindows opens the full receive windows of Config
// (StreamReceiveWindow, ConnReceiveWindow) where the connection started
// with smaller ones (InitialStreamReceiveWindow, InitialConnReceiveWindow):
// the server calls it once the peer has proven the secret. Later calls do
// nothing.
func (c *Conn) OpenReceiveWindows() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closeErr != nil {
		return
	}
	if d := int64(c.cfg.StreamReceiveWindow) - int64(c.streamWindow); d > 0 {
		// SETTINGS_INITIAL_WINDOW_SIZE moves every stream's window by the
		// difference, at the peer and here (RFC 9113 §6.9.2).
		c.streamWindow = c.cfg.StreamReceiveWindow
		for _, s := range c.streams {
			s.recvAvail += d
		}
		c.queueLocked(ctrlFrame{typ: http2.FrameSettings, settings: []http2.Setting{
			{ID: http2.SettingInitialWindowSize, Val: c.streamWindow},
		}})
	}
	if d := c.cfg.ConnReceiveWindow - c.connWindow; c.cfg.ConnReceiveWindow > c.connWindow {
		c.connWindow = c.cfg.ConnReceiveWindow
		c.recvAvail += int64(d)
		c.queueLocked(ctrlFrame{typ: http2.FrameWindowUpdate, value: d})
	}
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
		recvAvail:   int64(c.streamWindow),
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
			c.accepted[0] = nil
			c.accepted = c.accepted[1:]
			s.accepted = true
			if s.ended {
				c.remoteOpen--
			}
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

// failPeer closes the connection for the peer's fault, err (a
// *ProtocolError, or a *FloodError), telling the peer with a GOAWAY (best
// effort).
func (c *Conn) failPeer(err error) {
	c.mu.Lock()
	if c.closeErr == nil {
		c.queueLocked(ctrlFrame{typ: http2.FrameGoAway, streamID: c.lastPeerID, value: uint32(errCodeOf(err))})
	}
	c.mu.Unlock()
	// Written once the writer is free (it may be finishing a frame), within
	// closeWriteTimeout; failing closes the socket.
	t := time.NewTimer(closeWriteTimeout)
	defer t.Stop()
	select {
	case c.wsem <- struct{}{}:
		_ = c.nc.SetWriteDeadline(time.Now().Add(closeWriteTimeout))
		if c.writeControlLocked() == nil {
			_ = c.bw.Flush()
		}
		<-c.wsem
	case <-t.C:
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
				c.failPeer(&ProtocolError{Reason: err.Error()})
			default:
				c.fail(fmt.Errorf("tcpmux: read: %w", err))
			}
			return
		}
		if closing {
			continue // draining until the peer's FIN
		}
		if err := c.handleFrame(f); err != nil {
			c.failPeer(err)
			return
		}
	}
}

// handleFrame handles one frame; an error (a *ProtocolError or a
// *FloodError) ends the connection.
func (c *Conn) handleFrame(f http2.Frame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closeErr != nil {
		return nil
	}
	switch f := f.(type) {
	case *http2.DataFrame:
		return c.handleDataLocked(f)
	case *http2.HeadersFrame:
		return c.handleHeadersLocked(f)
	case *http2.RSTStreamFrame:
		return c.handleResetLocked(f.StreamID, quic.StreamErrorCode(f.ErrCode), false)
	case *http2.WindowUpdateFrame:
		return c.handleWindowUpdateLocked(f)
	case *http2.SettingsFrame:
		if err := c.idleFrameLocked(); err != nil {
			return err
		}
		if !f.IsAck() {
			return c.applySettingsLocked(f)
		}
	case *http2.PingFrame:
		if err := c.idleFrameLocked(); err != nil {
			return err
		}
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
			return c.idleFrameLocked() // HTTP/2: unknown frame types are ignored
		}
		p := f.Payload()
		if len(p) != 4 || f.StreamID == 0 {
			return &ProtocolError{Reason: "malformed " + f.Type.String()}
		}
		code := quic.StreamErrorCode(binary.BigEndian.Uint32(p))
		if f.Type == frameResetWrite {
			return c.handleResetLocked(f.StreamID, code, true)
		}
		return c.handleStopSendingLocked(f.StreamID, code)
	case *http2.PushPromiseFrame:
		return &ProtocolError{Reason: "PUSH_PROMISE"}
	case *http2.ContinuationFrame:
		return &ProtocolError{Reason: "CONTINUATION"}
	default: // PRIORITY
		return c.idleFrameLocked()
	}
	return nil
}

// idleFrameLocked charges a frame that moves no data to the peer's budget.
func (c *Conn) idleFrameLocked() error {
	if !c.idleFrames.take(time.Now()) {
		return &FloodError{What: "idle frames"}
	}
	return nil
}

// wastedStreamLocked charges a stream the peer opened for nothing (reset
// before it was read, or refused over the limit) to its budget.
func (c *Conn) wastedStreamLocked() error {
	if !c.wasted.take(time.Now()) {
		return &FloodError{What: "stream resets"}
	}
	return nil
}

// handleResetLocked handles the peer abandoning its write direction of
// stream id (RESET_WRITE), or both directions (RST_STREAM, whole).
func (c *Conn) handleResetLocked(id uint32, code quic.StreamErrorCode, resetWrite bool) error {
	s := c.streams[id]
	if s == nil {
		if c.unknownStreamLocked(id) {
			return &ProtocolError{Reason: "reset for an idle stream"}
		}
		// A stream that has ended: a frame that crossed our own end is
		// common, and costs a map lookup (no state, no answer, no wake-up).
		return nil
	}
	if !s.local && !s.readOnce {
		// Opened and reset before this side read a byte of it.
		if err := c.wastedStreamLocked(); err != nil {
			return err
		}
	}
	s.remoteResetLocked(code)
	if !resetWrite {
		s.remoteStopLocked(code, false)
	}
	return nil
}

// handleStopSendingLocked handles the peer abandoning its read direction.
func (c *Conn) handleStopSendingLocked(id uint32, code quic.StreamErrorCode) error {
	s := c.streams[id]
	if s == nil {
		if c.unknownStreamLocked(id) {
			return &ProtocolError{Reason: "reset for an idle stream"}
		}
		return nil // ended: as in handleResetLocked
	}
	s.remoteStopLocked(code, true)
	return nil
}

func (c *Conn) handleWindowUpdateLocked(f *http2.WindowUpdateFrame) error {
	if f.Increment < minUsefulWindowUpdate {
		if err := c.idleFrameLocked(); err != nil {
			return err
		}
	}
	if f.StreamID == 0 {
		c.sendWindow += int64(f.Increment)
		if c.sendWindow > math.MaxInt32 {
			return &ProtocolError{Reason: "connection window overflow"}
		}
		broadcast(&c.credit)
		return nil
	}
	s := c.streams[f.StreamID]
	if s == nil {
		return nil // ended: as in handleResetLocked
	}
	s.sendWindow += int64(f.Increment)
	if s.sendWindow > math.MaxInt32 {
		return &ProtocolError{Reason: "stream window overflow"}
	}
	signal(s.writeNotify)
	return nil
}

// unknownStreamLocked reports whether id names a stream that was never
// opened (as opposed to one that has ended).
func (c *Conn) unknownStreamLocked(id uint32) bool {
	if (id%2 == 1) == c.isClient { // ours
		return id >= c.nextID
	}
	return id > c.lastPeerID
}

func (c *Conn) handleDataLocked(f *http2.DataFrame) error {
	n := int64(f.Length)
	if n == 0 && !f.StreamEnded() {
		if err := c.idleFrameLocked(); err != nil {
			return err
		}
	}
	if n > c.recvAvail {
		return &ProtocolError{Reason: "connection flow-control window exceeded"}
	}
	c.recvAvail -= n
	s := c.streams[f.StreamID]
	if s == nil {
		if c.unknownStreamLocked(f.StreamID) {
			return &ProtocolError{Reason: "DATA for an idle stream"}
		}
		c.consumedLocked(n) // a stream that has ended: discarded
		return nil
	}
	data := f.Data()
	if n > s.recvAvail {
		return &ProtocolError{Reason: "stream flow-control window exceeded"}
	}
	if s.recvFin || s.recvReset {
		return &ProtocolError{Reason: "DATA after the end of the stream"}
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
	return nil
}

func (c *Conn) handleHeadersLocked(f *http2.HeadersFrame) error {
	id := f.StreamID
	if (id%2 == 1) == c.isClient || id <= c.lastPeerID {
		if c.streams[id] != nil {
			return &ProtocolError{Reason: "HEADERS on an open stream"}
		}
		return &ProtocolError{Reason: "HEADERS with a bad stream ID"}
	}
	if !f.HeadersEnded() {
		return &ProtocolError{Reason: "HEADERS without END_HEADERS"}
	}
	c.lastPeerID = id
	if c.remoteOpen >= c.maxIncoming {
		// Over the limit we advertised: refused, and charged (a peer
		// that respects SETTINGS never sees this).
		c.queueLocked(ctrlFrame{typ: http2.FrameRSTStream, streamID: id, value: uint32(http2.ErrCodeRefusedStream)})
		return c.wastedStreamLocked()
	}
	s := c.newStreamLocked(id, false)
	c.remoteOpen++
	if f.StreamEnded() {
		s.recvFin = true
	}
	c.accepted = append(c.accepted, s)
	signal(c.acceptNotify)
	return nil
}

// consumedLocked gives n bytes of connection-level credit back to the peer
// once enough has accumulated.
func (c *Conn) consumedLocked(n int64) {
	c.recvUnacked += n
	if c.recvUnacked >= int64(c.connWindow)/4 {
		c.queueLocked(ctrlFrame{typ: http2.FrameWindowUpdate, value: uint32(c.recvUnacked)})
		c.recvAvail += c.recvUnacked
		c.recvUnacked = 0
	}
}

// removeLocked forgets an ended stream. One the peer opened counts against
// its limit until AcceptStream has also returned it: a stream reset in the
// accept queue still takes a place there (the accounting whose absence is
// HTTP/2's "rapid reset" attack).
func (c *Conn) removeLocked(s *Stream) {
	if c.streams[s.id] != s {
		return
	}
	delete(c.streams, s.id)
	switch {
	case s.local:
		c.localOpen--
		broadcast(&c.slotFree)
	case s.accepted:
		c.remoteOpen--
	default:
		s.ended = true
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
