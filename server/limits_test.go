package server

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestSourceLimiterHandshakeRate(t *testing.T) {
	t.Parallel()
	l := newSourceLimiter(10, 0) // burst 20
	now := time.Unix(1000, 0)
	for i := range 20 {
		assert.True(t, l.allowHandshake("192.0.2.1", now), "handshake %d within the burst", i)
	}
	assert.False(t, l.allowHandshake("192.0.2.1", now), "burst used up")
	assert.True(t, l.suspicious("192.0.2.1", now))
	assert.True(t, l.allowHandshake("192.0.2.2", now), "other sources are not affected")
	assert.False(t, l.suspicious("192.0.2.2", now))
	later := now.Add(500 * time.Millisecond) // 5 tokens back
	for range 5 {
		assert.True(t, l.allowHandshake("192.0.2.1", later))
	}
	assert.False(t, l.allowHandshake("192.0.2.1", later))
	assert.True(t, newSourceLimiter(0, 0).allowHandshake("x", now), "0 disables the rate")
}

func TestSourceLimiterOpenConnections(t *testing.T) {
	t.Parallel()
	l := newSourceLimiter(0, 2)
	now := time.Now()
	assert.True(t, l.open("a", now))
	assert.True(t, l.open("a", now))
	assert.False(t, l.open("a", now), "third connection over the cap")
	assert.True(t, l.open("b", now))
	l.closed("a")
	assert.True(t, l.open("a", now), "a closed connection frees its place")
	l.closed("unknown") // no panic
}

func TestSourceIP(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "192.0.2.7", sourceIP(&net.UDPAddr{IP: net.ParseIP("192.0.2.7"), Port: 5}))
	assert.Equal(t, "::1", sourceIP(&net.UDPAddr{IP: net.IPv6loopback, Port: 5}))
}
