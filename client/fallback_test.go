package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestFallbackWanted: when a TCP connection is kept, by mode and by what
// the supervisor reported about QUIC.
func TestFallbackWanted(t *testing.T) {
	t.Parallel()
	now := time.Now()
	delay := time.Second
	for _, tc := range []struct {
		name      string
		mode      string
		downSince time.Time
		quicUp    bool
		suspect   bool
		want      bool
		lookAt    time.Time
	}{
		{name: "tcp mode", mode: TransportTCP, want: true},
		{name: "quic mode, QUIC down for long", mode: TransportQUIC, downSince: now.Add(-time.Hour)},
		{name: "auto, before any dial", mode: TransportAuto},
		{name: "auto, QUIC dialing for less than the delay", mode: TransportAuto, downSince: now, lookAt: now.Add(delay)},
		{name: "auto, QUIC down for the delay", mode: TransportAuto, downSince: now.Add(-delay), want: true},
		{name: "auto, QUIC up", mode: TransportAuto, quicUp: true},
		{name: "auto, QUIC up but its path silent", mode: TransportAuto, quicUp: true, suspect: true, want: true},
	} {
		f := &fallback{mode: tc.mode, delay: delay, downSince: tc.downSince, quicUp: tc.quicUp, suspect: tc.suspect}
		got, at := f.wantedLocked(now)
		assert.Equal(t, tc.want, got, tc.name)
		assert.Equal(t, tc.lookAt, at, tc.name)
	}
}
