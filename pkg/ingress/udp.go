package ingress

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/pkg/udpflow"
)

// UDPQueueMemory bounds the packets all of a client's UDP flows queue.
// Packets from the application wait for a flow's sender (while its stream
// opens, or while the connection is congestion limited) in a queue of
// udpflow.DefaultQueueBytes per flow and UDPQueueMemory for all of them;
// more are dropped (udp_drops_total{reason="queue_full"}), as a router drops
// what it cannot forward. Bounded in packets (512 of up to 64 KiB, with
// flows bounded only by --max-connections), 16 source ports took a client
// from 26 to 391 MB while the server was unreachable.
const UDPQueueMemory = 64 << 20

// DefaultUDPIdleTimeout ends a flow without packets either way.
const DefaultUDPIdleTimeout = time.Minute

// udpFlow is one application source address (and, for SOCKS5 UDP
// ASSOCIATE, one destination) on a UDP socket.
type udpFlow struct {
	src    netip.AddrPort
	dest   string // HOST:PORT the application named; "" for a forward (its TokenSource decides)
	prefix []byte // prepended to each packet sent back to the application (the SOCKS5 UDP header)
	queue  *udpflow.Queue
}

// flowKey identifies a flow on a socket.
type flowKey struct {
	src  netip.AddrPort
	dest string
}

// udpSource says how a socket's packets map to flows: for a forward, by
// source address to the forward's TokenSource; for SOCKS5 UDP ASSOCIATE,
// parse reads each packet's destination.
type udpSource struct {
	tokens TokenSource
	// parse, if set, returns a packet's destination (HOST:PORT), the header
	// to put before the answers (the SOCKS5 UDP header naming it) and the
	// payload; ok false drops the packet, counted under reason.
	parse func(src netip.AddrPort, b []byte) (dest string, prefix, payload []byte, reason string, ok bool)
}

// close ends the flow cleanly; the packets still queued are dropped, and
// how many is returned.
func (f *udpFlow) close() int { return f.queue.Close(errFlowClosed) }

// errFlowClosed ends a flow cleanly (its listener closed, or it was idle).
var errFlowClosed = io.EOF

// ServeUDP serves a local UDP socket until it is closed: the packets of each
// application address (a flow) go to the destination tokens chooses (nil:
// Config.Tokens), over a stream and datagrams of the current session (see
// package udpflow); answers go back to that address. A flow ends when idle
// for UDPIdleTimeout either way, and when pc closes. Flow goroutines are
// added to handlers.
func (h *Handler) ServeUDP(ctx context.Context, pc *net.UDPConn, tokens TokenSource, handlers *sync.WaitGroup) {
	h.serveUDP(ctx, pc, udpSource{tokens: tokens}, handlers)
}

