package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"strconv"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// The loss scenario (issue 31): a bulk download through each variant on a
// link with heavy random loss both ways, LossRuns successive downloads of
// LossDuration on one tunnel connection (the minimum is the figure: a
// controller that swings between 88 and 9 Mbit/s from one run to the next
// is judged by its 9), each repetition on freshly started daemons.

// lossMinCase is the case of the per-repetition minimum of the runs.
const lossMinCase = "min of runs"

// lossBinWidth is the width of a timeline bin (the chart's resolution).
const lossBinWidth = 500 * time.Millisecond

// lossDrainLimit bounds the wait, after a run's window, for the end of its
// download (the data the sender had buffered): a slow lossy path may take
// longer to drain than is worth waiting for, and the figure is the window's.
const lossDrainLimit = 3 * time.Second

// lossRunName is the case of run i (0-based).
func lossRunName(i int) string { return "run " + strconv.Itoa(i+1) }

// withQueue returns link with a rate-limiter queue of q at its rate
// (emulator parameter queue-bytes) and the queue in its name.
func withQueue(link LinkSpec, q time.Duration) LinkSpec {
	p := maps.Clone(link.Params)
	if rate := linkRateMbit(link); rate > 0 {
		p["queue-bytes"] = strconv.Itoa(int(rate * 1e6 / 8 * q.Seconds()))
	}
	return LinkSpec{Name: link.Name + " queue " + q.String(), Params: p}
}

// LossLinks is lossLinks for levels given by the user (--loss-levels),
// each a fraction in [0, 1).
func LossLinks(levels ...float64) ([]LinkSpec, error) {
	for _, l := range levels {
		if l < 0 || l >= 1 {
			return nil, fmt.Errorf("loss rate %v is not a fraction in [0, 1)", l)
		}
	}
	return lossLinks(levels...), nil
}

// lossLinks are the loss profile's links: 100 Mbit/s, 12.5 ms one-way,
// random loss both ways at each level.
func lossLinks(levels ...float64) []LinkSpec {
	out := make([]LinkSpec, 0, len(levels))
	for _, l := range levels {
		out = append(out, LinkOf("WAN", WANDelay, l, "100mbit"))
	}
	return out
}

// lossBulk runs the loss scenario: for each link, repetition and variant
// (the first rotating), the variant is restarted on the clean link (fresh
// daemons, its connection set up without loss), then the lossy link is
// applied and LossRuns downloads run one after the other.
func (r *Runner) lossBulk(ctx context.Context) error {
	p := r.prof
	clean := LinkOf("WAN", WANDelay, 0, "100mbit")
	i := 0
	for _, link := range p.LossLinks {
		for rep := range p.Reps {
			i++
			for _, v := range r.ordered(i) {
				if ctx.Err() != nil {
					return nil
				}
				r.setLink(ctx, clean)
				if err := r.restart(ctx, v); err != nil {
					r.record(Sample{Scenario: ScLoss, Link: link.Name, Case: lossMinCase, Variant: v.Name(), Rep: rep,
						Started: time.Now().UTC(), Error: "restart: " + err.Error()})
					continue
				}
				r.setLink(ctx, link)
				r.lossRuns(ctx, link, v, rep)
			}
		}
	}
	return nil
}

// restart gives v fresh daemons (direct TCP has none).
func (r *Runner) restart(ctx context.Context, v Variant) error {
	if _, ok := v.(*direct); ok {
		return nil
	}
	v.Stop()
	return v.Start(ctx, &r.env)
}

// lossRuns runs the downloads of one (link, variant, repetition) and
// records a sample per run and one with their minimum.
func (r *Runner) lossRuns(ctx context.Context, link LinkSpec, v Variant, rep int) {
	p := r.prof
	minS := Sample{Scenario: ScLoss, Link: link.Name, Case: lossMinCase, Variant: v.Name(), Rep: rep, Started: time.Now().UTC(),
		Metrics: map[string]float64{}}
	runs := make([]float64, 0, p.LossRuns)
	var errs []error
	for i := range p.LossRuns {
		if ctx.Err() != nil {
			return
		}
		s := r.lossOne(ctx, link, v, rep, i)
		r.record(s)
		if s.Error != "" {
			errs = append(errs, fmt.Errorf("%s: %s", s.Case, s.Error))
		}
		runs = append(runs, s.Metrics["mbit_per_s"]) // 0 when nothing arrived
	}
	minS.Metrics["mbit_per_s"] = minOf(runs)
	minS.Metrics["max_mbit_per_s"] = maxOf(runs)
	minS.Raw, _ = json.Marshal(map[string]any{"runs_mbit_per_s": runs})
	minS.Error = errString(errors.Join(errs...))
	r.record(minS)
}

