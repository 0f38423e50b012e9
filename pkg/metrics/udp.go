package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/udpflow"
)

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

	// Per direction, pre-resolved for the data path.
	upDatagram, upStream, downDatagram, downStream prometheus.Counter
	upBytes, downBytes                             prometheus.Counter
}

// newUDP creates and registers the UDP metrics of daemon sub ("client" or
// "server", or a reverse half); sockets: the half that opens flow sockets.
func newUDP(reg prometheus.Registerer, sub string, sockets bool) *UDP {
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
	for _, c := range proto.AllCodes() {
		m.FlowsTotal.WithLabelValues(ResultLabel(c))
	}
	for _, r := range udpflow.DropReasons() {
		m.DropsTotal.WithLabelValues(r)
	}
	m.upDatagram = m.PacketsTotal.WithLabelValues(DirectionUpstream, udpflow.PathDatagram)
	m.upStream = m.PacketsTotal.WithLabelValues(DirectionUpstream, udpflow.PathStream)
	m.downDatagram = m.PacketsTotal.WithLabelValues(DirectionDownstream, udpflow.PathDatagram)
	m.downStream = m.PacketsTotal.WithLabelValues(DirectionDownstream, udpflow.PathStream)
	m.upBytes = m.BytesTotal.WithLabelValues(DirectionUpstream)
	m.downBytes = m.BytesTotal.WithLabelValues(DirectionDownstream)
	return m
}

// OnPacket returns the udpflow.Counters hook that counts packets of
// direction (DirectionUpstream or DirectionDownstream).
func (m *UDP) OnPacket(direction string) func(path string, n int) {
	dg, st, bytes := m.downDatagram, m.downStream, m.downBytes
	if direction == DirectionUpstream {
		dg, st, bytes = m.upDatagram, m.upStream, m.upBytes
	}
	return func(path string, n int) {
		if path == udpflow.PathDatagram {
			dg.Inc()
		} else {
			st.Inc()
		}
		bytes.Add(float64(n))
	}
}

// Drop counts a dropped packet by reason (udpflow.DropReasons).
func (m *UDP) Drop(reason string) { m.DropsTotal.WithLabelValues(reason).Inc() }

// ReceiveQueueDrops counts n datagrams quic-go discarded because the
// connection's datagram goroutine was behind (the dgram.Serve callback).
func (m *UDP) ReceiveQueueDrops(n int) {
	m.DropsTotal.WithLabelValues(udpflow.DropReceiveQueue).Add(float64(n))
}
