package harness

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// lossInfo describes the loss scenario for the report.
func lossInfo() ScenarioInfo {
	return ScenarioInfo{"2c. Heavy random loss (issue 31)",
		"100 Mbit/s each way, 12.5 ms one-way (RTT 25 ms), random loss both ways at each level. For every level, repetition and variant the tunnel's daemons are started afresh on the loss-free link (the handshake is not part of the figure), then the lossy link is applied and three downloads run one after the other, each a new TCP connection through the same tunnel connection (direct TCP: its own connection each); a run's figure is its goodput over the 10 s from its request (the data still draining after the window is not counted; drained = 0 when its end did not arrive within 3 s more). **The figure is the minimum of the three runs of a repetition**: the table gives the median (min–max) of those minima over the repetitions, then each run (repetitions separated by `;`). CPU % = share of one core during the runs (median over runs): the tunnel's client and server daemons and the emulator (the harness process less the download reader's thread); an emulator near 100 % or with late packets would be the limit, not the protocol. ×V: the quictun variant's median minimum over V's.",
		append([]Metric{{"mbit_per_s", "Mbit/s", true}, {"max_mbit_per_s", "max of runs Mbit/s", true}, {"reconnects", "tunnel reconnects", false},
			{"drained", "drained", true}}, usageColumns[:7]...),
		[]string{"mbit_per_s"}}
}

// writeLossTables writes the headline table of the loss scenario (per level
// and variant: the minimum of the runs, each run, CPU) and the per-run
// table.
func writeLossTables(w *errWriter, res *Results, rows []row, agg map[Key]Summary) {
	var links []string
	for _, r := range rows {
		if !slices.Contains(links, r.link) {
			links = append(links, r.link)
		}
	}
	vars := lossVariants(res)
	refs := []string{}
	for _, ref := range []string{"kcptun", "direct-bbr"} {
		if slices.Contains(vars, ref) {
			refs = append(refs, ref)
		}
	}
	var ratios [][2]string
	for _, v := range vars {
		if strings.HasPrefix(v, "quictun") {
			for _, ref := range refs {
				ratios = append(ratios, [2]string{v, ref})
			}
		}
	}
	w.printf("| loss | %s |", strings.Join(vars, " | "))
	for _, rt := range ratios {
		w.printf(" %s ×%s |", rt[0], rt[1])
	}
	w.printf("\n|---|%s%s\n", strings.Repeat("---|", len(vars)), strings.Repeat("---|", len(ratios)))
	for _, l := range links {
		w.printf("| %s |", l)
		for _, v := range vars {
			s, ok := agg[Key{ScLoss, l, lossMinCase, v, "mbit_per_s"}]
			w.printf(" **%s**<br>runs %s<br>%s |", fmtSummary(s, ok), lossRunsCell(res.Samples, l, v), lossCPUCell(res.Samples, l, v))
		}
		for _, rt := range ratios {
			w.printf(" %s |", ratioCell(agg, Key{ScLoss, l, lossMinCase, rt[0], "mbit_per_s"}, Key{ScLoss, l, lossMinCase, rt[1], "mbit_per_s"}))
		}
		w.printf("\n")
	}
	w.printf("\nEvery run, with the CPU and emulator counters beside its goodput:\n\n")
	var runRows []row
	for _, r := range rows {
		if r.cs != lossMinCase {
			runRows = append(runRows, r)
		}
	}
	writeRowTable(w, ScLoss, lossInfo(), runRows, vars, agg, nil)
}

// lossVariants are the variants with loss samples, in the run's order.
func lossVariants(res *Results) []string {
	var out []string
	for _, v := range res.Variants {
		for _, s := range res.Samples {
			if s.Scenario == ScLoss && s.Variant == v {
				out = append(out, v)
				break
			}
		}
	}
	return out
}

// lossRunsCell lists the runs' goodput of (link, variant), repetitions
// separated by "; ".
func lossRunsCell(samples []Sample, link, v string) string {
	reps := map[int][]string{}
	var order []int
	for _, s := range samples {
		if s.Scenario != ScLoss || s.Link != link || s.Variant != v || s.Case == lossMinCase {
			continue
		}
		if _, ok := reps[s.Rep]; !ok {
			order = append(order, s.Rep)
		}
		c := fmt.Sprintf("%.1f", s.Metrics["mbit_per_s"])
		if s.Error != "" {
			c += "⚠"
		}
		reps[s.Rep] = append(reps[s.Rep], c)
	}
	if len(order) == 0 {
		return "–"
	}
	parts := make([]string, 0, len(order))
	for _, r := range order {
		parts = append(parts, strings.Join(reps[r], "/"))
	}
	return strings.Join(parts, "; ")
}

