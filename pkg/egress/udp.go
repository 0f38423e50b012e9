package egress

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/pkg/udpflow"
)

// serveUDP serves a UDP flow (a stream of kind UDP): a connected UDP socket
// to the destination, relayed to the flow's datagrams and stream until the
// flow ends (see package udpflow). Each step is a method of Handler; the
// first that fails returns a *failure, and what the earlier ones took is
// given back in reverse order.
func (e *Handler) serveUDP(ctx context.Context, f *stream) *failure {
	release, fail := e.admitUDPFlow(f)
	if fail != nil {
		return fail
	}
	defer release()
	sock, fail := e.udpSocket(ctx, f)
	if fail != nil {
		return fail
	}
	defer sock.release()
	r := e.udpRelay(f, sock)
	remove, fail := e.registerUDPFlow(f, r, sock)
	if fail != nil {
		return fail
	}
	defer remove()
	return e.runUDPFlow(f, r, sock)
}

// admitUDPFlow counts the flow against its identity's share of the
// server's flows (MaxUDPFlowsPerIdentity, by flowAccount) and then against
// the server-wide count (MaxUDPFlows): the share first, so that an identity
// over it does not touch the server-wide count. release gives both back.
func (e *Handler) admitUDPFlow(f *stream) (release func(), _ *failure) {
	ev := e.cfg.Events
	account := flowAccount(f.peer, f.key, f.st)
	if open, ok := e.flowShares.take(account, e.cfg.MaxUDPFlowsPerIdentity); !ok {
		ev.UDPDropped(udpflow.DropIdentityFlowLimit)
		return nil, failed(proto.CodeOverloaded, "Refused UDP flow: this client identity holds its share of the server's flows; raise --max-udp-flows-per-identity if it needs more",
			"account", account, "open", open, "limit", e.cfg.MaxUDPFlowsPerIdentity)
	}
	if n := e.udpFlows.Add(1); n > int64(e.cfg.MaxUDPFlows) {
		e.udpFlows.Add(-1)
		e.flowShares.release(account)
		ev.UDPDropped(udpflow.DropFlowLimit)
		return nil, failed(proto.CodeOverloaded, "Refused UDP flow: the server is at its flow limit; raise --max-udp-flows if clients need more",
			"limit", e.cfg.MaxUDPFlows)
	}
	return func() {
		e.udpFlows.Add(-1)
		e.flowShares.release(account)
	}, nil
}

// udpSocket is a UDP flow's connected socket to its destination.
type udpSocket struct {
	net.Conn
	// observe is told the size of each packet read (the buffer sizer's
	// Observe, or nothing when the socket's buffer is not sized).
	observe func(int)
	// release gives the socket's buffer back to the server's budget (the
	// sizer's Close, or nothing); it does not close the socket.
	release func()
}

// udpSocket connects a UDP socket to the flow's destination within
// DialTimeout. Connecting sends nothing; the checked dialer refuses an
// address the rules do not allow, as for TCP. The socket's receive buffer
// starts small and grows with the flow's rate, within the server's budget
// (udpflow.Sizer); the Relay reads it whether or not the client takes the
// packets, so a stalled flow drops packets rather than holding the host's
// UDP memory. A socket the budget has no room for is closed and refused.
func (e *Handler) udpSocket(ctx context.Context, f *stream) (udpSocket, *failure) {
	dctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	nc, err := e.cfg.Dialer.DialContext(dctx, f.target.Network, f.target.Address)
	cancel()
	if errors.Is(err, endpoint.ErrForbidden) {
		return udpSocket{}, f.refused(err)
	}
	if err != nil {
		return udpSocket{}, failed(proto.CodeDialFailed, "UDP socket for the destination failed", "destination", f.dest.String(), "err", err)
	}
	sock := udpSocket{Conn: nc, observe: func(int) {}, release: func() {}}
	if bc, ok := nc.(udpflow.BufferedConn); ok {
		sizer, err := udpflow.NewSizer(bc, e.udpSockets, nil)
		if err != nil {
			_ = nc.Close()
			e.cfg.Events.UDPDropped(udpflow.DropFlowLimit)
			return udpSocket{}, failed(proto.CodeOverloaded, "Refused UDP flow: its socket buffer would exceed the server's UDP socket memory; raise --udp-socket-memory-mib (and net.ipv4.udp_mem) if clients need more flows",
				"limit", e.udpSockets.Limit(), "err", err)
		}
		sock.observe, sock.release = sizer.Observe, sizer.Close
	}
	return sock, nil
}

