package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func durations(ms ...int) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, m := range ms {
		out[i] = time.Duration(m) * time.Millisecond
	}
	return out
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	oneToTen := durations(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	oneToHundred := make([]time.Duration, 100)
	for i := range oneToHundred {
		oneToHundred[i] = time.Duration(i+1) * time.Millisecond
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"single p50", durations(7), 50, 7 * time.Millisecond},
		{"single p99", durations(7), 99, 7 * time.Millisecond},
		{"two p50 is the lower", durations(1, 2), 50, 1 * time.Millisecond},
		{"two p51 is the upper", durations(1, 2), 51, 2 * time.Millisecond},
		{"ten p50", oneToTen, 50, 5 * time.Millisecond},
		{"ten p90 exact rank", oneToTen, 90, 9 * time.Millisecond},
		{"ten p99", oneToTen, 99, 10 * time.Millisecond},
		{"ten p0 is min", oneToTen, 0, 1 * time.Millisecond},
		{"ten p100 is max", oneToTen, 100, 10 * time.Millisecond},
		{"hundred p1", oneToHundred, 1, 1 * time.Millisecond},
		{"hundred p50", oneToHundred, 50, 50 * time.Millisecond},
		{"hundred p90", oneToHundred, 90, 90 * time.Millisecond},
		{"hundred p99", oneToHundred, 99, 99 * time.Millisecond},
		{"hundred p99.5", oneToHundred, 99.5, 100 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, Percentile(tc.sorted, tc.p))
		})
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	in := durations(9, 1, 5, 3, 7)
	before := append([]time.Duration(nil), in...)
	s := Summarize(in)
	assert.Equal(t, before, in, "Summarize must not reorder its input")
	assert.Equal(t, Summary{
		Count: 5,
		Min:   1 * time.Millisecond,
		Mean:  5 * time.Millisecond,
		P50:   5 * time.Millisecond,
		P90:   9 * time.Millisecond,
		P99:   9 * time.Millisecond,
		Max:   9 * time.Millisecond,
	}, s)
	assert.Equal(t, Summary{}, Summarize(nil))
}

func TestRates(t *testing.T) {
	t.Parallel()
	assert.InDelta(t, 8.0, mbitPerSecond(1_000_000, time.Second), 1e-9)
	assert.InDelta(t, 0.0, mbitPerSecond(1, 0), 1e-9)
	assert.InDelta(t, 500.0, perSecond(1000, 2*time.Second), 1e-9)
	assert.InDelta(t, 1.5, ms(1500*time.Microsecond), 1e-9)
}

func TestParseByteSize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"1000", 1000, false},
		{"0", 0, false},
		{"64KiB", 64 << 10, false},
		{"256MiB", 256 << 20, false},
		{"16mib", 16 << 20, false},
		{"1GiB", 1 << 30, false},
		{"1.5MiB", 3 << 19, false},
		{"10MB", 10_000_000, false},
		{"2k", 2000, false},
		{"100B", 100, false},
		{"", 0, true},
		{"MiB", 0, true},
		{"-1", 0, true},
		{"abc", 0, true},
		{"99999999999GiB", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			got, err := parseByteSize(tc.in)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	assert.Equal(t, "256MiB", formatByteSize(256<<20))
	assert.Equal(t, "1000", formatByteSize(1000))
}

func TestSinkCodec(t *testing.T) {
	t.Parallel()
	req := sinkRequest{direction: dirDown, count: 1<<40 + 7}
	got, err := decodeSinkRequest(req.encode())
	require.NoError(t, err)
	assert.Equal(t, req, got)

	bad := req.encode()
	bad[0] = 'X'
	_, err = decodeSinkRequest(bad)
	require.Error(t, err)
	bad = req.encode()
	bad[5] = 'Z'
	_, err = decodeSinkRequest(bad)
	require.Error(t, err)

	tr := sinkTrailer{count: 12345, crc: 0xdeadbeef}
	assert.Equal(t, tr, decodeSinkTrailer(tr.encode()))
}

func TestPatternWraps(t *testing.T) {
	t.Parallel()
	p := newPattern()
	first := append([]byte(nil), p.next(patternSize)...)
	// After a full cycle the sequence repeats, across any split.
	a := append([]byte(nil), p.next(1000)...)
	assert.Equal(t, first[:1000], a)
	p.off = patternSize - 10
	b := p.next(20)
	assert.Equal(t, append(append([]byte(nil), first[patternSize-10:]...), first[:10]...), b)
}
