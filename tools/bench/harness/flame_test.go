package harness

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/pprof/profile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWriteCPUProfileTree(t *testing.T) {
	fn := func(id uint64, name string) *profile.Function {
		return &profile.Function{ID: id, Name: name, Filename: name + ".go"}
	}
	main, a, b := fn(1, "main"), fn(2, "a"), fn(3, "b")
	loc := func(id uint64, f ...*profile.Function) *profile.Location {
		l := &profile.Location{ID: id}
		for _, x := range f {
			l.Line = append(l.Line, profile.Line{Function: x})
		}
		return l
	}
	lMain, lA, lB := loc(1, main), loc(2, a), loc(3, b)
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		Sample: []*profile.Sample{
			{Location: []*profile.Location{lA, lMain}, Value: []int64{1, 30e6}},     // main -> a: 30 ms
			{Location: []*profile.Location{lB, lA, lMain}, Value: []int64{1, 10e6}}, // main -> a -> b: 10 ms
			{Location: []*profile.Location{lA, lMain}, Value: []int64{1, 5e6}},      // merged with the first
		},
		Function: []*profile.Function{main, a, b},
		Location: []*profile.Location{lMain, lA, lB},
	}
	var out bytes.Buffer
	require.NoError(t, WriteCPUProfileTree(p, &out))
	var doc struct{ Head cpuProfileNode }
	require.NoError(t, json.Unmarshal(out.Bytes(), &doc))
	require.Len(t, doc.Head.Children, 1)
	m := doc.Head.Children[0]
	assert.Equal(t, "main", m.FunctionName)
	require.Len(t, m.Children, 1)
	assert.Equal(t, "a", m.Children[0].FunctionName)
	assert.Equal(t, int64(35), m.Children[0].HitCount, "ms in a itself, both samples merged")
	require.Len(t, m.Children[0].Children, 1)
	assert.Equal(t, int64(10), m.Children[0].Children[0].HitCount)

	require.Error(t, WriteCPUProfileTree(&profile.Profile{SampleType: []*profile.ValueType{{Type: "alloc_space"}}}, &out))
}
