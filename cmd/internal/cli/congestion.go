package cli

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/quictun/quictun/pkg/congestion"
	"github.com/quictun/quictun/pkg/transport"
)

// CongestionFlags are the congestion-control settings both daemons share.
type CongestionFlags struct {
	Congestion      string
	LossThreshold   float64
	MaxProbeTimeout time.Duration
}

// CongestionFlagNames lists the flags AddFlags binds, for a help group.
var CongestionFlagNames = []string{"congestion", "bbr-loss-threshold", "max-probe-timeout"}

// NewCongestionFlags returns the defaults.
func NewCongestionFlags() CongestionFlags {
	q := transport.DefaultQUICOptions()
	return CongestionFlags{
		Congestion:      string(q.Congestion),
		LossThreshold:   congestion.DefaultLossThreshold,
		MaxProbeTimeout: q.MaxProbeTimeout,
	}
}

// AddFlags binds the flags to fs.
func (c *CongestionFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Congestion, "congestion", c.Congestion, "congestion controller of this side's sending direction: bbr (paces at the measured bottleneck rate; random loss below --bbr-loss-threshold per round trip is not taken as congestion, so lossy links stay fast), cubic (RFC 9438, backs off on every loss like TCP), reno (quic-go's own NewReno, the behaviour before bbr)")
	fs.Float64Var(&c.LossThreshold, "bbr-loss-threshold", c.LossThreshold, "share of a round trip's packets bbr may lose before it lowers its in-flight cap; higher keeps links with heavy random loss fast but is less fair to TCP when a queue overflows (0 < x < 1)")
	fs.DurationVar(&c.MaxProbeTimeout, "max-probe-timeout", c.MaxProbeTimeout, "cap on QUIC's backed-off probe timeout (quic-go's own cap is 60s): after a blackout with data in flight the tunnel notices the returned link within this long; costs one probe packet per interval while the link is dark")
}

// Validate returns the problems with the flags.
func (c *CongestionFlags) Validate() []error {
	var errs []error
	if _, err := congestion.ParseAlgorithm(c.Congestion); err != nil {
		errs = append(errs, fmt.Errorf("--congestion: %w", err))
	}
	if !(c.LossThreshold > 0 && c.LossThreshold < 1) {
		errs = append(errs, fmt.Errorf("--bbr-loss-threshold %v: must be between 0 and 1, e.g. 0.15", c.LossThreshold))
	}
	if c.MaxProbeTimeout < 100*time.Millisecond || c.MaxProbeTimeout > time.Minute {
		errs = append(errs, fmt.Errorf("--max-probe-timeout %s: must be between 100ms and 1m, e.g. 500ms", c.MaxProbeTimeout))
	}
	return errs
}

// Apply copies the (validated) flags into q.
func (c *CongestionFlags) Apply(q *transport.QUICOptions) {
	q.Congestion, _ = congestion.ParseAlgorithm(c.Congestion)
	q.LossThreshold = c.LossThreshold
	q.MaxProbeTimeout = c.MaxProbeTimeout
}
