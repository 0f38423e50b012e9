package transport

import (
	"net"

	"github.com/quic-go/quic-go"

	"github.com/quictun/quictun/pkg/congestion"
)

// ConnStats is one live connection's statistics (the admin API's
// /connections, the QUIC metrics), with the label it is exported under when
// per-connection series are enabled (the client's connection index).
type ConnStats struct {
	Label string
	// Transport is what carries the connection: TransportQUIC, or
	// TransportTCP (the fallback; Stats and Congestion are then empty).
	Transport string
	// RemoteAddress and LocalAddress are the connection's UDP (TCP)
	// addresses.
	RemoteAddress, LocalAddress string
	// ClientIdentity is who the client proved to be (server side: "CN=NAME",
	// "key=NAME"); empty otherwise.
	ClientIdentity string
	// ClientSubject is the subject of the client's certificate (server side,
	// mutual TLS); empty otherwise.
	ClientSubject string
	Stats         quic.ConnectionStats
	// Congestion is the state of quictun's congestion controller; nil when
	// quic-go's built-in one (reno) is in use.
	Congestion *congestion.Stats
}

// ConnStatsOf reads c's statistics and its congestion controller's state.
func ConnStatsOf(label string, c *quic.Conn) ConnStats {
	s := ConnStats{Label: label, Transport: TransportQUIC, Stats: c.ConnectionStats(), RemoteAddress: c.RemoteAddr().String(), LocalAddress: c.LocalAddr().String()}
	if cs, ok := congestion.StatsOf(c.CongestionController()); ok {
		s.Congestion = &cs
	}
	return s
}

// Transports of ConnStats.Transport.
const (
	TransportQUIC = "quic"
	TransportTCP  = "tcp"
)

// TCPConnStats describes a TCP fallback connection (pkg/tcpmux): its
// addresses only.
func TCPConnStats(label string, remote, local net.Addr) ConnStats {
	return ConnStats{Label: label, Transport: TransportTCP, RemoteAddress: remote.String(), LocalAddress: local.String()}
}
