package metrics

import "github.com/prometheus/client_golang/prometheus"

// Namespace prefixes every quictun metric.
const Namespace = "quictun"

// DurationBuckets span 100 µs to 10 s.
var DurationBuckets = prometheus.ExponentialBucketsRange(0.0001, 10, 16)

// ResultOK is the result of a tunnel that ended cleanly.
const ResultOK = "ok"

// Label values of the server's pre-authentication metrics.
const (
	// RefusedMaxConnections: refused_connections_total, the server held --max-connections.
	RefusedMaxConnections = "max_connections"
	// RefusedTCPHandshakes: refused_connections_total, a TCP connection
	// arrived while the server held its most TCP connections in their TLS
	// handshake.
	RefusedTCPHandshakes = "tcp_handshakes"
	// RefusedTCPHandshakesPerSource: refused_connections_total, a TCP
	// connection's ClientHello arrived while its source (an IPv4 address or
	// an IPv6 /64) held its share of the TCP handshakes in progress.
	RefusedTCPHandshakesPerSource = "tcp_handshakes_per_source"
	// RefusedTCPWaiting: refused_connections_total, a TCP connection
	// arrived while the server held its most TCP connections waiting for
	// their ClientHello.
	RefusedTCPWaiting = "tcp_waiting"
	// RefusedTCPWaitingPerSource: refused_connections_total, a TCP
	// connection arrived while its source held its share of the connections
	// waiting for their ClientHello.
	RefusedTCPWaitingPerSource = "tcp_waiting_per_source"
	// PreauthAuthTimeout: a connection closed because it presented no verified
	// stream header within --auth-timeout of its first stream or
	// --idle-auth-timeout of its handshake.
	PreauthAuthTimeout = "auth_timeout"
	// PreauthUnverifiedStreamsLimit: a stream of a not yet authenticated
	// connection reset because --max-unverified-streams were in use.
	PreauthUnverifiedStreamsLimit = "unverified_streams_limit"
	// PreauthSourceUnverifiedStreamsLimit: a stream of a not yet
	// authenticated connection reset because its source held its share,
	// --max-unverified-streams-per-source.
	PreauthSourceUnverifiedStreamsLimit = "unverified_streams_per_source_limit"
)

// Directions for byte counters: upstream flows from the application toward the
// destination, downstream back.
const (
	DirectionUpstream   = "upstream"
	DirectionDownstream = "downstream"
)

// Labels are the label values whose series a daemon's metrics create at 0 so
// that rates and alerts see them before the first event. They are defined by
// the domain packages (the protocol's codes, the allow list's refusal
// reasons, the UDP relay's drop reasons and paths): the composition (server,
// client) fills them in, so that this package imports none of them.
type Labels struct {
	// Codes are the protocol's error codes as result labels (streams_total,
	// udp_flows_total).
	Codes []string
	// Networks and RefusalReasons span refused_destinations_total (server).
	Networks, RefusalReasons []string
	// UDPDropReasons span udp_drops_total; UDPDropReceiveQueue is the one
	// of UDP.ReceiveQueueDrops.
	UDPDropReasons      []string
	UDPDropReceiveQueue string
	// UDPPathDatagram and UDPPathStream are the path labels of
	// udp_packets_total, as the UDP relay reports them to UDP.OnPacket.
	UDPPathDatagram, UDPPathStream string
	// AuthFailureReasons span auth_failures_total, ReplayUnrecordedReasons
	// replay_unrecorded_total (pkg/egress: the server, the client's reverse
	// half).
	AuthFailureReasons, ReplayUnrecordedReasons []string
	// Proxies and ProxyAuthReasons span proxy_auth_failures_total;
	// NoSession is the streams_total result of a stream that found no
	// connection (pkg/ingress: the client, the server's reverse half).
	Proxies, ProxyAuthReasons []string
	NoSession                 string
	// TicketIssuers span session_tickets_total (server; pkg/transport).
	TicketIssuers []string
}

