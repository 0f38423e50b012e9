package integration

import (
	"crypto/tls"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/server"
)

// TestAllowForClientCertificate: with mutual TLS, a rule bound to a client
// certificate's common name admits that client only; both reach what --allow
// admits; deny still wins; /tunnels and /connections show the identity.
func TestAllowForClientCertificate(t *testing.T) {
	common, private, denied := testutil.EchoServer(t), testutil.EchoServer(t), testutil.EchoServer(t)
	pool, issue := testutil.ClientCA(t)
	allowFor := map[string]*endpoint.AllowList{}
	var err error
	allowFor["CN=ci-runner"], err = endpoint.ParseRules([]string{"tcp:" + private, "tcp:" + denied}, []string{"tcp:" + denied})
	require.NoError(t, err)
	srv := testutil.StartServer(t, testutil.ServerOptions{NoAuth: true, Allow: []string{"tcp:" + common}, Mutate: func(c *server.Config) {
		c.TLS.ClientAuth, c.TLS.ClientCAs = tls.RequireAndVerifyClientCert, pool
		c.AllowFor = allowFor
		c.AuditLog = true
	}})
	client := func(cn, token string) *testutil.Client {
		cert := issue(cn)
		return testutil.StartClient(t, srv, testutil.ClientOptions{Token: token, NoAuth: true, WaitReady: true,
			TLS: func(o *transport.ClientTLSOptions) { o.ClientCert = &cert }})
	}
	ci := client("ci-runner", "tcp:"+private)
	live := dial(t, ci.Addr)
	echoMsg(t, live, "ci-runner reaches its own destination")
	require.Eventually(t, func() bool { return len(srv.Server.Registry().List(time.Now())) == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "CN=ci-runner", srv.Server.Registry().List(time.Now())[0].ClientIdentity, "/tunnels shows who")
	var subjects []string
	for _, c := range srv.ConnStats() {
		subjects = append(subjects, c.ClientSubject)
	}
	assert.Contains(t, subjects, "CN=ci-runner,O=quictun tests", "/connections shows the certificate subject")

	echoCheck(t, dial(t, client("ci-runner", "tcp:"+common).Addr), 1000)
	echoCheck(t, dial(t, client("someone", "tcp:"+common).Addr), 1000)
	expectRefusedBy(t, srv, client("someone", "tcp:"+private), endpoint.ReasonNotAllowed)
	expectRefusedBy(t, srv, client("ci-runner", "tcp:"+denied), endpoint.ReasonDenied)
	echoMsg(t, live, "still open")
}

// expectRefusedBy checks that cl's tunnel is refused for reason.
func expectRefusedBy(t *testing.T, srv *testutil.Server, cl *testutil.Client, reason string) {
	t.Helper()
	before := promtest.ToFloat64(srv.Metrics.RefusedTotal.WithLabelValues("tcp", reason))
	refusedRead(t, cl.Addr)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.RefusedTotal.WithLabelValues("tcp", reason)) == before+1
	}, 5*time.Second, 10*time.Millisecond, "want refused (%s)", reason)
}

// TestAllowForClientCertificateOn0RTT: a 0-RTT stream of a resumed mutual-TLS
// session is matched by its certificate's identity too (the session ticket
// carries the certificate), without waiting for the handshake. The server's
// TLS config is the binary's (transport.ServerTLSConfigFor with reloadable
// client CAs, a config per handshake), so 0-RTT works through it.
func TestAllowForClientCertificateOn0RTT(t *testing.T) {
	private := testutil.EchoServer(t)
	pool, issue := testutil.ClientCA(t)
	allowFor, err := endpoint.ParseRules([]string{"tcp:" + private}, nil)
	require.NoError(t, err)
	stateDir := t.TempDir()
	opts := func(addr string) testutil.ServerOptions {
		return testutil.ServerOptions{NoAuth: true, Addr: addr, StateDir: stateDir, Allow: []string{"tcp:127.0.0.2:1"}, Mutate: func(c *server.Config) {
			st, err := transport.LoadOrCreateState(stateDir, "", "")
			require.NoError(t, err)
			c.TLS = transport.ServerTLSConfigFor(transport.NewServerCertificate(st.Cert), st.TicketKey, transport.NewClientCAs(pool))
			c.AllowFor = map[string]*endpoint.AllowList{"CN=ci-runner": allowFor}
			c.DrainTimeout = 0
		}}
	}
	srv := testutil.StartServer(t, opts(""))
	cert := issue("ci-runner")
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + private, NoAuth: true, WaitReady: true,
		TLS: func(o *transport.ClientTLSOptions) { o.ClientCert = &cert }})
	echoCheck(t, dial(t, cl.Addr), 100) // the server sends a session ticket after the handshake
	srv.Stop(t)
	require.Eventually(t, func() bool { return !cl.Client.Ready() }, 5*time.Second, 5*time.Millisecond)
	c := dial(t, cl.Addr) // waits for the session
	srv2 := testutil.StartServer(t, opts(srv.Addr))
	echoMsg(t, c, "first bytes as 0-RTT data")
	require.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("ok_0rtt")) == 1 },
		5*time.Second, 5*time.Millisecond, "the reconnect must resume with 0-RTT")
	assert.Zero(t, promtest.ToFloat64(srv2.Metrics.RefusedTotal.WithLabelValues("tcp", endpoint.ReasonNotAllowed)))
}
