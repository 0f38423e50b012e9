package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// byteSize is a pflag.Value holding a byte count written as a plain number or
// with a binary (KiB, MiB, GiB) or decimal (KB, MB, GB) suffix, e.g. 256MiB.
type byteSize int64

var sizeSuffixes = []struct {
	suffix string
	mult   int64
}{
	// Longer suffixes first so that "MiB" is not read as "B".
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
	{"ki", 1 << 10}, {"mi", 1 << 20}, {"gi", 1 << 30},
	{"kb", 1000}, {"mb", 1000 * 1000}, {"gb", 1000 * 1000 * 1000},
	{"k", 1000}, {"m", 1000 * 1000}, {"g", 1000 * 1000 * 1000},
	{"b", 1},
}

// parseByteSize parses s as described on byteSize.
func parseByteSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, sf := range sizeSuffixes {
		if strings.HasSuffix(t, sf.suffix) {
			t = strings.TrimSpace(strings.TrimSuffix(t, sf.suffix))
			mult = sf.mult
			break
		}
	}
	if t == "" {
		return 0, fmt.Errorf("invalid size %q: no number", s)
	}
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		if n < 0 || n > math.MaxInt64/mult {
			return 0, fmt.Errorf("invalid size %q: out of range", s)
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsNaN(f) || f*float64(mult) >= math.MaxInt64 {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return int64(f * float64(mult)), nil
}

// formatByteSize renders n with a binary suffix when it divides evenly.
func formatByteSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "GiB"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "KiB"
	default:
		return strconv.FormatInt(n, 10)
	}
}

func (b *byteSize) String() string { return formatByteSize(int64(*b)) }

func (b *byteSize) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func (b *byteSize) Type() string { return "bytes" }
