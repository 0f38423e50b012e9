package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/tcpmux"
	"github.com/quictun/quictun/pkg/token"
)

func TestConnResult(t *testing.T) {
	t.Parallel()
	app := func(c proto.Code, remote bool) error {
		return &quic.ApplicationError{ErrorCode: c.ApplicationErrorCode(), Remote: remote}
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"idle timeout", &quic.IdleTimeoutError{}, "idle_timeout"},
		{"wrapped idle timeout", fmt.Errorf("conn: %w", &quic.IdleTimeoutError{}), "idle_timeout"},
		{"auth failed (we closed it)", app(proto.CodeAuthFailed, false), "auth_failed"},
		{"client shut down", app(proto.CodeShutdown, true), "shutdown"},
		{"we shut down", app(proto.CodeShutdown, false), "shutdown"},
		{"no authenticated header since the handshake", app(proto.CodeTimeout, false), "auth_timeout"},
		{"client closed with timeout", app(proto.CodeTimeout, true), "closed"},
		{"client closed normally", app(proto.CodeOK, true), "closed"},
		{"other code", app(proto.CodeInternal, true), "closed"},
		{"handshake timeout", &quic.HandshakeTimeoutError{}, "error"},
		{"stateless reset", &quic.StatelessResetError{}, "error"},
		{"transport error", &quic.TransportError{ErrorCode: quic.ProtocolViolation}, "error"},
		{"plain error", errors.New("boom"), "error"},
		{"TCP flood", &tcpmux.FloodError{What: "stream resets"}, "flood"},
		{"TCP malformed frames", fmt.Errorf("read: %w", &tcpmux.ProtocolError{Reason: "x"}), "protocol_error"},
		{"TCP peer reported our protocol error", &tcpmux.ProtocolError{Reason: "x", Remote: true}, "error"},
		{"nil", nil, "error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, connResult(tc.err))
		})
	}
}

func TestConnResultLabelsArePrecreated(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	labels := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "quictun_server_connections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetValue()] = true
			}
		}
	}
	for _, err := range []error{
		&quic.IdleTimeoutError{}, errors.New("x"),
		&quic.ApplicationError{ErrorCode: proto.CodeAuthFailed.ApplicationErrorCode()},
		&quic.ApplicationError{ErrorCode: proto.CodeShutdown.ApplicationErrorCode()},
		&quic.ApplicationError{ErrorCode: 0},
	} {
		assert.True(t, labels[connResult(err)], "connections_total{result=%q} is not pre-created", connResult(err))
	}
}

func TestNewDefaultsAndRequiredFields(t *testing.T) {
	t.Parallel()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = pc.Close() })
	parser, err := token.NewParser(token.PluginCleartext, "")
	require.NoError(t, err)
	full := func() Config {
		return Config{
			TLS:    &tls.Config{},
			Config: egress.Config{Parser: parser, Allow: endpoint.DefaultAllowList()}, Metrics: NewMetrics(prometheus.NewRegistry()),
		}
	}

	s, err := New(full(), pc)
	require.NoError(t, err)
	def := DefaultConfig()
	assert.Equal(t, def.HeaderTimeout, s.cfg.HeaderTimeout)
	assert.Equal(t, def.DialTimeout, s.cfg.DialTimeout)
	assert.Equal(t, def.MaxConcurrentDials, s.cfg.MaxConcurrentDials)
	assert.Equal(t, def.ReplayWindow, s.cfg.ReplayWindow)
	assert.Equal(t, def.MaxReplayEntries, s.cfg.MaxReplayEntries)
	assert.Equal(t, def.TailProbeDelay, s.cfg.TailProbeDelay)
	assert.Equal(t, def.MaxEchoesPerSecond, s.cfg.MaxEchoesPerSecond)
	assert.Zero(t, s.cfg.DrainTimeout, "zero drain stays zero (close at once)")
	assert.NotNil(t, s.Registry())
	assert.False(t, s.Ready(), "not ready before Run")
	assert.Equal(t, pc.LocalAddr(), s.Addr())
	assert.Empty(t, s.ConnStats())

	c := full()
	c.DrainTimeout, c.TailProbes, c.MaxConcurrentDials, c.ReplayWindow = -time.Second, -3, 3, time.Second
	s, err = New(c, pc)
	require.NoError(t, err)
	assert.Zero(t, s.cfg.DrainTimeout)
	assert.Zero(t, s.cfg.TailProbes)
	assert.Equal(t, 3, s.cfg.MaxConcurrentDials)
	assert.Equal(t, time.Second, s.cfg.ReplayWindow)

	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		nilPC  bool
		want   string
	}{
		{"no TLS", func(c *Config) { c.TLS = nil }, false, "TLS config is required"},
		{"no parser", func(c *Config) { c.Parser = nil }, false, "token parser is required"},
		{"no allow-list", func(c *Config) { c.Allow = nil }, false, "allow-list is required"},
		{"no metrics", func(c *Config) { c.Metrics = nil }, false, "metrics are required"},
		{"no socket", func(*Config) {}, true, "packet conn is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := full()
			tc.mutate(&c)
			p := pc
			if tc.nilPC {
				p = nil
			}
			_, err := New(c, p)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
