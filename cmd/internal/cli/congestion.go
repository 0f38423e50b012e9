package cli

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/quictun/quictun/pkg/congestion"
	"github.com/quictun/quictun/pkg/ratecap"
	"github.com/quictun/quictun/pkg/transport"
)

// CongestionFlags are the congestion-control settings both daemons share.
type CongestionFlags struct {
	Congestion      string
	LossThreshold   float64
	MaxProbeTimeout time.Duration
	// Rate is --congestion fixed's goodput (e.g. 50Mbit).
	Rate string
}

// CongestionFlagNames lists the flags AddFlags binds, for a help group.
var CongestionFlagNames = []string{"congestion", "rate", "bbr-loss-threshold", "max-probe-timeout"}

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
	fs.StringVar(&c.Congestion, "congestion", c.Congestion, "congestion controller of this side's sending direction: bbr (paces at the measured bottleneck rate; loss without a queue that does not rise with what is in flight is taken as the path's random loss, not as congestion, so lossy links stay fast), cubic (RFC 9438, backs off on every loss like TCP), reno (quic-go's own NewReno, the behaviour before bbr), fixed (sends at --rate whatever the loss, for a link whose rate you know; backs off while a queue stands, so it cannot flatten other traffic)")
	fs.StringVar(&c.Rate, "rate", c.Rate, "goodput --congestion fixed sends at, e.g. 50Mbit (bit, kbit, Mbit, Gbit per second, or B, kB, MB, GB, KiB, MiB, GiB); what random loss takes is sent again on top, at most 4x")
	fs.Float64Var(&c.LossThreshold, "bbr-loss-threshold", c.LossThreshold, "highest share of a round trip's packets bbr takes as random loss (a round that loses more is congestion whatever the queue shows); below it bbr tells random loss from congestion by the queue and by loss that rises with what is in flight (0 < x < 1)")
	fs.DurationVar(&c.MaxProbeTimeout, "max-probe-timeout", c.MaxProbeTimeout, "cap on QUIC's backed-off probe timeout (quic-go's own cap is 60s): after a blackout with data in flight the tunnel notices the returned link within this long; costs one probe packet per interval while the link is dark")
}

// Validate returns the problems with the flags.
func (c *CongestionFlags) Validate() []error {
	var errs []error
	if _, err := congestion.ParseAlgorithm(c.Congestion); err != nil {
		errs = append(errs, fmt.Errorf("--congestion: %w", err))
	}
	alg, _ := congestion.ParseAlgorithm(c.Congestion)
	switch rate, err := ratecap.ParseBytesPerSecond(c.Rate); {
	case alg == congestion.Fixed && c.Rate == "":
		errs = append(errs, errors.New("--congestion fixed needs --rate, the link's rate you want to use, e.g. --rate 50Mbit"))
	case alg == congestion.Fixed && (err != nil || rate == 0):
		errs = append(errs, fmt.Errorf("--rate %q: %w", c.Rate, cmp.Or(err, errors.New("must be above 0, e.g. 50Mbit"))))
	case alg != congestion.Fixed && c.Rate != "":
		errs = append(errs, fmt.Errorf("--rate %s: only --congestion fixed sends at a set rate; add --congestion fixed or remove --rate", c.Rate))
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
	q.Rate, _ = ratecap.ParseBytesPerSecond(c.Rate)
}
