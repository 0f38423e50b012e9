package integration

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/transport"
)

// logLines is a logger at -v verbosity (0 unless set) that keeps every
// line it is given.
type logLines struct {
	verbosity int
	mu        sync.Mutex
	lines     []string
}

// failureLog returns a logLines at -v verbosity whose lines the test logs,
// under what, if it fails: what a daemon saw, for a failure whose
// assertion printed none of it.
func failureLog(t *testing.T, verbosity int, what string) *logLines {
	t.Helper()
	l := &logLines{verbosity: verbosity}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s log:\n%s", what, l)
		}
	})
	return l
}

func (l *logLines) logger() *klog.Logger {
	lg := funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
	}, funcr.Options{Verbosity: l.verbosity})
	return &lg
}

// count returns how many lines contain every one of subs.
func (l *logLines) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
next:
	for _, line := range l.lines {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		n++
	}
	return n
}

// first returns the first line that contains none of skip ("" when none).
func (l *logLines) first(skip ...string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
next:
	for _, line := range l.lines {
		for _, s := range skip {
			if strings.Contains(line, s) {
				continue next
			}
		}
		return line
	}
	return ""
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// TestWrongFingerprintLoggedAtDefaultVerbosity: a client pinning another
// certificate says so at -v 0, with the fix, once however often it retries,
// and never logs that it connected.
func TestWrongFingerprintLoggedAtDefaultVerbosity(t *testing.T) {
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	other := testutil.StartServer(t, testutil.ServerOptions{}) // a different identity
	var logs logLines
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{
		Token: "tcp:" + echo, Fingerprint: other.State.Fingerprint(), Logger: logs.logger(),
		Mutate: func(c *client.Config) { c.SessionWait = 300 * time.Millisecond },
	})
	fix := "presented a certificate that no pin for it accepts: run 'quictun-server fingerprint' on that host"
	require.Eventually(t, func() bool { return logs.count("Could not connect to server", fix) == 1 },
		10*time.Second, 10*time.Millisecond, "logs: %s", &logs)
	require.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("cert_rejected")) >= 3 },
		10*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1, logs.count("Could not connect to server"), "the same failure is logged once at -v 0: %s", &logs)
	assert.Zero(t, logs.count("Connected to server"))
	assert.False(t, cl.Client.Ready())
}

// TestConnectedLoggedOnceAndRefusedCredentialsNotReady: the first connection is logged
// at -v 0; a client whose secret the server refuses learns it from its hello,
// before any application connects: it logs an error with the fix and is
// never ready, and becomes ready once its secret is fixed (a reload).
func TestConnectedLoggedOnceAndRefusedCredentialsNotReady(t *testing.T) {
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	var good logLines
	testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Logger: good.logger(), WaitReady: true})
	require.Eventually(t, func() bool { return good.count("Connected to server") == 1 }, 5*time.Second, 10*time.Millisecond)

	var bad logLines
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: []byte("not-the-right-secret-at-all"),
		Logger: bad.logger()})
	fix := "same secret as the server's --secret-file"
	// No application connects: the hello alone brings the refusal.
	deadline := time.Now().Add(10 * time.Second)
	for bad.count("Server rejected our credentials", fix) == 0 {
		require.False(t, cl.Client.Ready(), "never ready with a wrong secret: %s", &bad)
		require.Zero(t, promtest.ToFloat64(cl.Metrics.AcceptedTotal))
		require.True(t, time.Now().Before(deadline), "no refusal logged without an application: %s", &bad)
		time.Sleep(time.Millisecond) // polls Ready at every moment, from the start
	}
	require.Never(t, cl.Client.Ready, 500*time.Millisecond, 5*time.Millisecond, "/readyz false while the server refuses our credentials")
	assert.GreaterOrEqual(t, promtest.ToFloat64(srv.Metrics.AuthFailuresTotal.WithLabelValues(egress.AuthUnknownKey)), 1.0,
		"the server refused the hello's key")

	cl.SetSecret(testutil.Secret) // the fix, as a reload gives it
	require.Eventually(t, cl.Client.Ready, 5*time.Second, 5*time.Millisecond, "ready once the server accepts the new secret")
	require.NoError(t, echoOK(cl.Addr))
}

// refusingServer runs a QUIC server with quictun's TLS identity that resets
// every stream with code, as older servers answer what they cannot read.
func refusingServer(t *testing.T, code proto.Code) *testutil.Server {
	t.Helper()
	st, err := transport.LoadOrCreateState(t.TempDir(), "", "")
	require.NoError(t, err)
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	tr := &quic.Transport{Conn: pc}
	ln, err := tr.Listen(transport.ServerTLSConfig(st, nil), transport.QUICConfig(transport.DefaultQUICOptions()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		_ = ln.Close()
		wg.Wait()
		_ = tr.Close()
		_ = pc.Close()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			wg.Go(func() {
				for {
					s, err := c.AcceptStream(ctx)
					if err != nil {
						return
					}
					s.CancelRead(code.StreamErrorCode())
					s.CancelWrite(code.StreamErrorCode())
				}
			})
		}
	})
	return &testutil.Server{Addr: pc.LocalAddr().String(), State: st}
}

