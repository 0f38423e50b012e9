package server

import (
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/token"
)

func newTestServer(t *testing.T, mutate func(*Config)) *Server {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = pc.Close() })
	parser, err := token.NewParser(token.PluginCleartext, "")
	require.NoError(t, err)
	cfg := Config{
		TLS: &tls.Config{}, Parser: parser, Allow: endpoint.DefaultAllowList(),
		Metrics: metrics.NewServer(prometheus.NewRegistry()),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg, pc)
	require.NoError(t, err)
	return s
}

func TestMaxDialsPerDestinationDefault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		total, perDst int
		want          int
	}{
		{"default: a quarter of the default total", 0, 0, DefaultConfig().MaxConcurrentDials / 4},
		{"a quarter of 256", 256, 0, 64},
		{"at least one", 3, 0, 1},
		{"explicit", 256, 5, 5},
		{"negative means default", 8, -1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newTestServer(t, func(c *Config) {
				c.MaxConcurrentDials, c.MaxDialsPerDestination = tc.total, tc.perDst
			})
			assert.Equal(t, tc.want, s.cfg.MaxDialsPerDestination)
			d := s.destination("tcp:127.0.0.1:22")
			assert.Equal(t, tc.want, cap(d.slots))
			s.releaseDestination("tcp:127.0.0.1:22", false)
		})
	}
}

func TestDestinationSlots(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, func(c *Config) { c.MaxDialsPerDestination = 2 })
	a1 := s.destination("a")
	a2 := s.destination("a")
	b := s.destination("b")
	assert.Same(t, a1, a2, "one semaphore per destination")
	assert.NotSame(t, a1, b)
	assert.Equal(t, 2, a1.refs)

	a1.slots <- struct{}{}
	a2.slots <- struct{}{}
	select {
	case a1.slots <- struct{}{}:
		t.Fatal("a third concurrent dial to one destination got a slot")
	default:
	}
	select {
	case b.slots <- struct{}{}: // another destination is not affected
	default:
		t.Fatal("destination b blocked by a")
	}

	s.releaseDestination("a", true)
	assert.Len(t, a1.slots, 1, "a held slot is freed")
	s.releaseDestination("a", true)
	s.releaseDestination("b", true)
	s.dialsMu.Lock()
	assert.Empty(t, s.dialsByDest, "unused destinations are forgotten")
	s.dialsMu.Unlock()
}

func TestDestinationSlotsConcurrent(t *testing.T) {
	t.Parallel()
	const limit = 3
	s := newTestServer(t, func(c *Config) { c.MaxDialsPerDestination = limit })
	var inFlight, peak atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			dest := []string{"x", "y"}[w%2]
			for range 50 {
				d := s.destination(dest)
				d.slots <- struct{}{}
				if dest == "x" {
					n := inFlight.Add(1)
					for {
						p := peak.Load()
						if n <= p || peak.CompareAndSwap(p, n) {
							break
						}
					}
					inFlight.Add(-1)
				}
				s.releaseDestination(dest, true)
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, peak.Load(), int64(limit), "never more than the limit per destination")
	s.dialsMu.Lock()
	defer s.dialsMu.Unlock()
	assert.Empty(t, s.dialsByDest)
}
