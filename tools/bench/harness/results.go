package harness

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"
)

// Machine describes where the benchmark ran.
type Machine struct {
	Hostname  string `json:"hostname"`
	Kernel    string `json:"kernel"`
	CPUModel  string `json:"cpu_model"`
	CPUs      int    `json:"cpus"`
	MemTotal  string `json:"mem_total"`
	GoVersion string `json:"go_version"`
	Load      string `json:"load_at_start"`
	// TCPCongestion is net.ipv4.tcp_congestion_control in the namespaces.
	TCPCongestion string `json:"tcp_congestion_control,omitempty"`
}

// Check is one validation of the emulated link: configured vs measured.
type Check struct {
	Name       string  `json:"name"`
	Configured string  `json:"configured"`
	Measured   string  `json:"measured"`
	Value      float64 `json:"value"`
	Expected   float64 `json:"expected"`
	Unit       string  `json:"unit"`
}

// Sample is one measurement: one variant, one link, one case, one repetition.
type Sample struct {
	Scenario string             `json:"scenario"`
	Link     string             `json:"link"`
	Case     string             `json:"case,omitempty"`
	Variant  string             `json:"variant"`
	Rep      int                `json:"rep"`
	Started  time.Time          `json:"started"`
	Metrics  map[string]float64 `json:"metrics"`
	Error    string             `json:"error,omitempty"`
	Raw      json.RawMessage    `json:"raw,omitempty"`
}

// LinkSpec is a named link configuration.
type LinkSpec struct {
	Name   string            `json:"name"`
	Params map[string]string `json:"params"`
}

// Results is the content of results.json.
type Results struct {
	Version  int               `json:"version"`
	Profile  string            `json:"profile"`
	Started  time.Time         `json:"started"`
	Finished time.Time         `json:"finished"`
	Machine  Machine           `json:"machine"`
	Tools    map[string]string `json:"tools"`
	Reps     int               `json:"repetitions"`
	Variants []string          `json:"variants"`
	Links    []LinkSpec        `json:"links"`
	Checks   []Check           `json:"validation"`
	Samples  []Sample          `json:"samples"`
	Notes    []string          `json:"notes,omitempty"`
	// Runtime: the daemons' environment and CPU placement (issue 32).
	Runtime *RuntimeInfo `json:"runtime,omitempty"`
}

// RuntimeInfo is how the run started the daemons.
type RuntimeInfo struct {
	// Inherited: the Go runtime settings every variant's daemons got from
	// the harness's environment ("Go's defaults" when none).
	Inherited string `json:"inherited"`
	// Tuned: the --runtime-env settings of the tuned variants (named
	// after them); empty: no tuned variant.
	Tuned string `json:"tuned,omitempty"`
	// Pinning describes the CPU placement.
	Pinning string `json:"pinning"`
}

func runtimeInfo(environ, tuned []string, pinning string) *RuntimeInfo {
	return &RuntimeInfo{Inherited: inheritedRuntimeEnv(environ, nil), Tuned: strings.Join(tuned, " "), Pinning: pinning}
}

// Save writes r as indented JSON.
func (r *Results) Save(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

// LoadResults reads results.json, or the results.json inside a directory.
func LoadResults(path string) (*Results, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path += "/results.json"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read results: %w", err)
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	return &r, nil
}

// Key identifies a group of repetitions.
type Key struct {
	Scenario, Link, Case, Variant, Metric string
}

func (k Key) String() string {
	return strings.Join([]string{k.Scenario, k.Link, k.Case, k.Variant, k.Metric}, " | ")
}

// Summary aggregates the repetitions of one metric.
type Summary struct {
	Median, Min, Max float64
	N                int // repetitions with a value
	// Never: repetitions in which a neverMetrics metric did not happen
	// (its yieldNever value is left out of Median, Min and Max).
	Never  int
	Errors int // repetitions that reported an error
}

// Aggregate groups samples by Key and summarises each group. A sample
// with an error still contributes the metrics it has.
func Aggregate(samples []Sample) map[Key]Summary {
	vals := map[Key][]float64{}
	errs, nevers := map[Key]int{}, map[Key]int{}
	for _, s := range samples {
		for m, v := range s.Metrics {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			k := Key{s.Scenario, s.Link, s.Case, s.Variant, m}
			if neverMetrics[m] && v == yieldNever {
				nevers[k]++
			} else {
				vals[k] = append(vals[k], v)
			}
			if s.Error != "" {
				errs[k]++
			}
		}
	}
	out := make(map[Key]Summary, len(vals)+len(nevers))
	for k, v := range vals {
		out[k] = summarize(v, errs[k])
	}
	for k, n := range nevers {
		s := out[k]
		s.Never, s.Errors = n, errs[k]
		out[k] = s
	}
	return out
}

// neverMetrics are the metrics whose value yieldNever (-1) means that the
// event did not happen (yield_s: the flow's rate never fell): Aggregate
// counts such values in Summary.Never instead of taking them into the
// median.
var neverMetrics = map[string]bool{"yield_s": true, "yield_first_s": true}

func summarize(v []float64, errs int) Summary {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Summary{Median: med, Min: s[0], Max: s[n-1], N: n, Errors: errs}
}
