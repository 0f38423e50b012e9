package metrics

import "github.com/prometheus/client_golang/prometheus"

// UDP holds a daemon's UDP flow metrics (quictun_<daemon>_udp_*).
type UDP struct {
	FlowsActive  prometheus.Gauge
	FlowsTotal   *prometheus.CounterVec // by result
	PacketsTotal *prometheus.CounterVec // by direction and path
	BytesTotal   *prometheus.CounterVec // by direction
	DropsTotal   *prometheus.CounterVec // by reason
	// QueuedBytes follows the bytes of packets queued between the flows'
	// local sockets and the tunnel; SocketBufferBytes (the server's; nil on
	// the client) the receive buffers of the flows' sockets to their
	// destinations.
	QueuedBytes, SocketBufferBytes prometheus.Gauge
	// Flows counts the flows as tunnels (tunnel.Metrics): FlowsActive and
	// FlowsTotal; their bytes are counted per packet (OnPacket).
	Flows *Tunnels

	receiveQueueDrops prometheus.Counter
	// pathDatagram is the path label of a packet sent as a QUIC datagram.
	pathDatagram string
	// Per direction, pre-resolved for the data path.
	upDatagram, upStream, downDatagram, downStream prometheus.Counter
	upBytes, downBytes                             prometheus.Counter
}

// newUDP creates and registers the UDP metrics of daemon sub ("client" or
// "server", or a reverse half); sockets: the half that opens flow sockets.
func newUDP(reg prometheus.Registerer, sub string, l Labels, sockets bool) *UDP {
	m := &UDP{
		FlowsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: sub, Name: "udp_flows_active",
			Help: "UDP flows currently open.",
		}),
		FlowsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "udp_flows_total",
			Help: "UDP flows ended, by result (ok: closed or idle; or the error code, as for streams_total).",
		}, []string{"result"}),
		PacketsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "udp_packets_total",
			Help: "UDP packets carried, by direction (upstream = toward the destination) and path (datagram: a QUIC datagram; stream: on the flow's stream, for a flow's first packets and packets too large for a datagram).",
		}, []string{"direction", "path"}),
		BytesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "udp_bytes_total",
			Help: "UDP payload bytes carried, by direction.",
		}, []string{"direction"}),
		DropsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "udp_drops_total",
			Help: "UDP packets dropped by the tunnel, by reason: unknown_flow (a datagram for a flow not open), malformed, queue_full (the flow's send queue was full), flow_limit (a new flow beyond the limit), identity_flow_limit (server: a new flow beyond its client identity's share, --max-udp-flows-per-identity), write_error (the local socket refused it), no_session (no connection to the server, or the flow could not be opened), foreign_source (a SOCKS5 UDP datagram from another address than the association's client), receive_queue (a datagram that arrived while the daemon was too far behind in reading the connection's datagrams).",
		}, []string{"reason"}),
		QueuedBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: sub, Name: "udp_queued_bytes",
			Help: "Bytes of UDP packets queued between the flows' local sockets and the tunnel (with 64 bytes of overhead each), bounded per flow and in total; past either the packet is dropped (udp_drops_total{reason=\"queue_full\"}).",
		}),
	}
	reg.MustRegister(m.FlowsActive, m.FlowsTotal, m.PacketsTotal, m.BytesTotal, m.DropsTotal, m.QueuedBytes)
	if sockets {
		m.SocketBufferBytes = prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: sub, Name: "udp_socket_buffer_bytes",
			Help: "Receive buffers of the UDP flows' sockets to their destinations, as the kernel books them (twice the size asked); each starts at 128 KiB and grows with its flow's rate, within --udp-socket-memory-mib.",
		})
		reg.MustRegister(m.SocketBufferBytes)
	}
	for _, c := range l.Codes {
		m.FlowsTotal.WithLabelValues(c)
	}
	for _, r := range l.UDPDropReasons {
		m.DropsTotal.WithLabelValues(r)
	}
	m.receiveQueueDrops = m.DropsTotal.WithLabelValues(l.UDPDropReceiveQueue)
	m.pathDatagram = l.UDPPathDatagram
	m.upDatagram = m.PacketsTotal.WithLabelValues(DirectionUpstream, l.UDPPathDatagram)
	m.upStream = m.PacketsTotal.WithLabelValues(DirectionUpstream, l.UDPPathStream)
	m.downDatagram = m.PacketsTotal.WithLabelValues(DirectionDownstream, l.UDPPathDatagram)
	m.downStream = m.PacketsTotal.WithLabelValues(DirectionDownstream, l.UDPPathStream)
	m.Flows = newTunnels(m.FlowsActive, m.FlowsTotal, nil)
	m.upBytes = m.BytesTotal.WithLabelValues(DirectionUpstream)
	m.downBytes = m.BytesTotal.WithLabelValues(DirectionDownstream)
	return m
}

// OnPacket returns the udpflow.Counters hook that counts packets of
// direction (DirectionUpstream or DirectionDownstream) by path
// (Labels.UDPPathDatagram, else the stream path).
func (m *UDP) OnPacket(direction string) func(path string, n int) {
	dg, st, bytes := m.downDatagram, m.downStream, m.downBytes
	if direction == DirectionUpstream {
		dg, st, bytes = m.upDatagram, m.upStream, m.upBytes
	}
	datagram := m.pathDatagram
	return func(path string, n int) {
		if path == datagram {
			dg.Inc()
		} else {
			st.Inc()
		}
		bytes.Add(float64(n))
	}
}

// Drop counts a dropped packet by reason (Labels.UDPDropReasons).
func (m *UDP) Drop(reason string) { m.DropsTotal.WithLabelValues(reason).Inc() }

// ReceiveQueueDrops counts n datagrams quic-go discarded because the
// connection's datagram goroutine was behind (the dgram.Serve callback), as
// Labels.UDPDropReceiveQueue.
func (m *UDP) ReceiveQueueDrops(n int) { m.receiveQueueDrops.Add(float64(n)) }
