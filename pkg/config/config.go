package config

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// MaxFileSize is the largest configuration file Load reads, in bytes.
const MaxFileSize = 1 << 20

var (
	// ErrUnknownKey is returned (wrapped, as "FILE:LINE: unknown key \"k\"")
	// for a YAML key that names no flag.
	ErrUnknownKey = errors.New("unknown key")
	// ErrForbiddenKey is returned for a YAML key that names a flag excluded
	// from files (the skip list, e.g. "config").
	ErrForbiddenKey = errors.New("key not allowed in a config file")
	// ErrDuplicateKey is returned when a YAML key appears twice.
	ErrDuplicateKey = errors.New("duplicate key")
	// ErrInvalidValue is returned when a file or environment value is
	// rejected by its flag, or has the wrong YAML shape (e.g. a mapping for
	// a string flag).
	ErrInvalidValue = errors.New("invalid value")
	// ErrSyntax is returned for a file that is not a single YAML mapping.
	ErrSyntax = errors.New("invalid config file")
)

// helpFlag is never read from files or the environment, and never written.
const helpFlag = "help"

func skipSet(skip []string) map[string]bool {
	m := make(map[string]bool, len(skip)+1)
	for _, s := range skip {
		m[s] = true
	}
	m[helpFlag] = true
	return m
}

// EnvName returns the environment variable consulted for flag name:
// prefix + "_" + the name upper-cased with '-' and '.' replaced by '_'.
func EnvName(prefix, name string) string {
	n := strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(name))
	if prefix == "" {
		return n
	}
	return prefix + "_" + n
}

// fileValue is one flag value read from the YAML file.
type fileValue struct {
	line   int
	scalar string   // for scalar nodes
	items  []string // for sequence nodes
	isSeq  bool
}

// Load applies, to every flag of fs that was not set on the command line
// (fs.Changed), the value of the environment variable EnvName(envPrefix,
// name) looked up with lookupEnv, or else the value from the YAML file (when
// file != ""). Flags named in skip (e.g. "config") and "help" are neither
// read from the environment nor allowed in the file.
//
// The file must be one YAML mapping whose keys are long flag names; an
// unknown, skipped or duplicate key is an error naming FILE:LINE. A null
// value (`key:` or `key: ~`) leaves the flag alone. Scalars are applied with
// fs.Set. For slice flags (pflag.SliceValue) a YAML sequence replaces the
// whole value, and a scalar is parsed as on the command line
// (comma-separated). Mappings are accepted only for map flags
// ("stringToString" and the like), as CSV-joined k=v pairs; an empty
// mapping leaves the flag alone, as pflag cannot empty a map flag. Anchors and
// aliases are refused. Environment values are applied with fs.Set, once, so
// they replace the file's value. An empty envPrefix still consults NAME
// variables; a nil lookupEnv disables the environment.
//
// A file value for a flag that the environment or the command line overrides
// is shape-checked but not parsed by the flag. Flags set by Load report
// Changed() == true afterwards. Every problem is
// reported (errors.Join), each wrapping ErrUnknownKey, ErrForbiddenKey,
// ErrDuplicateKey, ErrInvalidValue or ErrSyntax, or the os error for an
// unreadable file.
func Load(fs *pflag.FlagSet, file, envPrefix string, lookupEnv func(string) (string, bool), skip ...string) error {
	var data []byte
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return fmt.Errorf("config file: %w", err)
		}
		data, err = io.ReadAll(io.LimitReader(f, MaxFileSize+1))
		_ = f.Close() // read-only; the read error, if any, is what matters
		if err != nil {
			return fmt.Errorf("config file %s: %w", file, err)
		}
		if len(data) > MaxFileSize {
			return fmt.Errorf("%w: %s: larger than %d bytes", ErrSyntax, file, MaxFileSize)
		}
	}
	return load(fs, file, data, envPrefix, lookupEnv, skip)
}

