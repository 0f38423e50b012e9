package config

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// RedactedValue is written in place of a redacted flag's value.
const RedactedValue = "<redacted>"

// WriteYAML writes the effective value of every flag of fs, except those in
// skip, "help" and deprecated flags, as one YAML mapping that Load accepts.
// Flags come in fs order (sorted, unless fs.SortFlags is false), each preceded
// by its usage as a comment. Slice flags are written as YAML sequences.
func WriteYAML(w io.Writer, fs *pflag.FlagSet, skip ...string) error {
	return WriteYAMLRedacted(w, fs, nil, skip...)
}

// WriteYAMLRedacted is WriteYAML, except that each flag named in redact is
// written as a comment ("# name: <redacted>"), so its value is not shown and
// Loading the output leaves that flag at its default.
func WriteYAMLRedacted(w io.Writer, fs *pflag.FlagSet, redact []string, skip ...string) error {
	skipped := skipSet(skip)
	redacted := make(map[string]bool, len(redact))
	for _, r := range redact {
		redacted[r] = true
	}
	var buf bytes.Buffer
	var err error
	first := true
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || skipped[f.Name] || f.Deprecated != "" {
			return
		}
		if !first {
			buf.WriteByte('\n')
		}
		first = false
		for _, line := range strings.Split(strings.TrimSpace(f.Usage), "\n") {
			buf.WriteString(strings.TrimRight("# "+line, " ") + "\n")
		}
		if redacted[f.Name] {
			fmt.Fprintf(&buf, "# %s: %s\n", f.Name, RedactedValue)
			return
		}
		if e := encodeEntry(&buf, f); e != nil {
			err = fmt.Errorf("flag --%s: %w", f.Name, e)
		}
	})
	if err != nil {
		return err
	}
	if buf.Len() == 0 {
		buf.WriteString("{}\n")
	}
	_, err = w.Write(buf.Bytes())
	return err
}

// encodeEntry writes "name: value" for one flag.
func encodeEntry(buf *bytes.Buffer, f *pflag.Flag) error {
	var val *yaml.Node
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		val = &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		items := sv.GetSlice()
		if len(items) > 0 {
			val.Style = 0
		}
		elem := strings.TrimSuffix(strings.TrimSuffix(f.Value.Type(), "Slice"), "Array")
		for _, it := range items {
			val.Content = append(val.Content, scalarNode(elem, it))
		}
	} else if isMapFlag(f) {
		var err error
		if val, err = mapNode(f.Value.String()); err != nil {
			return err
		}
	} else {
		val = scalarNode(f.Value.Type(), f.Value.String())
	}
	m := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		{Kind: yaml.ScalarNode, Tag: "!!str", Value: f.Name},
		val,
	}}
	enc := yaml.NewEncoder(buf)
	enc.SetIndent(2)
	if err := enc.Encode(m); err != nil {
		return err
	}
	return enc.Close()
}

// isMapFlag reports whether f is one of pflag's stringToX map flags.
func isMapFlag(f *pflag.Flag) bool { return strings.HasPrefix(f.Value.Type(), "stringTo") }

// mapNode turns the String() of a pflag map flag ("[k=v,k2=v2]", CSV
// quoted) into a YAML mapping.
func mapNode(s string) (*yaml.Node, error) {
	m := &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	if s == "" {
		return m, nil
	}
	fields, err := csv.NewReader(strings.NewReader(s)).Read()
	if err != nil {
		return nil, fmt.Errorf("map value %q: %w", s, err)
	}
	m.Style = 0
	for _, kv := range fields {
		k, v, _ := strings.Cut(kv, "=")
		m.Content = append(m.Content, scalarNode("string", k), scalarNode("string", v))
	}
	return m, nil
}

// scalarNode returns a node that decodes back to exactly s. Booleans and
// numbers are written plainly; everything else is tagged as a string, so the
// encoder quotes it when YAML would otherwise read it as another type.
func scalarNode(typ, s string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Value: s, Tag: "!!str"}
	switch {
	case typ == "bool" && (s == "true" || s == "false"):
		n.Tag = "!!bool"
	case strings.HasPrefix(typ, "int") || strings.HasPrefix(typ, "uint") || strings.HasPrefix(typ, "float") || typ == "count":
		if s != "" {
			n.Tag = ""
		}
	}
	return n
}
