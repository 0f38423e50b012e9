package ingress

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestVerdicts(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	var v verdicts
	assert.False(t, v.accepted("tcp:a:1", now), "unknown")
	v.record("tcp:a:1", true, now)
	assert.True(t, v.accepted("tcp:a:1", now.Add(verdictTTL-time.Second)))
	assert.False(t, v.accepted("tcp:a:1", now.Add(verdictTTL)), "expired")
	assert.False(t, v.accepted("tcp:a:1", now), "an expired entry is gone")

	v.record("tcp:a:1", true, now)
	v.record("tcp:a:1", false, now.Add(time.Second))
	assert.False(t, v.accepted("tcp:a:1", now.Add(time.Second)), "a refusal forgets")
	v.record("tcp:b:1", false, now) // nothing to forget
	assert.False(t, v.accepted("tcp:b:1", now))
}

func TestVerdictsBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	var v verdicts
	for i := range maxVerdicts {
		v.record(fmt.Sprintf("tcp:h%d:1", i), true, now.Add(time.Duration(i)*time.Millisecond))
	}
	v.record("tcp:h0:1", true, now.Add(time.Second)) // refreshed, not added
	require.Len(t, v.m, maxVerdicts)
	v.record("tcp:new:1", true, now.Add(time.Second))
	require.Len(t, v.m, maxVerdicts, "full: the oldest goes")
	assert.False(t, v.accepted("tcp:h1:1", now.Add(time.Second)), "the oldest was h1 (h0 was refreshed)")
	assert.True(t, v.accepted("tcp:h0:1", now.Add(time.Second)))
	assert.True(t, v.accepted("tcp:new:1", now.Add(time.Second)))

	// Expired entries go before any live one.
	later := now.Add(time.Second + verdictTTL)
	v.record("tcp:h2:1", true, later)
	v.record("tcp:later:1", true, later)
	assert.True(t, v.accepted("tcp:h2:1", later))
	assert.True(t, v.accepted("tcp:later:1", later))
	assert.LessOrEqual(t, len(v.m), 3, "everything else had expired")
}

func TestLoggableToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ token, want string }{
		{"tcp:10.0.0.5:22", "tcp:10.0.0.5:22"},
		{"udp:[::1]:53", "udp:[::1]:53"},
		{"unix:/run/app.sock", "unix:/run/app.sock"},
		{"k7Jx0c2VjcmV0LXRva2Vu", "(opaque token)"}, // what a --token-parser-key server decrypts
	} {
		assert.Equal(t, tc.want, LoggableToken(tc.token), tc.token)
	}
}