// load is Load on file contents already read (file is used in messages;
// data is ignored when file is "").
func load(fs *pflag.FlagSet, file string, data []byte, envPrefix string, lookupEnv func(string) (string, bool), skip []string) error {
	skipped := skipSet(skip)
	var errs []error
	values := map[string]fileValue{}
	if file != "" {
		values, errs = parseFile(fs, file, data, skipped)
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if skipped[f.Name] || f.Changed {
			return
		}
		if lookupEnv != nil {
			env := EnvName(envPrefix, f.Name)
			if v, ok := lookupEnv(env); ok {
				if err := fs.Set(f.Name, v); err != nil {
					errs = append(errs, fmt.Errorf("environment %s: %w %q for flag --%s: %w", env, ErrInvalidValue, v, f.Name, cause(err)))
				}
				return
			}
		}
		v, ok := values[f.Name]
		if !ok {
			return
		}
		where := fmt.Sprintf("%s:%d", file, v.line)
		if v.isSeq {
			sv, ok := f.Value.(pflag.SliceValue)
			if !ok {
				errs = append(errs, fmt.Errorf("%s: %w for key %q: a list is only allowed for list flags (type %s)", where, ErrInvalidValue, f.Name, f.Value.Type()))
				return
			}
			if err := sv.Replace(v.items); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w %q for key %q: %w", where, ErrInvalidValue, strings.Join(v.items, ","), f.Name, err))
				return
			}
			f.Changed = true
			return
		}
		if err := fs.Set(f.Name, v.scalar); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w %q for key %q: %w", where, ErrInvalidValue, v.scalar, f.Name, cause(err)))
		}
	})
	return errors.Join(errs...)
}

// cause strips pflag's InvalidValueError, whose message repeats the flag and
// value we already name.
func cause(err error) error {
	var ive *pflag.InvalidValueError
	if errors.As(err, &ive) && ive.Unwrap() != nil {
		return ive.Unwrap()
	}
	return err
}

// parseFile decodes data strictly into per-flag values.
func parseFile(fs *pflag.FlagSet, file string, data []byte, skipped map[string]bool) (map[string]fileValue, []error) {
	values := map[string]fileValue{}
	seen := map[string]int{} // key → line of its first occurrence
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) { // empty file
			return values, nil
		}
		return nil, []error{fmt.Errorf("%w: %s: %w", ErrSyntax, file, err)}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, []error{fmt.Errorf("%w: %s: want exactly one YAML document", ErrSyntax, file)}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, []error{fmt.Errorf("%w: %s: want one YAML document", ErrSyntax, file)}
	}
	top := doc.Content[0]
	if isNull(top) {
		return values, nil
	}
	if top.Kind != yaml.MappingNode {
		return nil, []error{fmt.Errorf("%w: %s:%d: top level must be a mapping of flag names to values", ErrSyntax, file, top.Line)}
	}
	var errs []error
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			errs = append(errs, fmt.Errorf("%w: %s:%d: keys must be flag names", ErrSyntax, file, k.Line))
			continue
		}
		key := k.Value
		f := fs.Lookup(key)
		switch {
		case f == nil || f.Name != key: // a shorthand or normalised alias is not a key
			msg := fmt.Errorf("%s:%d: %w %q", file, k.Line, ErrUnknownKey, key)
			if s := suggest(fs, key, skipped); s != "" {
				msg = fmt.Errorf("%w (did you mean %q?)", msg, s)
			}
			errs = append(errs, msg)
			continue
		case skipped[key]:
			errs = append(errs, fmt.Errorf("%s:%d: %w: %q", file, k.Line, ErrForbiddenKey, key))
			continue
		}
		if first, dup := seen[key]; dup {
			errs = append(errs, fmt.Errorf("%s:%d: %w %q (first on line %d)", file, k.Line, ErrDuplicateKey, key, first))
			continue
		}
		seen[key] = k.Line
		fv, err := nodeValue(f, v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %w for key %q: %w", file, v.Line, ErrInvalidValue, key, err))
			continue
		}
		if fv == nil { // null: leave the flag alone
			continue
		}
		fv.line = k.Line
		values[key] = *fv
	}
	return values, errs
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// nodeValue converts a YAML value node for flag f; nil means null.
func nodeValue(f *pflag.Flag, v *yaml.Node) (*fileValue, error) {
	switch v.Kind {
	case yaml.ScalarNode:
		if isNull(v) {
			return nil, nil
		}
		return &fileValue{scalar: v.Value}, nil
	case yaml.SequenceNode:
		items := make([]string, 0, len(v.Content))
		for _, it := range v.Content {
			if it.Kind != yaml.ScalarNode || isNull(it) {
				return nil, fmt.Errorf("line %d: list items must be scalars", it.Line)
			}
			items = append(items, it.Value)
		}
		return &fileValue{items: items, isSeq: true}, nil
	case yaml.MappingNode:
		if !strings.HasPrefix(f.Value.Type(), "stringTo") {
			return nil, fmt.Errorf("a mapping is only allowed for map flags (type %s)", f.Value.Type())
		}
		if len(v.Content) == 0 {
			return nil, nil // pflag map flags cannot be emptied through Set
		}
		pairs := make([]string, 0, len(v.Content)/2)
		for i := 0; i+1 < len(v.Content); i += 2 {
			mk, mv := v.Content[i], v.Content[i+1]
			if mk.Kind != yaml.ScalarNode || mv.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: map keys and values must be scalars", mk.Line)
			}
			pairs = append(pairs, mk.Value+"="+mv.Value)
		}
		var b strings.Builder
		w := csv.NewWriter(&b)
		if err := w.Write(pairs); err != nil {
			return nil, err
		}
		w.Flush()
		return &fileValue{scalar: strings.TrimSuffix(b.String(), "\n")}, nil
	case yaml.AliasNode:
		return nil, errors.New("anchors and aliases are not supported")
	default:
		return nil, fmt.Errorf("unexpected YAML node kind %d", v.Kind)
	}
}