// Server holds the server's metrics.
type Server struct {
	StreamsTotal      *prometheus.CounterVec
	ActiveStreams     prometheus.Gauge
	DialDuration      prometheus.Histogram
	StreamBytesTotal  *prometheus.CounterVec
	ConnectionsTotal  *prometheus.CounterVec
	ActiveConnections prometheus.Gauge
	// ActiveTCPConnections counts the connections of ActiveConnections
	// carried over TCP (the fallback for clients whose UDP is blocked).
	ActiveTCPConnections prometheus.Gauge
	// TCPHandshakeFailuresTotal counts TCP connections that did not complete
	// the TLS handshake and HTTP/2 preface.
	TCPHandshakeFailuresTotal prometheus.Counter
	// RefusedTotal counts refused destinations by network and reason
	// (endpoint.RefusalReasons).
	RefusedTotal *prometheus.CounterVec
	Draining     prometheus.Gauge
	// RefusedConnectionsTotal counts QUIC connections refused by per-source limits.
	RefusedConnectionsTotal *prometheus.CounterVec
	// DroppedDatagramsTotal counts datagrams the server's QUIC transport
	// dropped before any connection saw them, by reason (see DropRecorder).
	DroppedDatagramsTotal *prometheus.CounterVec
	// PreauthRejectionsTotal counts what the server refused or closed because
	// a peer had not (yet) proven the shared secret, by reason.
	PreauthRejectionsTotal *prometheus.CounterVec
	// UnverifiedStreams is the number of streams being served whose header
	// has not been verified yet.
	UnverifiedStreams prometheus.Gauge
	// ReplayCacheEntries is the number of nonces in the replay cache.
	ReplayCacheEntries prometheus.Gauge
	// ReplayUnrecordedTotal counts verified headers whose nonce the replay
	// cache did not record, by reason.
	ReplayUnrecordedTotal *prometheus.CounterVec
	// AuthFailuresTotal counts stream headers that failed shared-secret
	// authentication, or whose client certificate the auth hook refused
	// or could not answer for, by reason.
	AuthFailuresTotal *prometheus.CounterVec
	// SessionTicketsTotal counts the session tickets presented to resume,
	// by the replica that issued them (only the server's, not the client's
	// reverse half: nil there).
	SessionTicketsTotal *prometheus.CounterVec
	// UDP holds the UDP flow metrics (and implements udpflow.Events).
	*UDP
	// Streams counts the server's TCP and unix tunnels (tunnel.Metrics).
	Streams *Tunnels
}

// NewServer creates and registers the server metrics on reg.
func NewServer(reg prometheus.Registerer, l Labels) *Server {
	m := newServer(reg, "server", l)
	m.SessionTicketsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "server", Name: "session_tickets_total",
		Help: "Session tickets presented by clients resuming a session, by issuer: this_replica (0-RTT accepted), other_replica (another server sharing the session-ticket key, --replica-id: resumed without 0-RTT), unknown (a ticket naming no replica, from a server before replica IDs: resumed without 0-RTT).",
	}, []string{"issuer"})
	reg.MustRegister(m.SessionTicketsTotal)
	for _, i := range l.TicketIssuers {
		m.SessionTicketsTotal.WithLabelValues(i)
	}
	return m
}

// SessionTicket counts a session ticket presented to resume, by issuer
// (session_tickets_total).
func (m *Server) SessionTicket(issuer string) { m.SessionTicketsTotal.WithLabelValues(issuer).Inc() }

// NewReverseServer creates and registers, on the client, the metrics of the
// half that serves reverse forwards' streams (pkg/egress): the server's
// metrics, named quictun_client_reverse_* (streams_total, dial_duration_seconds, ...).
func NewReverseServer(reg prometheus.Registerer, l Labels) *Server {
	return newServer(reg, "client_reverse", l)
}