func (h *Handler) serveUDP(ctx context.Context, pc *net.UDPConn, us udpSource, handlers *sync.WaitGroup) {
	logger := klog.FromContext(ctx)
	ev := h.cfg.Events
	if err := udpflow.SetSocketBuffers(pc); err != nil {
		logger.Info("Could not raise the UDP socket's buffers; bursts may overflow it", "address", pc.LocalAddr().String(), "err", err)
	}
	var mu sync.Mutex
	flows := map[flowKey]*udpFlow{}
	defer func() {
		// The socket is closed: no more packets come, and answers cannot
		// be delivered. End every flow.
		mu.Lock()
		for _, f := range flows {
			f.close()
		}
		mu.Unlock()
	}()
	buf := make([]byte, udpflow.MaxPacket)
	for {
		n, src, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			logger.Error(err, "UDP read failed; retrying", "address", pc.LocalAddr().String())
			select {
			case <-time.After(10 * time.Millisecond):
				continue
			case <-ctx.Done():
				return
			}
		}
		src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		key, payload, prefix := flowKey{src: src}, buf[:n], []byte(nil)
		if us.parse != nil {
			dest, pre, p, reason, ok := us.parse(src, buf[:n])
			if !ok {
				ev.UDPDropped(reason)
				continue
			}
			key.dest, payload, prefix = dest, p, pre
		}
		mu.Lock()
		f := flows[key]
		if f != nil && f.queue.Closed() {
			f = nil // ended, its handler not gone yet: a new flow takes the packet
		}
		if f == nil {
			select {
			case h.slots <- struct{}{}:
			default:
				mu.Unlock()
				ev.UDPDropped(udpflow.DropFlowLimit)
				logger.V(2).Info("Too many local connections and flows; dropping a packet of a new UDP flow", "limit", h.cfg.MaxConnections, "source", src.String())
				continue
			}
			f = &udpFlow{src: src, dest: key.dest, prefix: bytes.Clone(prefix), queue: udpflow.NewQueue(udpflow.DefaultQueueBytes, h.udpQueues)}
			flows[key] = f
			// Queued before its handler starts, which may end the flow at
			// once (no session): the packet is then counted with it.
			if !f.queue.Push(payload) {
				ev.UDPDropped(udpflow.DropQueueFull)
			}
			handlers.Go(func() {
				defer func() { <-h.slots }()
				h.serveFlow(ctx, pc, f, us.tokens)
				mu.Lock()
				if flows[key] == f {
					delete(flows, key)
				}
				mu.Unlock()
			})
			mu.Unlock()
			continue
		}
		mu.Unlock()
		if !f.queue.Push(payload) {
			ev.UDPDropped(udpflow.DropQueueFull)
		}
	}
}

// wakeOnPacket wraps a packet counter so that packets either way also wake
// the session's liveness checks when the connection went idle.
func wakeOnPacket(sess *Session, count func(path string, n int)) func(path string, n int) {
	return func(path string, n int) {
		count(path, n)
		sess.Waker.Wake()
	}
}

// serveFlow opens the flow's stream and relays until the flow ends.
func (h *Handler) serveFlow(ctx context.Context, pc *net.UDPConn, f *udpFlow, tokens TokenSource) {
	defer f.close()
	ev := h.cfg.Events
	start := time.Now()
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "source", f.src.String())
	fail := func(result, msg string, err error) {
		ev.UDPFlowFailed(result)
		// The packets queued for the flow are lost with it.
		for range f.close() {
			ev.UDPDropped(udpflow.DropNoSession)
		}
		logger.V(2).Info(msg, "err", err)
	}
	token := "udp:" + f.dest
	if f.dest == "" {
		if tokens == nil {
			tokens = h.links.Tokens()
		}
		var err error
		if token, err = tokens.Token(ctx, net.UDPAddrFromAddrPort(f.src)); err != nil {
			fail(proto.CodeBadToken.String(), "Could not get a destination token for a UDP flow", err)
			return
		}
	}
	sess, release, err := h.links.Sessions.Wait(ctx)
	defer release()
	if err != nil {
		fail(ResultNoSession, "No connection to the server for a UDP flow", err)
		return
	}
	str, err := h.openStream(ctx, sess)
	if err != nil {
		code := proto.CodeConnReset
		if errors.Is(err, errStreamCredit) {
			code = proto.CodeOverloaded
		}
		fail(code.String(), "Could not open a stream for a UDP flow", err)
		return
	}
	hdr, err := h.writeFlowHeader(str, token)
	if err != nil {
		fail(proto.CodeConnReset.String(), "Could not write a UDP flow's header", err)
		return
	}
	id := uint64(str.StreamID())
	logger = klog.LoggerWithValues(logger, "streamID", int64(id))
	r := h.flowRelay(sess, str, pc, f, token, start, logger)
	// A TCP session has no datagrams: the flow stays on its stream.
	var dc udpflow.DatagramConn
	if q := sess.Conn.QUIC(); q != nil {
		dc = q
	}
	r.Sender = udpflow.NewSender(id, dc, str, r.Up)
	remove, _ := sess.Flows.Add(id, 0, r.FromDatagram) // stream IDs are unique on a connection
	defer remove()
	t := &tunnel.Tunnel{
		UUID:        hdr.TunnelID(),
		StreamID:    int64(id),
		Endpoint:    "udp:" + pc.LocalAddr().String(),
		Source:      f.src.String(),
		Destination: token,
		Datagram:    true,
		Transport:   sess.Transport(),
		Direction:   h.direction(),
		CreatedAt:   start,
		Upstream:    &r.Up.Bytes,
		Downstream:  &r.Down.Bytes,
	}
	logger.V(4).Info("Opened UDP flow", "destination", h.logDestination(token, t.Endpoint))
	result, err := h.cfg.Registry.Run(t, r, udpflow.FlowTunnels{Events: ev})
	logger.V(4).Info("Closed UDP flow", "bytesUpstream", t.Upstream.Load(), "bytesDownstream", t.Downstream.Load(),
		"packetsUpstream", r.Up.Datagrams.Load()+r.Up.StreamPackets.Load(),
		"packetsDownstream", r.Down.Datagrams.Load()+r.Down.StreamPackets.Load(),
		"duration", time.Since(start), "result", result, "err", err)
	h.audit(klog.FromContext(ctx), f.src.String(), token, t.Endpoint, result, t.Upstream.Load(), t.Downstream.Load(), start)
}

