package app

import (
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/transport"
)

// TestReloadPinsPerServer: a reload applies pins per server (all of them
// or nothing): pinning one endpoint, and moving every server to pins of
// its own, apply; an entry for an endpoint the running client does not
// have (its --server-endpoint changed in the file: that needs a restart)
// fails the reload, as does a running endpoint left without a pin.
func TestReloadPinsPerServer(t *testing.T) {
	t.Parallel()
	noAuth := func(o *Options) { o.SecretFile, o.InsecureNoAuth = "", true } // the secret file is read at a reload
	o := validOptions()
	noAuth(o)
	o.ServerEndpoint = []string{"a.example:7500", "b.example:7500"}
	require.NoError(t, o.Validate())
	cache := transport.NewStickySessionCache(4)
	all, byServer, err := o.tlsConfig(klog.Background(), cache)
	require.NoError(t, err)
	assert.NotNil(t, all)
	assert.Empty(t, byServer)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer pc.Close()
	c, err := client.New(client.Config{Metrics: client.NewMetrics(prometheus.NewRegistry()),
		Servers: o.ServerEndpoint, TLS: all, Tokens: o.entries.tokens}, pc)
	require.NoError(t, err)
	apply := o.applier(c, nil, cache, ingress.NewProxyCredentials(nil))

	for _, tc := range []struct {
		name      string
		endpoints []string // of the reloaded file
		pins      []string
		wantErr   string
	}{
		{"pin one server", o.ServerEndpoint, []string{testFingerprint, "b.example:7500=" + otherFingerprint}, ""},
		{"each its own", o.ServerEndpoint, []string{"a.example:7500=" + testFingerprint, "b.example:7500=" + otherFingerprint}, ""},
		{"an endpoint the client does not run", []string{"a.example:7500", "c.example:7500"},
			[]string{"a.example:7500=" + testFingerprint, "c.example:7500=" + otherFingerprint},
			"pins for the running --server-endpoint (a change to it needs a restart): --server-fingerprint c.example:7500=" + otherFingerprint +
				" names c.example:7500, which is not a --server-endpoint (a.example:7500,b.example:7500)"},
	} {
		next := validOptions()
		noAuth(next)
		next.ServerEndpoint, next.ServerFingerprint = tc.endpoints, tc.pins
		require.NoError(t, next.Validate(), tc.name)
		applied, err := apply(next, []string{"server-fingerprint"})
		if tc.wantErr != "" {
			require.ErrorContains(t, err, tc.wantErr, tc.name)
			continue
		}
		require.NoError(t, err, tc.name)
		assert.Equal(t, []string{"server-fingerprint"}, applied, tc.name)
	}
}