//nolint:funlen // the metric declarations: one list, as the README lists them
func newServer(reg prometheus.Registerer, sub string, l Labels) *Server {
	m := &Server{
		StreamsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "streams_total",
			Help: "Tunnel streams handled, by result (ok or the error code sent to the client).",
		}, []string{"result"}),
		ActiveStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: sub, Name: "active_streams",
			Help: "Tunnel streams currently open.",
		}),
		DialDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: sub, Name: "dial_duration_seconds",
			Help: "Time to connect to the destination.", Buckets: DurationBuckets,
		}),
		StreamBytesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "stream_bytes_total",
			Help: "Application bytes carried, by direction (upstream = toward the destination).",
		}, []string{"direction"}),
		ConnectionsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "connections_total",
			Help: "Connections accepted (QUIC, and TCP: active_tcp_connections), by how they ended (closed, idle_timeout, auth_failed, auth_timeout: no authenticated stream header within --idle-auth-timeout of the handshake, shutdown, error).",
		}, []string{"result"}),
		ActiveConnections: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: sub, Name: "active_connections",
			Help: "Connections currently open (QUIC and TCP).",
		}),
		RefusedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "refused_destinations_total",
			Help: "Streams refused because the destination is not allowed, by network (tcp, udp, unix) and reason (not_allowed: no --allow rule; denied: a --deny rule; reserved: unspecified or cloud metadata address; self: the server's own QUIC or admin listener; unresolved: the name does not resolve).",
		}, []string{"network", "reason"}),
		Draining: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: sub, Name: "draining",
			Help: "1 while the server drains before shutdown.",
		}),
	}
	m.ActiveTCPConnections = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: sub, Name: "active_tcp_connections",
		Help: "Of active_connections, those carried over TCP (--tcp-listen-on: clients whose UDP is blocked).",
	})
	m.TCPHandshakeFailuresTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: sub, Name: "tcp_handshake_failures_total",
		Help: "TCP connections that did not complete the TLS handshake and HTTP/2 preface (wrong client, scanner, timeout).",
	})
	m.RefusedConnectionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: sub, Name: "refused_connections_total",
		Help: "Connections (QUIC and TCP) refused by connection limits, by reason: handshake_rate (the source's handshakes per second), per_source_limit (--max-conns-per-source; TCP: at accept), max_connections, tcp_waiting and tcp_waiting_per_source (TCP: too many connections waiting for their ClientHello, 4x --max-tcp-handshakes, or the source's sixteenth of them), tcp_handshakes and tcp_handshakes_per_source (TCP: too many connections in their TLS handshake, --max-tcp-handshakes, or the source's sixteenth of them).",
	}, []string{"reason"})
	m.DroppedDatagramsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: sub, Name: "dropped_datagrams_total",
		Help: "UDP datagrams dropped before reaching a connection, by reason: not_quic, header_parse_error, unexpected_version (an unknown QUIC version), unknown_connection_id, dos_prevention, unexpected_packet, ... (quic-go's qlog drop triggers).",
	}, []string{"reason"})
	m.PreauthRejectionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: sub, Name: "preauth_rejections_total",
		Help: "Connections closed and streams reset because the peer had not proven the shared secret, by reason: auth_timeout (connection: no verified stream header within --auth-timeout of its first stream or --idle-auth-timeout of its handshake), unverified_streams_limit (stream: --max-unverified-streams in use), unverified_streams_per_source_limit (stream: its source, an IPv4 address or IPv6 /64, held --max-unverified-streams-per-source).",
	}, []string{"reason"})
	m.UnverifiedStreams = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: sub, Name: "unverified_streams",
		Help: "Streams being served whose header has not been verified yet (at most --max-unverified-streams-per-conn per connection).",
	})
	m.ReplayCacheEntries = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: sub, Name: "replay_cache_entries",
		Help: "Stream header nonces held by the replay cache (capacity 1,048,576; 1-RTT streams use up to three quarters).",
	})
	m.ReplayUnrecordedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: sub, Name: "replay_unrecorded_total",
		Help: "Verified stream headers whose nonce was not recorded in the replay cache, by reason: cache_full, conn_quota (--max-replay-entries-per-conn). A 0-RTT stream that cannot be recorded is reset with overloaded; a 1-RTT stream is served.",
	}, []string{"reason"})
	m.AuthFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: sub, Name: "auth_failures_total",
		Help: "Stream headers that failed shared-secret authentication (the connection is closed with auth_failed), by reason: no_mac (the client has no --secret-file), unknown_key (a wrong secret: the key ID derived from it names no key the server holds; or a key removed in a rotation), bad_mac (the key ID matches but the MAC does not: a forged or corrupted header, or a client from before key IDs with a wrong secret); hook_unavailable (--auth-hook gave no usable answer for an unknown key ID or a client certificate: refused with overloaded, the connection kept), hook_refused (--auth-hook refused the client certificate: 403 or 404).",
	}, []string{"reason"})
	reg.MustRegister(m.StreamsTotal, m.ActiveStreams, m.DialDuration, m.StreamBytesTotal,
		m.ConnectionsTotal, m.ActiveConnections, m.RefusedTotal, m.Draining, m.RefusedConnectionsTotal, m.DroppedDatagramsTotal,
		m.ActiveTCPConnections, m.TCPHandshakeFailuresTotal,
		m.PreauthRejectionsTotal, m.UnverifiedStreams, m.ReplayCacheEntries, m.ReplayUnrecordedTotal, m.AuthFailuresTotal)
	for _, r := range l.AuthFailureReasons {
		m.AuthFailuresTotal.WithLabelValues(r)
	}
	for _, r := range []string{PreauthAuthTimeout, PreauthUnverifiedStreamsLimit, PreauthSourceUnverifiedStreamsLimit} {
		m.PreauthRejectionsTotal.WithLabelValues(r)
	}
	for _, r := range l.ReplayUnrecordedReasons {
		m.ReplayUnrecordedTotal.WithLabelValues(r)
	}
	for _, r := range []string{DropNotQUIC, "header_parse_error", "unexpected_version", "unknown_connection_id", "dos_prevention"} {
		m.DroppedDatagramsTotal.WithLabelValues(r)
	}
	for _, r := range []string{"handshake_rate", RefusedTCPHandshakes, RefusedTCPHandshakesPerSource, RefusedTCPWaiting,
		RefusedTCPWaitingPerSource, "per_source_limit", RefusedMaxConnections} {
		m.RefusedConnectionsTotal.WithLabelValues(r)
	}
	for _, c := range l.Codes {
		m.StreamsTotal.WithLabelValues(c)
	}
	for _, d := range []string{DirectionUpstream, DirectionDownstream} {
		m.StreamBytesTotal.WithLabelValues(d)
	}
	for _, r := range []string{"closed", "idle_timeout", "auth_failed", "auth_timeout", "shutdown", "flood", "protocol_error", "error"} {
		m.ConnectionsTotal.WithLabelValues(r)
	}
	for _, n := range l.Networks {
		for _, r := range l.RefusalReasons {
			m.RefusedTotal.WithLabelValues(n, r)
		}
	}
	m.UDP = newUDP(reg, sub, l, true)
	m.Streams = newTunnels(m.ActiveStreams, m.StreamsTotal, m.StreamBytesTotal)
	return m
}

