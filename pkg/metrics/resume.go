package metrics

import "github.com/prometheus/client_golang/prometheus"

// Resume counts a daemon's resumable tunnels (--resume-window): it
// implements resume.Events. Its series start at 0 for the reasons given.
type Resume struct {
	Parked, Resumed, Resent prometheus.Counter
	// ResumedEarly counts the resumed tunnels whose request went as 0-RTT
	// data; ResumedNoWait those whose client sent on without waiting for
	// the reply.
	ResumedEarly, ResumedNoWait prometheus.Counter
	GaveUp                      *prometheus.CounterVec
	// Refused is nil on the client (the server refuses).
	Refused *prometheus.CounterVec
}

// NewResume registers quictun_<daemon>_tunnels_{parked,resumed,resumed_0rtt,resumed_nowait}_total,
// _tunnels_resume_resent_bytes_total, _tunnels_resume_gaveup_total{reason}
// (gaveUpReasons), _resume_buffer_bytes (held, read at scrape time) and,
// with refusedReasons, _resume_requests_refused_total{reason}.
func NewResume(reg prometheus.Registerer, daemon string, gaveUpReasons, refusedReasons []string, held func() float64) *Resume {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: Namespace, Subsystem: daemon, Name: name, Help: help}
	}
	m := &Resume{
		Parked:  prometheus.NewCounter(opts("tunnels_parked_total", "Resumable tunnels whose connection was lost: each waits --resume-window for the client to re-attach it.")),
		Resumed: prometheus.NewCounter(opts("tunnels_resumed_total", "Resumable tunnels continued on a new stream after their connection was lost.")),
		ResumedEarly: prometheus.NewCounter(opts("tunnels_resumed_0rtt_total",
			"Of the resumed tunnels, those whose resume request went as 0-RTT data on a resumed connection: re-attached without waiting a round trip for the handshake.")),
		ResumedNoWait: prometheus.NewCounter(opts("tunnels_resumed_nowait_total",
			"Of the resumed tunnels, those whose client sent on without waiting a round trip for the server's reply to its resume request: the server had confirmed every byte sent before the loss (counted by the client; 0 on the server).")),
		Resent: prometheus.NewCounter(opts("tunnels_resume_resent_bytes_total", "Bytes resent when tunnels resumed: sent before the loss but not received by the other end, or read from the application while parked.")),
		GaveUp: prometheus.NewCounterVec(opts("tunnels_resume_gaveup_total",
			"Parked tunnels that ended without resuming (their application connection reset), by reason: window (not re-attached within --resume-window), refused (the server held no such tunnel), offset (an end reported an offset the other could not resend from), shutdown."), []string{"reason"}),
	}
	for _, r := range gaveUpReasons {
		m.GaveUp.WithLabelValues(r)
	}
	reg.MustRegister(m.Parked, m.Resumed, m.ResumedEarly, m.ResumedNoWait, m.Resent, m.GaveUp, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: daemon, Name: "resume_buffer_bytes",
		Help: "Bytes the resumable tunnels hold for resending until the other end confirms them (at most --resume-buffer-mib in all).",
	}, held))
	if refusedReasons != nil {
		m.Refused = prometheus.NewCounterVec(opts("resume_requests_refused_total",
			"Resume requests refused (code resume_refused), by reason: unknown (no tunnel of that ID held), identity (opened by another identity), bad_request, disabled (--resume-window 0)."), []string{"reason"})
		for _, r := range refusedReasons {
			m.Refused.WithLabelValues(r)
		}
		reg.MustRegister(m.Refused)
	}
	return m
}

// TunnelParked counts a parked tunnel.
func (m *Resume) TunnelParked() { m.Parked.Inc() }

// TunnelResumed counts a resumed tunnel and the bytes it resent.
func (m *Resume) TunnelResumed(resent int64, early, noWait bool) {
	m.Resumed.Inc()
	if early {
		m.ResumedEarly.Inc()
	}
	if noWait {
		m.ResumedNoWait.Inc()
	}
	m.Resent.Add(float64(resent))
}

// TunnelGaveUp counts a parked tunnel that ended, by reason.
func (m *Resume) TunnelGaveUp(reason string) { m.GaveUp.WithLabelValues(reason).Inc() }

// ResumeRefused counts a refused resume request, by reason (server).
func (m *Resume) ResumeRefused(reason string) {
	if m.Refused != nil {
		m.Refused.WithLabelValues(reason).Inc()
	}
}
