package harness

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot/plotter"
)

// fairTimelineCSV is the file of every fairness sample's timeline.
const fairTimelineCSV = ScFair + "-timeline.csv"

// fairSamples are the fairness samples with a timeline, with it.
func fairSamples(samples []Sample) ([]Sample, []fairRaw) {
	var ss []Sample
	var raws []fairRaw
	for _, s := range samples {
		var raw fairRaw
		if s.Scenario != ScFair || json.Unmarshal(s.Raw, &raw) != nil || raw.BinSeconds <= 0 {
			continue
		}
		ss = append(ss, s)
		raws = append(raws, raw)
	}
	return ss, raws
}

// writeFairTimelines writes every fairness sample's per-flow goodput over
// time into fairTimelineCSV and draws that of each first repetition; it
// returns the chart files and whether it wrote the CSV.
func writeFairTimelines(dir string, res *Results) ([]string, bool, error) {
	ss, raws := fairSamples(res.Samples)
	if len(ss) == 0 {
		return nil, false, nil
	}
	if err := writeFairCSV(filepath.Join(dir, fairTimelineCSV), ss, raws); err != nil {
		return nil, false, err
	}
	var out []string
	for i, s := range ss {
		if s.Rep != 0 {
			continue
		}
		raw := raws[i]
		against := strings.TrimPrefix(strings.SplitN(s.Case, ",", 2)[0], "vs ")
		series := []timelineSeries{
			{Name: s.Variant, Style: 0, Pts: binXYs(raw.FlowBins, raw.BinSeconds)},
			{Name: against, Style: 1, Pts: binXYs(raw.AgainstBins, raw.BinSeconds)},
		}
		var marks []float64
		if raw.AgainstStartS > 0 {
			marks = append(marks, raw.AgainstStartS)
		}
		name := fmt.Sprintf("%s-timeline-%s.png", ScFair, chartSlug(s.Link+" "+s.Case+" "+s.Variant))
		title := fmt.Sprintf("Goodput per %v s, %s and %s, %s (repetition 1)", raw.BinSeconds, s.Variant, against, s.Link)
		if err := saveTimelineChart(filepath.Join(dir, name), title, series, marks); err != nil {
			return out, true, err
		}
		out = append(out, name)
	}
	return out, true, nil
}

// binXYs places each bin at its middle.
func binXYs(bins []float64, w float64) plotter.XYs {
	pts := make(plotter.XYs, len(bins))
	for i, b := range bins {
		pts[i] = plotter.XY{X: (float64(i) + 0.5) * w, Y: b}
	}
	return pts
}

// writeFairCSV writes one line per sample and bin: link, case, variant,
// repetition, the bin's start in s from the variant's flow's request, and
// both flows' goodput in it.
func writeFairCSV(path string, ss []Sample, raws []fairRaw) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"link", "case", "variant", "rep", "t_start_s", "flow_mbit_per_s", "against_mbit_per_s"})
	ff := func(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }
	for i, s := range ss {
		raw := raws[i]
		for k, b := range raw.FlowBins {
			var o float64
			if k < len(raw.AgainstBins) {
				o = raw.AgainstBins[k]
			}
			_ = w.Write([]string{s.Link, s.Case, s.Variant, strconv.Itoa(s.Rep), ff(float64(k) * raw.BinSeconds), ff(b), ff(o)})
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// fairTimelineLinks writes the fairness timelines, links the CSV in the
// report and returns charts with the timeline charts added.
func fairTimelineLinks(w *errWriter, dir string, res *Results, charts []string) ([]string, error) {
	tl, wrote, err := writeFairTimelines(dir, res)
	if wrote {
		w.printf("\nEach flow's goodput every %v (every sample): [%s](%s)\n", fairBinWidth, fairTimelineCSV, fairTimelineCSV)
	}
	return append(charts, tl...), err
}