// udpRelay returns the relay between the flow's stream (and its
// connection's datagrams) and sock; the relay closes sock when the flow
// ends. The server's Up is the tunnel's downstream: toward the client.
// Without datagrams (a TCP connection) the flow stays on its stream.
func (e *Handler) udpRelay(f *stream, sock udpSocket) *udpflow.Relay {
	ev := e.cfg.Events
	r := &udpflow.Relay{
		Stream: f.str,
		Up:     &udpflow.Counters{OnPacket: ev.UDPPackets(false)},
		Down:   &udpflow.Counters{OnPacket: ev.UDPPackets(true)},
		Recv: func(buf []byte) ([]byte, error) {
			for {
				n, err := sock.Read(buf)
				if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
					continue // ICMP port unreachable for an earlier packet: UDP goes on
				}
				sock.observe(n)
				return buf[:n], err
			}
		},
		Deliver: func(p []byte) error {
			_, err := sock.Write(p)
			return err
		},
		CloseLocal:  func() { _ = sock.Close() },
		Queue:       udpflow.NewQueue(udpflow.DefaultQueueBytes, e.udpQueues),
		IdleTimeout: e.cfg.UDPIdleTimeout,
		Drop:        ev.UDPDropped,
	}
	var dc udpflow.DatagramConn
	if d, ok := f.st.Conn.(udpflow.DatagramConn); ok {
		dc = d
	}
	r.Sender = udpflow.NewSender(uint64(f.str.StreamID()), dc, f.str, r.Up)
	return r
}

// registerUDPFlow adds the flow to its connection's flows, by its stream
// ID, so that the connection's datagrams for it reach r
// (MaxUDPFlowsPerConn); remove takes it off. Past the limit sock is closed
// and the flow refused.
func (e *Handler) registerUDPFlow(f *stream, r *udpflow.Relay, sock udpSocket) (remove func(), _ *failure) {
	remove, ok := f.st.Flows.Add(uint64(f.str.StreamID()), e.cfg.MaxUDPFlowsPerConn, r.FromDatagram)
	if !ok {
		_ = sock.Close()
		e.cfg.Events.UDPDropped(udpflow.DropFlowLimit)
		return nil, failed(proto.CodeOverloaded, "Refused UDP flow: too many flows on this connection; raise --max-udp-flows-per-conn if clients need more",
			"limit", e.cfg.MaxUDPFlowsPerConn)
	}
	return remove, nil
}

// runUDPFlow answers the client with CodeOK and relays the flow until it
// ends (or its key is cut), registered for /tunnels and the drain; then
// the lines of its end and the audit line.
func (e *Handler) runUDPFlow(f *stream, r *udpflow.Relay, sock udpSocket) *failure {
	str, st := f.str, f.st
	if err := proto.WriteReply(str, proto.CodeOK); err != nil {
		_ = sock.Close()
		return failed(proto.CodeConnReset, "Could not write reply", "err", err)
	}
	// The client has the flow from its first byte on: datagrams from now.
	r.Sender.Establish()
	t := &tunnel.Tunnel{
		UUID:        f.h.TunnelID(),
		StreamID:    int64(str.StreamID()),
		ConnID:      st.ConnID,
		Identity:    strings.Join(f.identities, ","),
		Endpoint:    e.cfg.Endpoint,
		Source:      st.Conn.RemoteAddr().String(),
		Destination: f.target.String(),
		Datagram:    true,
		Transport:   transportOf(st.Conn),
		Direction:   e.direction(),
		CreatedAt:   f.start,
		Upstream:    &r.Down.Bytes,
		Downstream:  &r.Up.Bytes,
	}
	f.logV(4).Info("Opened UDP flow", "destination", f.target.String(), "rule", f.rule, "local", sock.LocalAddr().String())
	defer cutOnRemoval(f.keyLife, r, f.newLogger, "UDP flow")()
	defer f.track(t.Upstream, t.Downstream)()
	result, err := e.cfg.Registry.Run(t, r, udpflow.FlowTunnels{Events: e.cfg.Events})
	up, down := t.Upstream.Load(), t.Downstream.Load()
	f.logV(4).Info("Closed UDP flow", "destination", f.target.String(), "bytesUpstream", up, "bytesDownstream", down,
		"packetsUpstream", r.Down.Datagrams.Load()+r.Down.StreamPackets.Load(),
		"packetsDownstream", r.Up.Datagrams.Load()+r.Up.StreamPackets.Load(),
		"duration", time.Since(f.start), "result", result, "err", err)
	if f.audited {
		f.audit(result, up, down)
	}
	return nil
}

// flowAccount is whom a UDP flow counts against for MaxUDPFlowsPerIdentity
// (and a reverse forward's listener for the server's share per identity):
// the client's own identity, a client certificate's common name and a named
// key ("CN=NAME,key=NAME"); or, for a client with neither (the unnamed
// --secret-file key, which in a one-secret deployment every client holds,
// or no authentication), its source, as the pre-authentication budget
// counts sources; or, without a source, its connection.
func flowAccount(p peer, key proto.Key, st Stream) string {
	var ids []string
	if p.cn != "" {
		ids = append(ids, "CN="+p.cn)
	}
	if key.Name != "" {
		ids = append(ids, "key="+key.Name)
	}
	switch {
	case len(ids) > 0:
		return strings.Join(ids, ",")
	case st.Source != "":
		return "source=" + st.Source
	}
	return "conn=" + strconv.FormatUint(st.ConnID, 10)
}

// shares counts what each account holds of a budget. Safe for concurrent use.
type shares struct {
	mu   sync.Mutex
	open map[string]int
}

// take counts one more for account unless it holds limit already, and
// returns what it held before.
func (s *shares) take(account string, limit int) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.open[account]
	if n >= limit {
		return n, false
	}
	s.open[account] = n + 1
	return n, true
}

// release ends one take of account.
func (s *shares) release(account string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[account]--; s.open[account] <= 0 {
		delete(s.open, account)
	}
}
