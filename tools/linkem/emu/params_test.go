package emu

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"100mbit", 100_000_000, false},
		{"1gbit", 1_000_000_000, false},
		{"500kbit", 500_000, false},
		{"2.5Mbit", 2_500_000, false},
		{"12mbps", 96_000_000, false},
		{"1000", 1000, false},
		{"", 0, false},
		{"0", 0, false},
		{"unlimited", 0, false},
		{"fast", 0, true},
		{"-5mbit", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseRate(tc.in)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			back, err := ParseRate(FormatRate(got))
			require.NoError(t, err)
			assert.Equal(t, got, back, "FormatRate round trip")
		})
	}
}

func TestParseProbability(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]float64{"0.01": 0.01, "1%": 0.01, "0": 0, "100%": 1} {
		got, err := ParseProbability(in)
		require.NoError(t, err, in)
		assert.InDelta(t, want, got, 1e-12, in)
	}
	for _, in := range []string{"2", "-0.1", "x", "150%"} {
		_, err := ParseProbability(in)
		assert.Error(t, err, in)
	}
}

func TestParamsApply(t *testing.T) {
	t.Parallel()
	p, err := DefaultParams().Apply(map[string]string{
		"delay": "12.5ms", "jitter": "1ms", "loss": "1%", "rate": "100mbit", "queue-bytes": "100000",
		"ge-p": "0.01", "ge-r": "0.3", "duplicate": "0.001", "reorder": "0.002", "reorder-delay": "3ms",
	})
	require.NoError(t, err)
	assert.Equal(t, 12500*time.Microsecond, p.Delay)
	assert.Equal(t, time.Millisecond, p.Jitter)
	assert.InDelta(t, 0.01, p.Loss, 1e-12)
	assert.Equal(t, int64(100e6), p.RateBits)
	assert.Equal(t, 100000, p.EffectiveQueueBytes())
	assert.InDelta(t, 1.0, p.GELossBad, 1e-12)
	// Round trip through the string form used by the API.
	q, err := DefaultParams().Apply(p.ToMap())
	require.NoError(t, err)
	assert.Equal(t, p, q)

	_, err = DefaultParams().Apply(map[string]string{"dealy": "1ms", "loss": "3"})
	require.Error(t, err)
	assert.ErrorContains(t, err, `unknown link parameter "dealy"`)
	assert.ErrorContains(t, err, "loss")

	_, err = DefaultParams().Apply(map[string]string{"ge-p": "0.1"})
	assert.ErrorContains(t, err, "ge-r")
}

func TestEffectiveQueueBytes(t *testing.T) {
	t.Parallel()
	assert.Equal(t, MinQueueBytes, Params{}.EffectiveQueueBytes())
	assert.Equal(t, 625000, Params{RateBits: 100e6}.EffectiveQueueBytes())
	assert.Equal(t, 5000, Params{RateBits: 100e6, QueueBytes: 5000}.EffectiveQueueBytes())
}
