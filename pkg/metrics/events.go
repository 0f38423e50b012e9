package metrics

import "time"

// The events the domain packages report, counted into the series above.
// *Server implements egress.Events (the server's streams, and the client's
// reverse half), *Client ingress.Events (the client's local connections,
// and the server's reverse half), *UDP udpflow.Events (in both, embedded).
// This package imports none of those: server/metrics.go and
// client/metrics.go check at compile time that the types fit.

// TunnelOpened counts a spliced TCP or unix tunnel (tunnel.Metrics).
func (m *Server) TunnelOpened() { m.Streams.TunnelOpened() }

// TunnelClosed counts its end with its result and bytes (tunnel.Metrics).
func (m *Server) TunnelClosed(result string, upstream, downstream int64) {
	m.Streams.TunnelClosed(result, upstream, downstream)
}

// StreamFailed counts a stream reset with code before it was spliced
// (streams_total).
func (m *Server) StreamFailed(code string) { m.StreamsTotal.WithLabelValues(code).Inc() }

// AuthFailed counts a stream header that failed shared-secret
// authentication, by reason (auth_failures_total).
func (m *Server) AuthFailed(reason string) { m.AuthFailuresTotal.WithLabelValues(reason).Inc() }

// DestinationRefused counts a destination the rules refused, by network
// and reason (refused_destinations_total).
func (m *Server) DestinationRefused(network, reason string) {
	m.RefusedTotal.WithLabelValues(network, reason).Inc()
}

// ReplayUnrecorded counts a verified header whose nonce the replay cache
// did not record, by reason (replay_unrecorded_total).
func (m *Server) ReplayUnrecorded(reason string) {
	m.ReplayUnrecordedTotal.WithLabelValues(reason).Inc()
}

// ReplayCacheSize sets the nonces the replay cache holds
// (replay_cache_entries).
func (m *Server) ReplayCacheSize(n int) { m.ReplayCacheEntries.Set(float64(n)) }

// Dialed observes the time a dial took (dial_duration_seconds).
func (m *Server) Dialed(d time.Duration) { m.DialDuration.Observe(d.Seconds()) }

// UDPSocketBuffers adds delta to the flows' socket receive buffers
// (udp_socket_buffer_bytes).
func (m *Server) UDPSocketBuffers(delta float64) { m.SocketBufferBytes.Add(delta) }

// TunnelOpened counts a spliced TCP or unix tunnel (tunnel.Metrics).
func (m *Client) TunnelOpened() { m.Streams.TunnelOpened() }

// TunnelClosed counts its end with its result and bytes (tunnel.Metrics).
func (m *Client) TunnelClosed(result string, upstream, downstream int64) {
	m.Streams.TunnelClosed(result, upstream, downstream)
}

// Accepted counts a local connection accepted (accepted_connections_total).
func (m *Client) Accepted() { m.AcceptedTotal.Inc() }

// StreamFailed counts a local connection that ended before it was spliced,
// by result (streams_total).
func (m *Client) StreamFailed(result string) { m.StreamsTotal.WithLabelValues(result).Inc() }

// ProxyAuthFailed counts a proxy connection turned away for its
// credentials (proxy_auth_failures_total).
func (m *Client) ProxyAuthFailed(proxy, reason string) {
	m.ProxyAuthFailuresTotal.WithLabelValues(proxy, reason).Inc()
}

// StreamOpened observes the time from a local connection's accept (or a
// flow's first packet) to the server's reply (stream_open_duration_seconds).
func (m *Client) StreamOpened(d time.Duration) { m.StreamOpenDuration.Observe(d.Seconds()) }

// UDPFlowOpened counts a flow that started relaying (udp_flows_active).
func (m *UDP) UDPFlowOpened() { m.Flows.TunnelOpened() }

// UDPFlowClosed counts its end with its result (udp_flows_active,
// udp_flows_total).
func (m *UDP) UDPFlowClosed(result string) { m.Flows.TunnelClosed(result, 0, 0) }

// UDPFlowFailed counts a flow that ended before it was relayed
// (udp_flows_total).
func (m *UDP) UDPFlowFailed(result string) { m.FlowsTotal.WithLabelValues(result).Inc() }

// UDPDropped counts a dropped packet by reason (udp_drops_total).
func (m *UDP) UDPDropped(reason string) { m.Drop(reason) }

// UDPPackets returns the hook counting the packets going upstream or
// downstream (OnPacket).
func (m *UDP) UDPPackets(upstream bool) func(path string, n int) {
	if upstream {
		return m.OnPacket(DirectionUpstream)
	}
	return m.OnPacket(DirectionDownstream)
}

// UDPQueued adds delta to the bytes queued between the flows' sockets and
// the tunnel (udp_queued_bytes).
func (m *UDP) UDPQueued(delta float64) { m.QueuedBytes.Add(delta) }
