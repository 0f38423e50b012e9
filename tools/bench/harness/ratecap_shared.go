package harness

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// The shared part of the rate-cap scenario (issue 35): one server, several
// identities at once, each its own client and --keys-file key; some capped
// (--rate-limit key=NAME=DOWN/UP), one not. Every identity runs the same
// number of parallel transfers at the same time, downloads then uploads:
// each capped identity must hold its own cap while the others load the
// link, and the uncapped one must get what the caps leave of the link.

// SharedIdentity is one identity of the shared run: its key's name and its
// caps in Mbit/s (0: uncapped).
type SharedIdentity struct {
	Name             string
	DownMbit, UpMbit float64
}

// sharedIdentities are the profiles' identities: 20 and 40 Mbit/s each way
// and one uncapped, on the 100 Mbit/s link.
func sharedIdentities() []SharedIdentity {
	return []SharedIdentity{{"capped20", 20, 20}, {"capped40", 40, 40}, {"uncapped", 0, 0}}
}

// rateCapSharedInstance is the shared run's quictun instance number.
const rateCapSharedInstance = rateCapInstance + 20

// rateCapSharedVariant is the instance of the shared run: one server with a
// key (and a cap, where set) per identity, the profile's server
// controller, the client's default one, and the link's rate if set (before
// the run's own server arguments, which may override it).
func (r *Runner) rateCapSharedVariant() *quictun {
	p := r.prof.RateCap
	var args []string
	if p.SharedLinkRate != "" {
		args = append(args, "--link-rate", p.SharedLinkRate)
	}
	args = append(append(args, r.opts.ServerArgs...), "--congestion", p.ServerCC)
	q := &quictun{ServerArgs: args, ClientArgs: slices.Clone(r.opts.ClientArgs),
		Instance: rateCapSharedInstance, Label: "quictun-shared"}
	for _, id := range p.Shared {
		k := KeyClient{Name: id.Name}
		if id.DownMbit > 0 || id.UpMbit > 0 {
			k.RateLimit = fmt.Sprintf("%gMbit/%gMbit", id.DownMbit, id.UpMbit)
		}
		q.Keys = append(q.Keys, k)
	}
	return q
}

// rateCapShared runs one repetition of the shared run.
func (r *Runner) rateCapShared(ctx context.Context, rep int) {
	p := r.prof.RateCap
	q := r.rateCapSharedVariant()
	defer q.Stop()
	if err := q.Start(ctx, &r.env); err != nil {
		r.record(Sample{Scenario: ScRateCap, Link: p.Link.Name, Case: rateCapSharedCase(p, rateCapDown, p.Shared[0]), Variant: q.Name(), Rep: rep,
			Started: time.Now().UTC(), Error: "start: " + err.Error()})
		return
	}
	for _, dir := range []string{rateCapDown, rateCapUp} {
		for _, s := range r.rateCapSharedOne(ctx, q, dir, rep) {
			r.record(s)
		}
	}
}

// rateCapSharedCase names an identity's case in the shared run.
func rateCapSharedCase(p RateCapSpec, dir string, id SharedIdentity) string {
	var caps []string
	for _, o := range p.Shared {
		c := sharedCap(o, dir)
		if c > 0 {
			caps = append(caps, fmt.Sprintf("%g", c))
		} else {
			caps = append(caps, "none")
		}
	}
	mine := "uncapped"
	if c := sharedCap(id, dir); c > 0 {
		mine = fmt.Sprintf("cap %g Mbit/s", c)
	}
	return fmt.Sprintf("%s, %d identities at once (caps %s), %d streams each: key=%s, %s", dir, len(p.Shared), strings.Join(caps, "/"), p.Parallel, id.Name, mine)
}

// sharedCap is id's cap in direction dir, in Mbit/s (0: none).
func sharedCap(id SharedIdentity, dir string) float64 {
	if dir == rateCapUp {
		return id.UpMbit
	}
	return id.DownMbit
}

// sharedRest is what the caps in direction dir leave of a link of rate
// Mbit/s (0 when the link's rate is unknown).
func sharedRest(ids []SharedIdentity, dir string, rate float64) float64 {
	if rate <= 0 {
		return 0
	}
	for _, id := range ids {
		rate -= sharedCap(id, dir)
	}
	return max(rate, 0)
}

// rateCapSharedOne runs Parallel transfers per identity in direction dir,
// all at once for SharedDuration, and returns a sample per identity: its
// rate by the server's count from SharedWarmup to the end, against its cap
// or (uncapped) against what the caps leave of the link.
func (r *Runner) rateCapSharedOne(ctx context.Context, q *quictun, dir string, rep int) []Sample {
	p := r.prof.RateCap
	n := len(p.Shared)
	admins := make([]string, n)
	before, after := make([]identityUsage, n), make([]identityUsage, n)
	readErrs := make([]error, n)
	trs := make([]rateCapTransfer, n)
	cp, sp := q.AllPIDs()
	u0 := r.usage(cp, sp)
	var wg sync.WaitGroup
	start := time.Now()
	for i, id := range p.Shared {
		admins[i] = "http://" + q.local(qtServerAdminPort) + "/identities/key=" + id.Name
		wg.Go(func() { trs[i] = r.rateCapTransfers(ctx, q.KeySink(id.Name), dir, p.Parallel, p.SharedDuration) })
		wg.Go(func() {
			before[i], after[i], readErrs[i] = identityWindow(ctx, r.env.ServerNS, admins[i], start.Add(p.SharedWarmup), start.Add(p.SharedDuration))
		})
	}
	wg.Wait()
	u1 := r.usage(cp, sp)
	readerCPU := 0.0
	for _, tr := range trs {
		readerCPU += tr.cpu
	}
	// The CPU and emulator columns are the whole run's (all clients'), the
	// same in each identity's sample.
	usage := usageMetrics(u0, u1, readerCPU, true)
	rest := sharedRest(p.Shared, dir, linkRateMbit(p.Link))
	out := make([]Sample, 0, n)
	for i, id := range p.Shared {
		s := Sample{Scenario: ScRateCap, Link: p.Link.Name, Case: rateCapSharedCase(p, dir, id), Variant: q.Name(), Rep: rep, Started: start.UTC(),
			Metrics: map[string]float64{"client_mbit_per_s": trs[i].mbit}}
		maps.Copy(s.Metrics, usage)
		if readErrs[i] == nil {
			maps.Copy(s.Metrics, rateCapMetrics(dir, before[i], after[i], sharedCap(id, dir)))
			if sharedCap(id, dir) == 0 && rest > 0 {
				s.Metrics["rest_pct"] = s.Metrics["mbit_per_s"] / rest * 100
			}
		}
		out = append(out, s)
	}
	// The next sample must not share the caps with this one's tunnels.
	for i := range out {
		errs := append([]error{readErrs[i]}, trs[i].errs...)
		errs = append(errs, waitIdentityIdle(ctx, r.env.ServerNS, admins[i], rateCapDrainLimit))
		out[i].Error = errString(errors.Join(errs...))
	}
	return out
}
