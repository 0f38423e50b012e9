package congestion

import (
	"fmt"
	"strings"
	"time"

	qc "github.com/quic-go/quic-go/congestion"
)

// Algorithm names a congestion controller.
type Algorithm string

// The algorithms --congestion accepts.
const (
	BBR   Algorithm = "bbr"
	Cubic Algorithm = "cubic"
	Reno  Algorithm = "reno"
	// Fixed sends at Options.Rate (FixedController).
	Fixed Algorithm = "fixed"
)

// Default is the algorithm both daemons use unless told otherwise.
const Default = BBR

// Algorithms lists the accepted names, the default first.
var Algorithms = []Algorithm{BBR, Cubic, Reno, Fixed}

// ParseAlgorithm checks a --congestion value.
func ParseAlgorithm(s string) (Algorithm, error) {
	for _, a := range Algorithms {
		if strings.EqualFold(s, string(a)) {
			return a, nil
		}
	}
	return "", fmt.Errorf("unknown congestion controller %q: use one of bbr, cubic, reno, fixed", s)
}

// Options tune the controllers.
type Options struct {
	// LossThreshold is the highest share of a round trip's packets BBR
	// takes as random loss: a round that loses more is congestion whatever
	// the queue shows, and the bandwidth estimate is scaled up by at most
	// this rate. Below it, loss is judged against the random loss BBR
	// measures (see the package doc). Zero means DefaultLossThreshold.
	LossThreshold float64
	// Rate is the goodput the fixed controller sends at, in bytes/s.
	Rate float64
}

// DefaultLossThreshold lets BBR hold links that lose up to three packets in
// four at random (quictun's purpose: radio, satellite and long-haul links
// lose 10-50 %); congestion is told from random loss by the queue and by
// loss that rises with what is in flight, not by a rate.
const DefaultLossThreshold = 0.75

// Factory returns the quic.Config.Congestion value for a; nil for Reno, which
// selects quic-go's own NewReno unchanged.
func Factory(a Algorithm, o Options) qc.NewController {
	switch a {
	case BBR:
		return func(info qc.Info) qc.Controller { return NewBBR(info, o) }
	case Cubic:
		return func(info qc.Info) qc.Controller { return NewCubic(info) }
	case Fixed:
		return func(info qc.Info) qc.Controller { return NewFixed(info, o) }
	default:
		return nil
	}
}

// defaultDatagram is the packet size assumed when quic-go reports none
// (it always does; this only keeps a controller's arithmetic away from zero).
const defaultDatagram = 1200

// datagramSize is info's initial maximum packet size, or defaultDatagram.
func datagramSize(info qc.Info) int {
	if info.MaxDatagramSize <= 0 {
		return defaultDatagram
	}
	return info.MaxDatagramSize
}

// Stats is a controller's state for /connections and metrics.
type Stats struct {
	Algorithm Algorithm
	// State is the controller's phase: for bbr startup, drain, probe_bw,
	// probe_rtt; for cubic slow_start, congestion_avoidance, recovery.
	State                    string
	CongestionWindowBytes    int
	PacingRateBytesPerSecond float64
	BandwidthBytesPerSecond  float64 // bbr's bottleneck estimate; 0 for cubic
	MinRTT                   time.Duration
	// InflightCap is bbr's loss-driven cap on bytes in flight (0: none).
	InflightCap int
	// LossRate is the share of packets lost in the last completed round trip.
	LossRate float64
	// RandomLoss is bbr's estimate of the path's random loss rate (loss that
	// is not congestion; see the package doc).
	RandomLoss float64
	// PacketLoss is bbr's estimate of the share of all packets lost, random
	// or not, over about the last 100 (tail copies follow it).
	PacketLoss float64
	// RoundTrips counts bbr's round trips, CongestiveRoundTrips those it
	// took for congestion (their loss capped bytes in flight).
	RoundTrips, CongestiveRoundTrips int64
}

// StatsReporter is implemented by this package's controllers; Stats is safe
// for concurrent use.
type StatsReporter interface {
	Stats() Stats
}

// StatsOf returns c's state if c is one of ours.
func StatsOf(c qc.Controller) (Stats, bool) {
	if r, ok := c.(StatsReporter); ok {
		return r.Stats(), true
	}
	return Stats{}, false
}
