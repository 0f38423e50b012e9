package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go/qlog"
	"github.com/quic-go/quic-go/qlogwriter"
)

// DropNotQUIC labels datagrams that are not QUIC at all (first two bits 0),
// read from quic.Transport.ReadNonQUICPacket.
const DropNotQUIC = "not_quic"

// DropRecorder is a quic.Transport tracer that counts the transport's
// packet_dropped events by trigger and ignores every other event: a garbage
// metric without the cost of writing a trace. quic-go calls it only for
// packets that belong to no connection, so it costs nothing on the data path.
type DropRecorder struct {
	drops *prometheus.CounterVec
}

var _ qlogwriter.Recorder = (*DropRecorder)(nil)

// DropRecorder returns a recorder counting into DroppedDatagramsTotal.
func (m *Server) DropRecorder() *DropRecorder { return &DropRecorder{drops: m.DroppedDatagramsTotal} }

// RecordEvent counts e if it is a dropped packet.
func (r *DropRecorder) RecordEvent(e qlogwriter.Event) {
	d, ok := e.(qlog.PacketDropped)
	if !ok {
		return
	}
	reason := string(d.Trigger)
	if reason == "" {
		reason = "unknown"
	}
	r.drops.WithLabelValues(reason).Inc()
}

// Close implements qlogwriter.Recorder.
func (r *DropRecorder) Close() error { return nil }
