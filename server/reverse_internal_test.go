package server

import (
	"net"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/endpoint"
)

// reverseTestServer is a server allowing reverse forwards anywhere, whose
// admin listener is at admin; it does not run.
func reverseTestServer(t *testing.T, admin net.Addr, mutate func(*Config)) (*Server, net.PacketConn) {
	t.Helper()
	s := newTestServer(t, func(c *Config) {
		c.AllowRemoteListen = endpoint.MustParseAllowList("tcp:0.0.0.0:*")
		c.SelfAddrs = []net.Addr{admin}
		c.Reverse.Events = NewReverseMetrics(prometheus.NewRegistry())
		if mutate != nil {
			mutate(c)
		}
	})
	return s, s.pc
}

// TestReverseReservedPorts (issue 30, L3): the ports of the server's own
// listeners are reserved for reverse forwards at every address and family,
// on TCP and UDP alike; other ports and unix sockets are not.
func TestReverseReservedPorts(t *testing.T) {
	t.Parallel()
	admin := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8086}
	s, pc := reverseTestServer(t, admin, nil)
	q := strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port)
	for _, tc := range []struct {
		listen string
		want   bool
	}{
		{"tcp:127.0.0.1:8086", true},
		{"tcp:[::1]:8086", true},
		{"tcp:0.0.0.0:8086", true},
		{"tcp:[::]:8086", true},
		{"tcp:192.0.2.1:8086", true},
		{"udp:[::1]:8086", true},
		{"udp:[::1]:" + q, true},
		{"udp:0.0.0.0:" + q, true},
		{"tcp:[::1]:" + q, true}, // the TCP fallback's default port
		{"tcp:[::1]:8087", false},
		{"udp:127.0.0.1:8085", false},
		{"unix:/run/quictun/8086", false},
	} {
		ep, err := endpoint.Parse(tc.listen)
		require.NoError(t, err, tc.listen)
		_, got := s.binder.reservedPort(ep)
		assert.Equal(t, tc.want, got, tc.listen)
	}
}

// TestReverseLimitDefaults: the share per identity is an eighth of the
// listeners, at least one connection's; the refusal reasons start at 0.
func TestReverseLimitDefaults(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 32, DefaultRemoteListensPerIdentity(256, 16))
	assert.Equal(t, 16, DefaultRemoteListensPerIdentity(64, 16))
	reg := prometheus.NewRegistry()
	s, _ := reverseTestServer(t, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, func(c *Config) {
		c.RemoteListenMetrics = NewRemoteListenMetrics(reg)
	})
	assert.Equal(t, DefaultMaxRemoteListens, s.cfg.MaxRemoteListens)
	assert.Equal(t, DefaultMaxRemoteListensPerConn, s.cfg.MaxRemoteListensPerConn)
	assert.Equal(t, 32, s.cfg.MaxRemoteListensPerIdentity)
	n, err := promtest.GatherAndCount(reg, "quictun_server_refused_remote_listens_total")
	require.NoError(t, err)
	assert.Equal(t, len(RemoteListenRefusalReasons()), n)
	problems, err := promtest.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
}