// Client holds the client's metrics.
type Client struct {
	SessionUp       prometheus.Gauge
	ReconnectsTotal prometheus.Counter
	DialsTotal      *prometheus.CounterVec
	// TCPDialsTotal counts TCP connections made for the fallback
	// (--transport auto|tcp), by result (ok, error).
	TCPDialsTotal      *prometheus.CounterVec
	HandshakeDuration  prometheus.Histogram
	StreamsTotal       *prometheus.CounterVec
	ActiveStreams      prometheus.Gauge
	StreamOpenDuration prometheus.Histogram
	StreamBytesTotal   *prometheus.CounterVec
	AcceptedTotal      prometheus.Counter
	PathRescuesTotal   *prometheus.CounterVec
	// PathSwitchesTotal counts switches of the connection to a new path, by
	// reason (SwitchReasons); PathSwitchFailuresTotal the attempts after a
	// route change that did not validate a path.
	PathSwitchesTotal       *prometheus.CounterVec
	PathSwitchFailuresTotal *prometheus.CounterVec
	// ProxyAuthFailuresTotal counts proxy connections turned away for their
	// credentials, by proxy kind and reason.
	ProxyAuthFailuresTotal *prometheus.CounterVec
	// Transport is 1 for the transport new tunnels go on (quic, tcp), 0
	// for the other.
	Transport *prometheus.GaugeVec
	// UDP holds the UDP flow metrics (and implements udpflow.Events).
	*UDP
	// Streams counts the client's TCP and unix tunnels (tunnel.Metrics).
	Streams *Tunnels
}

// NewClient creates and registers the client metrics on reg.
func NewClient(reg prometheus.Registerer, l Labels) *Client { return newClient(reg, "client", l) }

// NewReverseClient creates and registers, on the server, the metrics of the
// half that carries reverse forwards' connections (pkg/ingress): the
// client's metrics, named quictun_server_reverse_* (streams_total,
// active_streams, stream_bytes_total, ...).
func NewReverseClient(reg prometheus.Registerer, l Labels) *Client {
	return newClient(reg, "server_reverse", l)
}

