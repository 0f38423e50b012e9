package main

import (
	"math"
	"slices"
	"time"
)

// Summary describes a set of measured durations. All figures are computed
// from the samples handed to Summarize; nothing is estimated or assumed.
type Summary struct {
	Count int           `json:"count"`
	Min   time.Duration `json:"-"`
	Mean  time.Duration `json:"-"`
	P50   time.Duration `json:"-"`
	P90   time.Duration `json:"-"`
	P99   time.Duration `json:"-"`
	Max   time.Duration `json:"-"`
}

// Summarize returns the summary of samples. It sorts a copy, so samples is
// left untouched. An empty input gives a zero Summary.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	var sum float64
	for _, d := range sorted {
		sum += float64(d)
	}
	return Summary{
		Count: len(sorted),
		Min:   sorted[0],
		Mean:  time.Duration(math.Round(sum / float64(len(sorted)))),
		P50:   Percentile(sorted, 50),
		P90:   Percentile(sorted, 90),
		P99:   Percentile(sorted, 99),
		Max:   sorted[len(sorted)-1],
	}
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted, which
// must be in ascending order, using the nearest-rank method: the smallest
// sample such that at least p percent of the samples are less than or equal
// to it. The result is always one of the measured samples. It returns 0 for
// an empty slice; p <= 0 gives the minimum and p >= 100 the maximum.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	// A small epsilon keeps exact ranks such as 90% of 10 at rank 9, not 10,
	// despite floating-point error in p/100*n.
	rank := int(math.Ceil(p/100*float64(n) - 1e-9))
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

// ms converts d to fractional milliseconds, the unit every report uses.
func ms(d time.Duration) float64 {
	return float64(d) / float64(time.Millisecond)
}

// mbitPerSecond returns the rate of n bytes over d in megabits (10^6 bits)
// per second, or 0 when d is not positive.
func mbitPerSecond(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) * 8 / d.Seconds() / 1e6
}

// perSecond returns n events over d as a rate per second, or 0 when d is not
// positive.
func perSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