// lossCPUCell is the median CPU % of the tunnel's client and server and of
// the emulator over the runs of (link, variant).
func lossCPUCell(samples []Sample, link, v string) string {
	vals := map[string][]float64{}
	for _, s := range samples {
		if s.Scenario != ScLoss || s.Link != link || s.Variant != v || s.Case == lossMinCase {
			continue
		}
		for _, k := range []string{"cpu_client_pct", "cpu_server_pct", "emu_cpu_pct"} {
			if x, ok := s.Metrics[k]; ok {
				vals[k] = append(vals[k], x)
			}
		}
	}
	med := func(k string) string {
		if len(vals[k]) == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f", median(vals[k]))
	}
	if len(vals["cpu_client_pct"]) == 0 {
		return "CPU % emu " + med("emu_cpu_pct")
	}
	return fmt.Sprintf("CPU %% client %s server %s emu %s", med("cpu_client_pct"), med("cpu_server_pct"), med("emu_cpu_pct"))
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// lossTimeline is the goodput over time of the first repetition's runs
// of (link, variant), the runs back to back: x in s, y in Mbit/s.
func lossTimeline(samples []Sample, link, v string) plotter.XYs {
	var pts plotter.XYs
	off := 0.0
	for _, s := range samples {
		if s.Scenario != ScLoss || s.Link != link || s.Variant != v || s.Case == lossMinCase || s.Rep != 0 {
			continue
		}
		var raw lossRaw
		if json.Unmarshal(s.Raw, &raw) != nil || raw.BinSeconds <= 0 {
			continue
		}
		for i, b := range raw.Bins {
			pts = append(pts, plotter.XY{X: off + (float64(i)+0.5)*raw.BinSeconds, Y: b})
		}
		off += float64(len(raw.Bins)) * raw.BinSeconds
	}
	return pts
}

// writeLossCharts draws, per loss level, the goodput over time of every
// variant (first repetition, its runs back to back).
func writeLossCharts(dir string, res *Results, rows []row) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	vars := lossVariants(res)
	for _, r := range rows {
		if seen[r.link] {
			continue
		}
		seen[r.link] = true
		var series []timelineSeries
		for vi, v := range vars {
			if pts := lossTimeline(res.Samples, r.link, v); len(pts) > 0 {
				series = append(series, timelineSeries{Name: v, Style: vi, Pts: pts})
			}
		}
		name := fmt.Sprintf("%s-timeline-%s.png", ScLoss, chartSlug(r.link))
		title := fmt.Sprintf("Goodput over time, %s (repetition 1, successive runs back to back)", r.link)
		if err := saveTimelineChart(filepath.Join(dir, name), title, series, nil); err != nil {
			return out, err
		}
		out = append(out, name)
	}
	return out, nil
}

// timelineSeries is one line of a goodput-over-time chart: x in s, y in
// Mbit/s; Style picks its colour and dashes.
type timelineSeries struct {
	Name  string
	Style int
	Pts   plotter.XYs
}

// saveTimelineChart draws the goodput of each series over time into the
// PNG file path, with a vertical grey line at each of marks (s).
func saveTimelineChart(path, title string, series []timelineSeries, marks []float64) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "s"
	p.Y.Label.Text = "Mbit/s"
	top := 0.0
	for _, sr := range series {
		for _, pt := range sr.Pts {
			top = math.Max(top, pt.Y)
		}
		l, err := plotter.NewLine(sr.Pts)
		if err != nil {
			return fmt.Errorf("line chart: %w", err)
		}
		l.Color = plotutil.Color(sr.Style)
		l.Dashes = plotutil.Dashes(sr.Style)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(sr.Name, l)
	}
	p.Legend.Top = true
	p.Y.Min = 0
	p.Y.Max = math.Max(top*1.3, 1)
	for _, x := range marks {
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: p.Y.Max}})
		if err != nil {
			return fmt.Errorf("line chart: %w", err)
		}
		l.Color = color.Gray{Y: 128}
		l.Width = vg.Points(1)
		p.Add(l)
	}
	p.Add(plotter.NewGrid())
	p.BackgroundColor = color.White
	if err := p.Save(9*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return fmt.Errorf("save chart: %w", err)
	}
	return nil
}

// chartSlug turns a link name into a file name part.
func chartSlug(s string) string {
	s = strings.ToLower(strings.ReplaceAll(s, "%", "pct"))
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '.'
	}), "-")
}