// TestOldServerRefusingHeaderLoggedOnce: a server that cannot read our
// stream header (one from before key IDs answers bad_header) makes the
// client say at -v 0, once, to upgrade the server. Its answer to the hello
// tells nothing, so the client is ready once connected, as before the hello.
func TestOldServerRefusingHeaderLoggedOnce(t *testing.T) {
	var logs logLines
	cl := testutil.StartClient(t, refusingServer(t, proto.CodeBadHeader),
		testutil.ClientOptions{Token: "tcp:127.0.0.1:1", Logger: logs.logger(), WaitReady: true})
	for range 3 {
		refusedRead(t, cl.Addr)
	}
	require.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.StreamsTotal.WithLabelValues("bad_header")) == 3 },
		5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1, logs.count("could not read our stream header", "upgrade it"), logs.String())
}

// TestHelloAnswers: how the client reads the answers to its hello of servers
// that do not know it. A server that knows stream kinds but not the hello
// verifies the MAC before it refuses the kind with unsupported: our
// credentials are good, the client is ready. auth_failed is a refusal: not
// ready. (bad_header: TestOldServerRefusingHeaderLoggedOnce.)
func TestHelloAnswers(t *testing.T) {
	for _, tc := range []struct {
		code  proto.Code
		ready bool
	}{
		{proto.CodeUnsupported, true},
		{proto.CodeAuthFailed, false},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			cl := testutil.StartClient(t, refusingServer(t, tc.code), testutil.ClientOptions{Token: "tcp:127.0.0.1:1"})
			if tc.ready {
				require.Eventually(t, cl.Client.Ready, 10*time.Second, 5*time.Millisecond)
				return
			}
			require.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.DialsTotal.WithLabelValues("ok")) >= 1 },
				10*time.Second, 5*time.Millisecond)
			require.Never(t, cl.Client.Ready, 500*time.Millisecond, 5*time.Millisecond)
		})
	}
}

// TestRefusedCredentialsLoggedOnce: a client with a wrong secret reconnects
// again and again (each hello is refused), but its default log says the
// refusal once, not at every retry, and never "Connected": that line waits
// for the server to accept our hello, so the first line is the refusal,
// with its fix. Once the secret is fixed it says once that the server
// accepted it, and that it is connected.
func TestRefusedCredentialsLoggedOnce(t *testing.T) {
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	var logs logLines
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: []byte("not-the-right-secret-at-all"),
		Logger: logs.logger(), Mutate: func(c *client.Config) { c.Backoff.Max = 50 * time.Millisecond }})
	require.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.ReconnectsTotal) >= 4 }, 10*time.Second, 5*time.Millisecond,
		"the client reconnects after each refusal")
	refusedRead(t, cl.Addr) // an application's attempt is refused too
	require.Eventually(t, func() bool { return promtest.ToFloat64(cl.Metrics.ReconnectsTotal) >= 6 }, 10*time.Second, 5*time.Millisecond)
	fix := "same secret as the server's --secret-file"
	assert.Equal(t, 1, logs.count("Server rejected our credentials", fix), "logs: %s", &logs)
	assert.Zero(t, logs.count("Connected to server"), "not connected while the server refuses our hello: %s", &logs)
	assert.Zero(t, logs.count("Reconnected to server"), "logs: %s", &logs)
	assert.Zero(t, logs.count("Server accepted our credentials"))
	first := logs.first("Listening for local connections") // the start-up line, the same for every client
	assert.Contains(t, first, fix, "the first line names the fix: %s", &logs)

	cl.SetSecret(testutil.Secret)
	require.Eventually(t, cl.Client.Ready, 5*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return logs.count("Server accepted our credentials") == 1 }, 5*time.Second, 5*time.Millisecond,
		"the recovery is logged: %s", &logs)
	require.NoError(t, echoOK(cl.Addr))
	assert.Equal(t, 1, logs.count("Server rejected our credentials"), "logs: %s", &logs)
	require.Eventually(t, func() bool { return logs.count("Connected to server") == 1 }, 5*time.Second, 5*time.Millisecond,
		"connected once the server accepts our hello: %s", &logs)
}

// TestOldServerRefusingUDPFlowLoggedOnce: UDP flows to a server that cannot
// read a header with a stream kind (bad_header, before kinds) or does not
// serve UDP (unsupported) make the client say at -v 0, once, to upgrade the
// server, as for TCP.
func TestOldServerRefusingUDPFlowLoggedOnce(t *testing.T) {
	for _, code := range []proto.Code{proto.CodeBadHeader, proto.CodeUnsupported} {
		t.Run(code.String(), func(t *testing.T) {
			srv := refusingServer(t, code)
			uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			require.NoError(t, err)
			ts, err := token.NewSource(token.PluginFixed, "udp:127.0.0.1:1", nil)
			require.NoError(t, err)
			var logs logLines
			cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:1", Logger: logs.logger(), WaitReady: true,
				Mutate: func(cfg *client.Config) { cfg.Forwards = []client.Forward{{Packet: uc, Tokens: ts}} }})
			for range 3 { // three application sockets: three flows
				app, err := net.DialUDP("udp", nil, uc.LocalAddr().(*net.UDPAddr))
				require.NoError(t, err)
				t.Cleanup(func() { _ = app.Close() })
				_, err = app.Write([]byte("x"))
				require.NoError(t, err)
			}
			require.Eventually(t, func() bool {
				return promtest.ToFloat64(cl.Metrics.UDP.FlowsTotal.WithLabelValues(code.String())) == 3
			}, 5*time.Second, 10*time.Millisecond)
			assert.Equal(t, 1, logs.count("cannot carry UDP flows", "upgrade it"), logs.String())
		})
	}
}
