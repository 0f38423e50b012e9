package client

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/udpflow"
)

// NewMetrics creates and registers the client's metrics on reg, their
// series starting at 0 for every label value the domain packages define.
func NewMetrics(reg prometheus.Registerer) *metrics.Client {
	return metrics.NewClient(reg, MetricLabels())
}

// MetricLabels are the label values of the client's metrics: the protocol's
// codes, the UDP relay's drop reasons and paths.
func MetricLabels() metrics.Labels {
	return metrics.Labels{
		Codes:               proto.CodeNames(),
		UDPDropReasons:      udpflow.DropReasons(),
		UDPDropReceiveQueue: udpflow.DropReceiveQueue,
		UDPPathDatagram:     udpflow.PathDatagram,
		UDPPathStream:       udpflow.PathStream,
	}
}

// NewReverseMetrics creates and registers the metrics of the half that
// serves the streams the server opens for remote forwards (pkg/egress,
// Config.Reverse): the server's metrics, named quictun_client_reverse_*.
func NewReverseMetrics(reg prometheus.Registerer) *metrics.Server {
	l := MetricLabels()
	l.Networks = []string{endpoint.NetworkTCP, endpoint.NetworkUDP, endpoint.NetworkUnix}
	l.RefusalReasons = endpoint.RefusalReasons()
	return metrics.NewReverseServer(reg, l)
}
