package client

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/udpflow"
)

// The client's metrics count its ingress events, and those of the half that
// serves reverse forwards' streams (pkg/egress) the egress events.
var (
	_ ingress.Events = (*metrics.Client)(nil)
	_ egress.Events  = (*metrics.Server)(nil)
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
		// pkg/ingress's, and the reverse half's pkg/egress's.
		Proxies:                 ingress.Proxies(),
		ProxyAuthReasons:        ingress.ProxyAuthReasons(),
		NoSession:               ingress.ResultNoSession,
		AuthFailureReasons:      egress.AuthFailureReasons(),
		ReplayUnrecordedReasons: egress.ReplayUnrecordedReasons(),
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

// The metrics of resumable tunnels count pkg/resume's events.
var _ resume.Events = (*metrics.Resume)(nil)

// NewResumeMetrics creates and registers the metrics of resumable tunnels
// (--resume-window) on reg, their series starting at 0; held reads the
// bytes their buffers hold (resume.Budget.Used).
func NewResumeMetrics(reg prometheus.Registerer, held func() int64) *metrics.Resume {
	return metrics.NewResume(reg, "client", resume.GaveUpReasons(), nil, func() float64 { return float64(held()) })
}
