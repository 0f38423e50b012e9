package udpflow

// Events are what the UDP flows of one side of a tunnel report (pkg/egress
// and pkg/ingress embed them in their own Events), named by what happened:
// the daemon's metrics implement them (metrics.UDP, the
// quictun_<daemon>_udp_* series), NopEvents ignores them.
type Events interface {
	// UDPFlowOpened reports a flow that started relaying; UDPFlowClosed its
	// end, with its result (ok, or the name of the code it ended with).
	// FlowTunnels hands both to a tunnel.Registry.
	UDPFlowOpened()
	UDPFlowClosed(result string)
	// UDPFlowFailed reports a flow that ended before it was relayed, with
	// the name of the code it ended with (the client's flows: no session,
	// a refusal from the server).
	UDPFlowFailed(result string)
	// UDPDropped reports a packet dropped, by reason (DropReasons).
	UDPDropped(reason string)
	// UDPPackets returns the Counters.OnPacket hook of the packets going
	// upstream (toward the destination) or downstream. It is called once a
	// flow direction, the hook once a packet.
	UDPPackets(upstream bool) func(path string, n int)
	// UDPQueued reports a change of the bytes queued between the flows'
	// local sockets and the tunnel (the Budget of their queues, by
	// GaugeFunc).
	UDPQueued(delta float64)
}

// NopEvents is an Events that reports nothing.
type NopEvents struct{}

// UDPFlowOpened implements Events.
func (NopEvents) UDPFlowOpened() {}

// UDPFlowClosed implements Events.
func (NopEvents) UDPFlowClosed(string) {}

// UDPFlowFailed implements Events.
func (NopEvents) UDPFlowFailed(string) {}

// UDPDropped implements Events.
func (NopEvents) UDPDropped(string) {}

// UDPPackets implements Events.
func (NopEvents) UDPPackets(bool) func(string, int) { return func(string, int) {} }

// UDPQueued implements Events.
func (NopEvents) UDPQueued(float64) {}

// FlowTunnels reports the flows a tunnel.Registry runs (it implements
// tunnel.Metrics) as Events: their opens and ends; their bytes are counted
// per packet (UDPPackets).
type FlowTunnels struct{ Events Events }

// TunnelOpened reports a flow that started relaying.
func (f FlowTunnels) TunnelOpened() { f.Events.UDPFlowOpened() }

// TunnelClosed reports its end with its result.
func (f FlowTunnels) TunnelClosed(result string, _, _ int64) { f.Events.UDPFlowClosed(result) }

// GaugeFunc is a Gauge that calls itself with each change (an Events
// method such as UDPQueued).
type GaugeFunc func(delta float64)

// Add implements Gauge.
func (f GaugeFunc) Add(delta float64) { f(delta) }
