package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/udpflow"
)

// The server's metrics count its egress events, and those of the half that
// carries reverse forwards' connections (pkg/ingress) the ingress events.
var (
	_ egress.Events  = (*metrics.Server)(nil)
	_ ingress.Events = (*metrics.Client)(nil)
)

// NewMetrics creates and registers the server's metrics on reg, their
// series starting at 0 for every label value the domain packages define.
func NewMetrics(reg prometheus.Registerer) *metrics.Server {
	return metrics.NewServer(reg, MetricLabels())
}

// MetricLabels are the label values of the server's metrics: the protocol's
// codes, the allow list's networks and refusal reasons, the UDP relay's drop
// reasons and paths.
func MetricLabels() metrics.Labels {
	return metrics.Labels{
		Codes:               proto.CodeNames(),
		Networks:            []string{endpoint.NetworkTCP, endpoint.NetworkUDP, endpoint.NetworkUnix},
		RefusalReasons:      endpoint.RefusalReasons(),
		UDPDropReasons:      udpflow.DropReasons(),
		UDPDropReceiveQueue: udpflow.DropReceiveQueue,
		UDPPathDatagram:     udpflow.PathDatagram,
		UDPPathStream:       udpflow.PathStream,
		// pkg/egress's, and the reverse half's pkg/ingress's.
		AuthFailureReasons:      egress.AuthFailureReasons(),
		ReplayUnrecordedReasons: egress.ReplayUnrecordedReasons(),
		Proxies:                 ingress.Proxies(),
		ProxyAuthReasons:        ingress.ProxyAuthReasons(),
		NoSession:               ingress.ResultNoSession,
		TicketIssuers:           transport.TicketIssuers,
	}
}

// NewReverseMetrics creates and registers the metrics of the half that
// carries reverse forwards' connections toward their clients (pkg/ingress,
// Config.Reverse): the client's metrics, named quictun_server_reverse_*.
func NewReverseMetrics(reg prometheus.Registerer) *metrics.Client {
	l := MetricLabels()
	l.Networks, l.RefusalReasons = nil, nil
	return metrics.NewReverseClient(reg, l)
}

// The metrics of resumable tunnels count pkg/resume's events.
var _ resume.Events = (*metrics.Resume)(nil)

// NewResumeMetrics creates and registers the metrics of resumable tunnels
// (--resume-window) on reg, their series starting at 0; held reads the
// bytes their buffers hold (resume.Budget.Used).
func NewResumeMetrics(reg prometheus.Registerer, held func() int64) *metrics.Resume {
	return metrics.NewResume(reg, "server", resume.GaveUpReasons(), resume.RefusedReasons(), func() float64 { return float64(held()) })
}