// suggest returns the flag name closest to key (edit distance <= 2), if any.
func suggest(fs *pflag.FlagSet, key string, skipped map[string]bool) string {
	if len(key) > 100 {
		return ""
	}
	best, bestD := "", 3
	fs.VisitAll(func(f *pflag.Flag) {
		if skipped[f.Name] {
			return
		}
		if d := editDistance(key, f.Name); d < bestD {
			best, bestD = f.Name, d
		}
	})
	return best
}

// SuggestFlag returns the long name of the flag of fs that name (a long
// flag name as typed, without dashes) most likely meant: the closest within
// edit distance 2, else the one flag whose name starts with name (3 letters
// at least); "" if none. Hidden flags are not suggested.
func SuggestFlag(fs *pflag.FlagSet, name string) string {
	hidden := map[string]bool{}
	var prefixed []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			hidden[f.Name] = true
		} else if len(name) >= 3 && strings.HasPrefix(f.Name, name) {
			prefixed = append(prefixed, f.Name)
		}
	})
	if s := suggest(fs, name, hidden); s != "" {
		return s
	}
	if len(prefixed) == 1 {
		return prefixed[0]
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := 1
			if a[i-1] == b[j-1] {
				c = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+c)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// UnknownEnv returns, sorted, the variables of environ ("NAME=value" pairs,
// as os.Environ gives) that start with envPrefix + "_" but name no flag of fs
// that Load would read (skip and "help" excluded) and are not in extra. Each
// entry is the variable name, and " (did you mean NAME?)" when a flag's
// variable is within edit distance 2. Load ignores such variables; a caller
// warns about them, as a misspelled variable otherwise changes nothing
// silently. Values are never returned.
func UnknownEnv(fs *pflag.FlagSet, envPrefix string, environ []string, extra []string, skip ...string) []string {
	skipped := skipSet(skip)
	known := make(map[string]bool)
	for _, e := range extra {
		known[e] = true
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if !skipped[f.Name] {
			known[EnvName(envPrefix, f.Name)] = true
		}
	})
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix+"_") || known[name] {
			continue
		}
		entry := name
		if len(name) <= 100 {
			best, bestD := "", 3
			for k := range known {
				if d := editDistance(name, k); d < bestD || (d == bestD && k < best) {
					best, bestD = k, d
				}
			}
			if best != "" {
				entry += " (did you mean " + best + "?)"
			}
		}
		out = append(out, entry)
	}
	sort.Strings(out)
	return out
}
