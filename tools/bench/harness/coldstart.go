package harness

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// clientRestarter is a tunnel whose client side can be restarted, as an
// operator or a reboot would: the cold-start scenario measures the first
// connection after it.
type clientRestarter interface {
	RestartClient(ctx context.Context, env *Env) error
}

// coldLimit bounds how long a cold start may take before it is an error.
const coldLimit = 20 * time.Second

// coldstart restarts each tunnel's client and times the first echo of an
// application that connects at once (direct: a new TCP connection).
func (r *Runner) coldstart(ctx context.Context) error {
	p := r.prof
	r.setLink(ctx, p.ColdLink)
	rtt := 2 * linkDelay(p.ColdLink)
	for rep := range p.Reps {
		for _, v := range r.ordered(rep) {
			for range p.ColdSamples {
				if ctx.Err() != nil {
					return nil
				}
				r.coldOne(ctx, v, rep, rtt)
			}
		}
	}
	return nil
}

func (r *Runner) coldOne(ctx context.Context, v Variant, rep int, rtt time.Duration) {
	s := Sample{Scenario: ScCold, Link: r.prof.ColdLink.Name, Case: "client restarted, 1000 B", Variant: v.Name(), Rep: rep,
		Started: time.Now().UTC(), Metrics: map[string]float64{}}
	defer func() { r.record(s) }()
	// Healthy before: the previous sample's client must be up.
	if err := waitEcho(ctx, r.env.ClientNS, v.Echo(), coldLimit); err != nil {
		s.Error = "not healthy before the restart: " + err.Error()
		return
	}
	started := time.Now()
	if rs, ok := v.(clientRestarter); ok {
		if err := rs.RestartClient(ctx, &r.env); err != nil {
			s.Error = "restart: " + err.Error()
			return
		}
		started = time.Now()
	}
	var err error
	s.Metrics, err = firstEcho(ctx, r.env.ClientNS, v.Echo(), started, rtt, false)
	s.Error = errString(err)
}

// firstEcho connects to addr in ns, retrying until its listener is up
// (within coldLimit), and echoes 1000 B once: first_byte_ms from the start
// of the successful connect to the echo (and in RTTs, when rtt > 0), and
// since_start_ms from started. A connection that is accepted and then fails
// is an error (the tunnel accepted before it could carry it), unless retry
// is set: then a new connection is tried, and failed_attempts counts
// those.
func firstEcho(ctx context.Context, ns, addr string, started time.Time, rtt time.Duration, retry bool) (map[string]float64, error) {
	m := map[string]float64{}
	buf := make([]byte, 1000)
	limit := time.Now().Add(coldLimit)
	failed := 0
	for {
		t0 := time.Now()
		c, err := dialIn(ctx, ns, addr)
		if err != nil {
			err = fmt.Errorf("connect: %w", err)
		} else {
			_ = c.SetDeadline(time.Now().Add(coldLimit))
			err = roundTrip(c, buf)
			_ = c.Close()
			if err != nil {
				err = fmt.Errorf("first echo: %w", err)
				if !retry {
					return m, err
				}
				failed++
			}
		}
		if err == nil {
			fb := time.Since(t0)
			m["first_byte_ms"] = float64(fb) / 1e6
			if rtt > 0 {
				m["first_byte_rtts"] = float64(fb) / float64(rtt)
			}
			m["since_start_ms"] = float64(time.Since(started)) / 1e6
			if retry {
				m["failed_attempts"] = float64(failed)
			}
			return m, nil
		}
		if time.Now().After(limit) || ctx.Err() != nil {
			return m, err
		}
		time.Sleep(2 * time.Millisecond) // the listener is not up yet
	}
}

// linkDelay is the one-way delay of a link spec (0 if unknown).
func linkDelay(l LinkSpec) time.Duration {
	d, err := time.ParseDuration(strings.TrimSpace(l.Params["delay"]))
	if err != nil {
		return 0
	}
	return d
}
