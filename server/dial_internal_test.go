package server

import (
	"crypto/tls"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
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
		TLS:    &tls.Config{},
		Config: egress.Config{Parser: parser, Allow: endpoint.DefaultAllowList()}, Metrics: NewMetrics(prometheus.NewRegistry()),
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
		})
	}
}