// writeFlowHeader writes a UDP flow's header for token on str (the stream
// is reset if it cannot be written).
func (h *Handler) writeFlowHeader(str Stream, token string) (*proto.Header, error) {
	hdr, err := proto.NewHeader(token, time.Now())
	var hb []byte
	if err == nil {
		hdr.Kind = proto.KindUDP
		hb, err = hdr.AppendSigned(nil, h.links.Signer())
	}
	if err == nil {
		_, err = str.Write(hb)
	}
	if err != nil {
		str.CancelRead(proto.CodeInternal.StreamErrorCode())
		str.CancelWrite(proto.CodeInternal.StreamErrorCode())
		return nil, err
	}
	return hdr, nil
}

// flowRelay is the relay of flow f on str (its Sender is set by the
// caller): packets both ways, counted and waking the session's liveness
// checks, the server's reply recorded and its refusals logged.
func (h *Handler) flowRelay(sess *Session, str Stream, pc *net.UDPConn, f *udpFlow, token string, start time.Time, logger klog.Logger) *udpflow.Relay {
	ev := h.cfg.Events
	return &udpflow.Relay{
		Stream:     str,
		Up:         &udpflow.Counters{OnPacket: wakeOnPacket(sess, ev.UDPPackets(true))},
		Down:       &udpflow.Counters{OnPacket: wakeOnPacket(sess, ev.UDPPackets(false))},
		Queue:      f.queue,
		CloseLocal: func() { f.close() },
		Deliver: func(p []byte) error {
			if f.prefix != nil {
				p = append(append(make([]byte, 0, len(f.prefix)+len(p)), f.prefix...), p...)
			}
			_, err := pc.WriteToUDPAddrPort(p, f.src)
			return err
		},
		AwaitReply: true,
		Replied: func(err error) {
			if err == nil {
				ev.StreamOpened(time.Since(start))
				if h.links.Accepted != nil {
					h.links.Accepted(sess)
				}
			} else if code, ok := proto.FromError(err); ok {
				if code != proto.CodeRefused || !h.logRefused(klog.LoggerWithValues(logger, "listenAddress", pc.LocalAddr().String()), token) {
					logger.V(2).Info("Server refused UDP flow", "code", code.String(), "destination",
						h.logDestination(token, "udp:"+pc.LocalAddr().String()))
				}
				// A server from before stream kinds cannot read the header
				// (bad_header); one that knows kinds but not UDP answers
				// unsupported. Either way the operator must upgrade it.
				if (code == proto.CodeBadHeader || code == proto.CodeUnsupported) && h.udpRefusalLogged.CompareAndSwap(false, true) {
					logger.Info("The server cannot carry UDP flows; if it runs an older quictun (before UDP forwarding), upgrade it: servers before clients",
						"code", code.String(), "destination", token)
				}
			}
		},
		IdleTimeout: h.cfg.UDPIdleTimeout,
		Drop:        ev.UDPDropped,
	}
}
