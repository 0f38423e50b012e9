package egress

import (
	"context"
	"errors"
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
// flow ends (see package udpflow).
//
//nolint:funlen // TODO(#33): split into named steps as stream.serve is (left to the server half's owner)
func (e *Handler) serveUDP(ctx context.Context, f *stream) *failure {
	ev := e.cfg.Events
	st, str := f.st, f.str
	// account is whom the flow counts against for MaxUDPFlowsPerIdentity.
	account := flowAccount(f.peer, f.key, st)
	// The identity's share first, so that an identity over it does not
	// touch the server-wide count.
	if open, ok := e.flowShares.take(account, e.cfg.MaxUDPFlowsPerIdentity); !ok {
		ev.UDPDropped(udpflow.DropIdentityFlowLimit)
		return failed(proto.CodeOverloaded, "Refused UDP flow: this client identity holds its share of the server's flows; raise --max-udp-flows-per-identity if it needs more",
			"account", account, "open", open, "limit", e.cfg.MaxUDPFlowsPerIdentity)
	}
	defer e.flowShares.release(account)
	if n := e.udpFlows.Add(1); n > int64(e.cfg.MaxUDPFlows) {
		e.udpFlows.Add(-1)
		ev.UDPDropped(udpflow.DropFlowLimit)
		return failed(proto.CodeOverloaded, "Refused UDP flow: the server is at its flow limit; raise --max-udp-flows if clients need more",
			"limit", e.cfg.MaxUDPFlows)
	}
	defer e.udpFlows.Add(-1)

	// Connecting a UDP socket sends nothing; the checked dialer refuses an
	// address the rules do not allow, as for TCP.
	dctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	nc, err := e.cfg.Dialer.DialContext(dctx, f.target.Network, f.target.Address)
	cancel()
	if errors.Is(err, endpoint.ErrForbidden) {
		return f.refused(err)
	}
	if err != nil {
		return failed(proto.CodeDialFailed, "UDP socket for the destination failed", "destination", f.dest.String(), "err", err)
	}
	// The socket's receive buffer starts small and grows with the flow's
	// rate, within the server's budget (udpflow.Sizer); the Relay reads it
	// whether or not the client takes the packets, so a stalled flow drops
	// packets rather than holding the host's UDP memory.
	observe := func(int) {}
	if bc, ok := nc.(udpflow.BufferedConn); ok {
		sizer, err := udpflow.NewSizer(bc, e.udpSockets, nil)
		if err != nil {
			_ = nc.Close()
			ev.UDPDropped(udpflow.DropFlowLimit)
			return failed(proto.CodeOverloaded, "Refused UDP flow: its socket buffer would exceed the server's UDP socket memory; raise --udp-socket-memory-mib (and net.ipv4.udp_mem) if clients need more flows",
				"limit", e.udpSockets.Limit(), "err", err)
		}
		defer sizer.Close()
		observe = sizer.Observe
	}
	id := uint64(str.StreamID())
	r := &udpflow.Relay{
		Stream: str,
		Up:     &udpflow.Counters{OnPacket: ev.UDPPackets(false)},
		Down:   &udpflow.Counters{OnPacket: ev.UDPPackets(true)},
		Recv: func(buf []byte) ([]byte, error) {
			for {
				n, err := nc.Read(buf)
				if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
					continue // ICMP port unreachable for an earlier packet: UDP goes on
				}
				observe(n)
				return buf[:n], err
			}
		},
		Deliver: func(p []byte) error {
			_, err := nc.Write(p)
			return err
		},
		CloseLocal:  func() { _ = nc.Close() },
		Queue:       udpflow.NewQueue(udpflow.DefaultQueueBytes, e.udpQueues),
		IdleTimeout: e.cfg.UDPIdleTimeout,
		Drop:        ev.UDPDropped,
	}
	// The server's Up is the tunnel's downstream: toward the client.
	// Without datagrams (a TCP connection) the flow stays on its stream.
	var dc udpflow.DatagramConn
	if d, ok := st.Conn.(udpflow.DatagramConn); ok {
		dc = d
	}
	r.Sender = udpflow.NewSender(id, dc, str, r.Up)
	remove, ok := st.Flows.Add(id, e.cfg.MaxUDPFlowsPerConn, r.FromDatagram)
	if !ok {
		_ = nc.Close()
		ev.UDPDropped(udpflow.DropFlowLimit)
		return failed(proto.CodeOverloaded, "Refused UDP flow: too many flows on this connection; raise --max-udp-flows-per-conn if clients need more",
			"limit", e.cfg.MaxUDPFlowsPerConn)
	}
	defer remove()
	if err := proto.WriteReply(str, proto.CodeOK); err != nil {
		_ = nc.Close()
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
	f.logger.V(4).Info("Opened UDP flow", "destination", f.target.String(), "rule", f.rule, "local", nc.LocalAddr().String())
	defer cutOnRemoval(f.keyLife, r, f.logger, "UDP flow")()
	defer f.track(t.Upstream, t.Downstream)()
	result, err := e.cfg.Registry.Run(t, r, udpflow.FlowTunnels{Events: ev})
	up, down := t.Upstream.Load(), t.Downstream.Load()
	f.logger.V(4).Info("Closed UDP flow", "destination", f.target.String(), "bytesUpstream", up, "bytesDownstream", down,
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
