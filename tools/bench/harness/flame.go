package harness

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"

	"github.com/google/pprof/profile"
)

// cpuProfileNode is a node of the call tree in the V8 .cpuprofile format
// (head, nested children) that flame graph renderers read, e.g. the
// flamegraph npm package (npx flamegraph@1.3.0 -t cpuprofile -f FILE > out.svg).
type cpuProfileNode struct {
	FunctionName string            `json:"functionName"`
	URL          string            `json:"url"`
	LineNumber   int64             `json:"lineNumber"`
	HitCount     int64             `json:"hitCount"`
	Children     []*cpuProfileNode `json:"children"`

	index map[string]*cpuProfileNode
}

func (n *cpuProfileNode) child(fn, file string) *cpuProfileNode {
	key := fn + "\x00" + file
	if c := n.index[key]; c != nil {
		return c
	}
	c := &cpuProfileNode{FunctionName: fn, URL: file, Children: []*cpuProfileNode{}}
	if n.index == nil {
		n.index = map[string]*cpuProfileNode{}
	}
	n.index[key] = c
	n.Children = append(n.Children, c)
	return c
}

// WriteCPUProfileTree writes the call tree of a pprof CPU profile as a V8
// .cpuprofile document: every sample's stack from the root down, with its
// CPU time in milliseconds as the leaf's hit count (inlined calls are frames
// of their own, as pprof shows them). Function names only, no line numbers,
// so that one function's samples merge.
func WriteCPUProfileTree(p *profile.Profile, w io.Writer) error {
	vi := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			vi = i
		}
	}
	if vi < 0 {
		return fmt.Errorf("not a CPU profile (sample types %v)", p.SampleType)
	}
	unit := int64(1)
	if p.SampleType[vi].Unit == "nanoseconds" {
		unit = 1e6 // hit counts in milliseconds
	}
	root := &cpuProfileNode{FunctionName: "(root)", Children: []*cpuProfileNode{}}
	for _, s := range p.Sample {
		n := root
		for _, loc := range slices.Backward(s.Location) {
			for _, ln := range slices.Backward(loc.Line) {
				fn, file := "?", ""
				if ln.Function != nil {
					fn, file = ln.Function.Name, ln.Function.Filename
				}
				n = n.child(fn, file)
			}
		}
		n.HitCount += s.Value[vi] / unit
	}
	return json.NewEncoder(w).Encode(struct {
		Head *cpuProfileNode `json:"head"`
	}{root})
}
