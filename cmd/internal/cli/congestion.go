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
	fs.StringVar(&c.Congestion, "congestion", c.Congestion, "congestion controller of this side's sending direction: bbr (paces at the measured bottleneck rate; loss without a queue that does not rise with what is in flight is taken as the path's random loss, not as congestion, so lossy links stay fast), cubic (RFC 9438, backs off on every loss like TCP), reno (quic-go's own NewReno, the behaviour before bbr)")
	fs.Float64Var(&c.LossThreshold, "bbr-loss-threshold", c.LossThreshold, "highest share of a round trip's packets bbr takes as random loss (a round that loses more is congestion whatever the queue shows); below it bbr tells random loss from congestion by the queue and by loss that rises with what is in flight (0 < x < 1)")
	fs.DurationVar(&c.MaxProbeTimeout, "max-probe-timeout", c.MaxProbeTimeout, "cap on QUIC's backed-off probe timeout (quic-go's own cap is 60s): after a blackout with data in flight the tunnel notices the returned link within this long; costs one probe packet per interval while the link is dark")
}

// Validate returns the problems with the flags.
func (c *CongestionFlags) Validate() []error {
	var errs []error
	if _, err := congestion.ParseAlgorithm(c.Congestion); err != nil {
		errs = append(errs, fmt.Errorf("--congestion: %w", err))
	}
	if !(c.LossThreshold > 0 && c.LossThreshold < 1) {
		errs = append(errs, fmt.Errorf("--bbr-loss-threshold %v: must be between 0 and 1, e.g. 0.75", c.LossThreshold))
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
