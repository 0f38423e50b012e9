package harness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// afterIdleLimit bounds one first connection after an idle spell.
const afterIdleLimit = 30 * time.Second

// afterIdle measures the first new connection after every variant has been
// idle for the profile's spell (quictun: past the client's idle switch,
// heartbeats off, only the keep-alive), twice per repetition: on a healthy
// link, and with the link cut for AfterIdleCut from just before the
// connection (the path died during the idle spell and comes back). All
// variants idle together and connect at the same moment, so one spell and
// one cut serve them all; only the application's connection is timed, one
// attempt as an application makes it (no retry).
func (r *Runner) afterIdle(ctx context.Context) error {
	p := r.prof
	r.setLink(ctx, p.AfterIdleLink)
	rtt := 2 * linkDelay(p.AfterIdleLink)
	for rep := range p.Reps {
		for range p.AfterIdleSamples {
			for _, cut := range []time.Duration{0, p.AfterIdleCut} {
				if ctx.Err() != nil {
					return nil
				}
				r.afterIdleOne(ctx, rep, cut, rtt)
			}
		}
	}
	return nil
}

func (r *Runner) afterIdleOne(ctx context.Context, rep int, cut, rtt time.Duration) {
	p := r.prof
	cs := fmt.Sprintf("idle %v, 1000 B", p.AfterIdleSpell)
	if cut > 0 {
		cs = fmt.Sprintf("idle %v, link cut %v from 0.5 s before the connect, 1000 B", p.AfterIdleSpell, cut)
	}
	vars := r.ordered(rep)
	samples := make([]Sample, len(vars))
	rec0 := make([]float64, len(vars))
	for i, v := range vars {
		samples[i] = Sample{Scenario: ScAfterIdle, Link: p.AfterIdleLink.Name, Case: cs, Variant: v.Name(), Rep: rep,
			Started: time.Now().UTC(), Metrics: map[string]float64{}}
		// Healthy before (the previous sample's cut may still be healing).
		if err := waitEcho(ctx, r.env.ClientNS, v.Echo(), recoveryLimit); err != nil {
			samples[i].Error = "not healthy before the idle spell: " + err.Error()
		}
		rec0[i] = v.Reconnects(ctx, &r.env)
	}
	defer func() {
		for _, s := range samples {
			r.record(s)
		}
	}()
	lead := 500 * time.Millisecond
	wait := p.AfterIdleSpell
	if cut > 0 {
		wait -= lead
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(wait):
	}
	var end time.Time
	if cut > 0 {
		start := time.Now()
		end = start.Add(cut)
		for _, l := range r.ctl.Links {
			l.Blackout(start, cut)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(lead):
		}
	}
	var wg sync.WaitGroup
	for i, v := range vars {
		if samples[i].Error != "" {
			continue
		}
		wg.Go(func() {
			s := &samples[i]
			t0 := time.Now()
			err := echoWithin(ctx, r.env.ClientNS, v.Echo(), 1000, afterIdleLimit)
			done := time.Now()
			if err != nil {
				s.Error = "first connection after the idle spell: " + err.Error()
				return
			}
			s.Metrics["first_byte_ms"] = float64(done.Sub(t0).Microseconds()) / 1000
			if rtt > 0 {
				s.Metrics["first_byte_rtts"] = float64(done.Sub(t0)) / float64(rtt)
			}
			if cut > 0 {
				s.Metrics["after_cut_ms"] = float64(done.Sub(end).Microseconds()) / 1000
			}
		})
	}
	wg.Wait()
	for i, v := range vars {
		if rec0[i] < 0 || samples[i].Error != "" {
			continue
		}
		if rec1 := v.Reconnects(ctx, &r.env); rec1 >= 0 {
			samples[i].Metrics["reconnects"] = rec1 - rec0[i]
		}
	}
}

// echoWithin connects to addr in ns and echoes size bytes once, all within
// limit: one attempt, as an application makes it.
func echoWithin(ctx context.Context, ns, addr string, size int, limit time.Duration) error {
	actx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	c, err := dialIn(actx, ns, addr)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	defer context.AfterFunc(actx, func() { _ = c.Close() })()
	dl, _ := actx.Deadline()
	_ = c.SetDeadline(dl)
	if err := roundTrip(c, make([]byte, size)); err != nil {
		return errors.Join(err, actx.Err())
	}
	return nil
}