func minOf(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	m := math.Inf(1)
	for _, v := range x {
		m = math.Min(m, v)
	}
	return m
}

func maxOf(x []float64) float64 {
	m := 0.0
	for _, v := range x {
		m = math.Max(m, v)
	}
	return m
}

// lossOne is run i: one download of LossDuration through v; its rate is
// that of the window from the request to LossDuration after it.
func (r *Runner) lossOne(ctx context.Context, link LinkSpec, v Variant, rep, i int) Sample {
	d := r.prof.LossDuration
	s := Sample{Scenario: ScLoss, Link: link.Name, Case: lossRunName(i), Variant: v.Name(), Rep: rep, Started: time.Now().UTC(),
		Metrics: map[string]float64{"mbit_per_s": 0}}
	rec0 := r.sinkReconnects(ctx, v)
	cp, sp := v.EndpointPIDs("sink")
	u0 := r.usage(cp, sp)
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	c, err := dialIn(dctx, r.env.ClientNS, v.Sink())
	cancel()
	if err != nil {
		s.Error = "connect: " + err.Error()
		return s
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { _ = c.Close() })()
	prog := &progress{}
	st := download(c, nil, d, d+lossDrainLimit, prog)
	u1 := r.usage(cp, sp)
	pts := prog.points()
	var bins []float64
	if len(pts) > 0 {
		from := pts[0].T
		s.Metrics["mbit_per_s"] = rateBetween(pts, from, from.Add(d))
		bins = rateBins(pts, from, d, lossBinWidth)
	}
	// A download still draining at the limit (the sender's buffered data on
	// a slow lossy path) is no error of the window's figure; a failure
	// before the window ended is.
	s.Metrics["drained"] = 1
	if st.Error != "" {
		s.Metrics["drained"] = 0
		if len(pts) == 0 || st.end.Sub(pts[0].T) < d {
			s.Error = st.Error
		}
	}
	maps.Copy(s.Metrics, usageMetrics(u0, u1, st.ReaderCPU, len(cp)+len(sp) > 0))
	if dead := exitedPIDs(append(cp, sp...)); len(dead) > 0 && s.Error == "" {
		// A daemon gone mid-run makes a stalled download, not a figure:
		// say so (its log under raw/ keeps its last words).
		s.Error = fmt.Sprintf("tunnel daemon(s) exited during the run: pid %v", dead)
	}
	if rec0 >= 0 {
		if rec1 := r.sinkReconnects(ctx, v); rec1 >= 0 {
			s.Metrics["reconnects"] = rec1 - rec0
		}
	}
	st.Error = oneLine(st.Error)
	s.Raw, _ = json.Marshal(lossRaw{Bins: bins, BinSeconds: lossBinWidth.Seconds(), Download: st})
	if s.Error != "" {
		klog.V(1).InfoS("Loss run failed", "link", link.Name, "variant", v.Name(), "run", i+1, "err", s.Error)
	}
	return s
}

// lossRaw is the raw record of a loss run: its timeline and download.
type lossRaw struct {
	Bins       []float64  `json:"bins_mbit_per_s"`
	BinSeconds float64    `json:"bin_s"`
	Download   BulkStream `json:"download"`
}

// rateBins is the rate in each bin of width w over [from, from+d).
func rateBins(pts []flowPoint, from time.Time, d, w time.Duration) []float64 {
	n := int(d / w)
	out := make([]float64, n)
	for k := range n {
		a := from.Add(time.Duration(k) * w)
		out[k] = rateBetween(pts, a, a.Add(w))
	}
	return out
}

// exitedPIDs returns those of pids that no longer run.
func exitedPIDs(pids []int) []int {
	var out []int
	for _, p := range pids {
		if err := syscall.Kill(p, 0); errors.Is(err, syscall.ESRCH) {
			out = append(out, p)
		}
	}
	return out
}