//nolint:funlen // the metric declarations: one list, as the README lists them
func newClient(reg prometheus.Registerer, sub string, l Labels) *Client {
	m := &Client{
		SessionUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: sub, Name: "session_up",
			Help: "1 while a connection to the server is up (QUIC, or TCP: quictun_client_transport).",
		}),
		ReconnectsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "reconnects_total",
			Help: "QUIC connections lost after having been up (each starts a reconnect).",
		}),
		DialsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "dials_total",
			Help: "QUIC connection attempts, by result (ok, ok_0rtt: resumed with 0-RTT, 0rtt_rejected: resumed but the server refused 0-RTT, error, auth_failed, cert_rejected: the server's certificate did not verify, a pin or the CA refused it).",
		}, []string{"result"}),
		TCPDialsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "tcp_dials_total",
			Help: "TCP connections to the server for the fallback (--transport auto while QUIC does not get through, or tcp), by result (ok, error, cert_rejected: the server's certificate did not verify).",
		}, []string{"result"}),
		HandshakeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: sub, Name: "handshake_duration_seconds",
			Help: "Time to establish the QUIC connection.", Buckets: DurationBuckets,
		}),
		StreamsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "streams_total",
			Help: "Tunneled connections, by result (ok, no_session, or the error code from the server).",
		}, []string{"result"}),
		ActiveStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: sub, Name: "active_streams",
			Help: "Tunneled connections currently open.",
		}),
		StreamOpenDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: sub, Name: "stream_open_duration_seconds",
			Help: "Time from accepting a local connection to the server's reply that the destination was dialed.", Buckets: DurationBuckets,
		}),
		StreamBytesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "stream_bytes_total",
			Help: "Application bytes carried, by direction (upstream = toward the server).",
		}, []string{"direction"}),
		AcceptedTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "accepted_connections_total",
			Help: "Local connections accepted on the client's listeners.",
		}),
		PathRescuesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "path_rescues_total",
			Help: "Blackout rescues: switched (a new path validated), recovered (the old path came back first), error.",
		}, []string{"result"}),
		PathSwitchesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "path_switches_total",
			Help: "Switches of the QUIC connection to a new path (a fresh UDP socket, validated first), by reason: route_changed (the route to the server now leaves from another source address or interface, seen by --route-watch), address_removed (the same, and the old source address is gone from the host), blackout (no heartbeat echo for --rescue-after).",
		}, []string{"reason"}),
		PathSwitchFailuresTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "path_switch_failures_total",
			Help: "Path switches after a route change (reason route_changed or address_removed) that did not validate a new path within 3 s; the blackout rescue stays armed.",
		}, []string{"reason"}),
		ProxyAuthFailuresTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: sub, Name: "proxy_auth_failures_total",
			Help: "Connections to a --proxy entry point turned away because --proxy-credentials-file is set and they did not authenticate, by proxy (socks5, http_connect) and reason (missing: no username/password offered, wrong: a pair not in the file).",
		}, []string{"proxy", "reason"}),
		Transport: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: sub, Name: "transport",
			Help: "1 for the transport new tunnels go on: quic, or tcp while QUIC does not get through (--transport auto) or with --transport tcp; 0 for the other. Tunnels stay on the one they started on.",
		}, []string{"transport"}),
	}
	m.Transport.WithLabelValues("quic")
	m.Transport.WithLabelValues("tcp")
	reg.MustRegister(m.Transport)
	reg.MustRegister(m.PathRescuesTotal, m.PathSwitchesTotal, m.PathSwitchFailuresTotal, m.SessionUp, m.ReconnectsTotal, m.DialsTotal, m.TCPDialsTotal, m.HandshakeDuration, m.StreamsTotal,
		m.ActiveStreams, m.StreamOpenDuration, m.StreamBytesTotal, m.AcceptedTotal, m.ProxyAuthFailuresTotal)
	for _, p := range l.Proxies {
		for _, r := range l.ProxyAuthReasons {
			m.ProxyAuthFailuresTotal.WithLabelValues(p, r)
		}
	}
	for _, r := range []string{"ok", "ok_0rtt", "0rtt_rejected", "error", "auth_failed", "cert_rejected"} {
		m.DialsTotal.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "error", "cert_rejected"} {
		m.TCPDialsTotal.WithLabelValues(r)
	}
	for _, c := range l.Codes {
		m.StreamsTotal.WithLabelValues(c)
	}
	if l.NoSession != "" {
		m.StreamsTotal.WithLabelValues(l.NoSession)
	}
	for _, r := range []string{"switched", "recovered", "error"} {
		m.PathRescuesTotal.WithLabelValues(r)
	}
	for _, d := range []string{DirectionUpstream, DirectionDownstream} {
		m.StreamBytesTotal.WithLabelValues(d)
	}
	for _, r := range SwitchReasons {
		m.PathSwitchesTotal.WithLabelValues(r)
		if r != SwitchBlackout {
			m.PathSwitchFailuresTotal.WithLabelValues(r)
		}
	}
	m.UDP = newUDP(reg, sub, l, false)
	m.Streams = newTunnels(m.ActiveStreams, m.StreamsTotal, m.StreamBytesTotal)
	return m
}

// Label values (reason) of path_switches_total and path_switch_failures_total.
const (
	SwitchRouteChanged   = "route_changed"
	SwitchAddressRemoved = "address_removed"
	SwitchBlackout       = "blackout"
)

// SwitchReasons lists the reasons of path_switches_total.
var SwitchReasons = []string{SwitchRouteChanged, SwitchAddressRemoved, SwitchBlackout}
