package harness

import "time"

// How fast a flow yields to a competing one that starts while it runs
// alone (the fairness scenario with Profile.FairDelay; issue 31's target
// for --congestion fixed: "beside a Cubic flow whose queue it fills, its
// rate falls within 1 s").
//
// The rate before is the flow's goodput over the yieldSettle before the
// competing flow's first request. The flow counts as settled when each
// yieldWindow bin of that span is within yieldSettleTol of that rate;
// otherwise (still in start-up, or swinging) there is no yield figure,
// only yield_settled = 0. The flow's rate over a sliding yieldWindow,
// moved in yieldStep steps from the competing start, has fallen once it is
// below yieldFraction of the rate before:
//
//   - yield_first_s: the end of the first such window, in seconds after
//     the competing start (the window reaches back yieldWindow, so this
//     includes up to that much of the flow's time before the fall);
//   - yield_s: the same for the first window from which every window
//     ending within the following yieldHold is below too (the fall
//     lasts, not a dip);
//
// each yieldNever (-1, not 0) when it did not happen before both flows'
// end (for yield_s: before yieldHold ahead of it), with yielded = 0.
const (
	yieldWindow    = 250 * time.Millisecond
	yieldStep      = 50 * time.Millisecond
	yieldFraction  = 0.5
	yieldHold      = 500 * time.Millisecond
	yieldSettle    = time.Second
	yieldSettleTol = 0.4
	// yieldAfterFrom: the rate after is the flow's goodput from this
	// long after the competing start to both flows' end (at least
	// yieldAfterMin of it, else not reported).
	yieldAfterFrom = time.Second
	yieldAfterMin  = 500 * time.Millisecond
	yieldNever     = -1.0
)

// yieldMetrics computes the yield metrics (see above) from the arrivals
// pts of the flow that ran first, the competing flow's start and the end
// of their common time.
func yieldMetrics(pts []flowPoint, start, end time.Time) map[string]float64 {
	if len(pts) == 0 || !end.After(start) {
		return map[string]float64{"yield_settled": 0}
	}
	from := start.Add(-yieldSettle)
	before := rateBetween(pts, from, start)
	m := map[string]float64{"yield_settled": 0, "yield_before_mbit_per_s": before}
	if !yieldSettled(pts, from, start, before) {
		return m
	}
	m["yield_settled"] = 1
	below := func(t time.Time) bool {
		return rateBetween(pts, t.Add(-yieldWindow), t) < yieldFraction*before
	}
	first, lasting := yieldNever, yieldNever
	for t := start.Add(yieldStep); !t.After(end); t = t.Add(yieldStep) {
		if !below(t) {
			continue
		}
		if first == yieldNever {
			first = t.Sub(start).Seconds()
		}
		if t.Add(yieldHold).After(end) {
			break // the fall cannot be confirmed any more
		}
		if holdsBelow(t, below) {
			lasting = t.Sub(start).Seconds()
			break
		}
	}
	m["yield_first_s"], m["yield_s"] = first, lasting
	m["yielded"] = 0
	if lasting != yieldNever {
		m["yielded"] = 1
	}
	if a := start.Add(yieldAfterFrom); end.Sub(a) >= yieldAfterMin {
		m["yield_after_mbit_per_s"] = rateBetween(pts, a, end)
	}
	return m
}

// yieldSettled tells whether the flow's rate in every yieldWindow bin of
// [from, to) was within yieldSettleTol of before, and the flow had
// started by from.
func yieldSettled(pts []flowPoint, from, to time.Time, before float64) bool {
	if before <= 0 || pts[0].T.After(from) {
		return false
	}
	for _, b := range rateBins(pts, from, to.Sub(from), yieldWindow) {
		if b < before*(1-yieldSettleTol) || b > before*(1+yieldSettleTol) {
			return false
		}
	}
	return true
}

// holdsBelow tells whether below holds for every window ending within
// yieldHold after t.
func holdsBelow(t time.Time, below func(time.Time) bool) bool {
	for u := t.Add(yieldStep); !u.After(t.Add(yieldHold)); u = u.Add(yieldStep) {
		if !below(u) {
			return false
		}
	}
	return true
}
