package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// randomSecret is a fresh 32-byte base64 secret.
func randomSecret() string {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return base64.StdEncoding.EncodeToString(k)
}

// TestAllowForKeyWithKeysFile: on the built server, --allow-for
// key=NAME=RULE lets only the clients holding that --keys-file key reach a
// destination (the audit line names the key), and a reload that moves the
// rule to another key applies to new tunnels while an open one keeps running.
func TestAllowForKeyWithKeysFile(t *testing.T) {
	checkLeaks(t)
	common, private := testutil.EchoServer(t), testutil.EchoServer(t)
	aliceKey, bobKey := randomSecret(), randomSecret()
	keys := writeFile(t, "keys", "alice "+aliceKey+"\nbob "+bobKey+"\n")
	cfg := writeFile(t, "server.yaml", "allow: [tcp:"+common+"]\nallow-for: [key=alice=tcp:"+private+"]\n")
	srv := startServer(t, serverOpts{Args: []string{"--config", cfg, "--keys-file", keys}})
	aliceSecret, bobSecret := writeFile(t, "alice", aliceKey+"\n"), writeFile(t, "bob", bobKey+"\n")
	alice := startClient(t, srv, clientOpts{Token: "tcp:" + private, SecretFile: aliceSecret})
	bob := startClient(t, srv, clientOpts{Token: "tcp:" + private, SecretFile: bobSecret})
	bobCommon := startClient(t, srv, clientOpts{Token: "tcp:" + common, SecretFile: bobSecret})

	live := dialApp(t, alice.Addr)
	require.NoError(t, roundTrip(live, "alice reaches the destination of her key"))
	require.Error(t, echoVia(t, bob.Addr, "bob does not"))
	// bob's destination check when he connected, and his tunnel.
	waitMetric(t, srv, ioTimeout, eq(2), "quictun_server_refused_destinations_total", "network", "tcp", "reason", "not_allowed")
	require.NoError(t, echoVia(t, bobCommon.Addr, "bob reaches what --allow gives everyone"))
	waitFor(t, ioTimeout, "audit lines naming each key", func() bool {
		l := srv.log()
		return strings.Contains(l, `identity="key=bob" destination="tcp:`+private+`" result="refused"`) &&
			strings.Contains(l, `identity="key=bob" destination="tcp:`+common+`" result="ok"`)
	})

	// The rule moves from alice to bob.
	require.NoError(t, os.WriteFile(cfg, []byte("allow: [tcp:"+common+"]\nallow-for: [key=bob=tcp:"+private+"]\n"), 0o600))
	srv.signal(t, syscall.SIGHUP)
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_config_reloads_total", "result", "success")
	waitFor(t, ioTimeout, "the change logged", func() bool {
		return strings.Contains(srv.log(), `allowForAdded=["key=bob=tcp:`+private+`"] allowForRemoved=["key=alice=tcp:`+private+`"]`)
	})
	require.NoError(t, echoVia(t, bob.Addr, "bob now reaches it"))
	require.Error(t, echoVia(t, alice.Addr, "a new tunnel of alice is refused"))
	waitMetric(t, srv, ioTimeout, eq(3), "quictun_server_refused_destinations_total", "network", "tcp", "reason", "not_allowed")
	require.NoError(t, roundTrip(live, "alice's open tunnel keeps running"))
	require.NoError(t, live.CloseWrite())
}

// TestClientCertificateIdentity: with --client-ca-file, the built server
// logs each connection's certificate subject ("Authenticated client
// certificate" at -v 2) and shows it in the admin API's JSON: clientSubject
// in /connections, clientIdentity in /tunnels.
func TestClientCertificateIdentity(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	caFile, issue := testutil.ClientCAFiles(t)
	cert, key := issue("ci-runner")
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: []string{"--client-ca-file", caFile}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: []string{"--cert-file", cert, "--key-file", key}})
	const subject = "CN=ci-runner,O=quictun tests"
	waitFor(t, ioTimeout, "the per-connection line", func() bool {
		return strings.Contains(srv.log(), `"Authenticated client certificate" connID=`) &&
			strings.Contains(srv.log(), `clientSubject="`+subject+`"`)
	})

	live := dialApp(t, cl.Addr)
	require.NoError(t, roundTrip(live, "open"))
	code, body := httpDo(http.MethodGet, srv.AdminURL+"/connections")
	require.Equal(t, http.StatusOK, code, body)
	var conns []struct {
		ID            string `json:"id"`
		ClientSubject string `json:"clientSubject"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &conns), body)
	require.Len(t, conns, 1, body)
	assert.Equal(t, subject, conns[0].ClientSubject)

	code, body = httpDo(http.MethodGet, srv.AdminURL+"/tunnels")
	require.Equal(t, http.StatusOK, code, body)
	var tunnels []struct {
		ServerAppAddr  string `json:"serverAppAddr"`
		ClientIdentity string `json:"clientIdentity"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &tunnels), body)
	require.Len(t, tunnels, 1, body)
	assert.Equal(t, "tcp:"+echo, tunnels[0].ServerAppAddr)
	assert.Contains(t, strings.Split(tunnels[0].ClientIdentity, ","), "CN=ci-runner", "the certificate's identity, beside the key's")
	require.NoError(t, live.CloseWrite())
}

// TestClientCertificateReload: the built client reads its --cert-file and
// --key-file again on SIGHUP; its next connection presents the new
// certificate in a full handshake (its session tickets are kept per client
// certificate: a resumed session would show the server the old one).
func TestClientCertificateReload(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	caFile, issue := testutil.ClientCAFiles(t)
	certA, keyA := issue("runner-a")
	certB, keyB := issue("runner-b")
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	copyFile := func(from, to string) {
		b, err := os.ReadFile(from)
		require.NoError(t, err)
		replaceFile(t, to, b)
	}
	copyFile(certA, cert)
	copyFile(keyA, key)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: []string{"--client-ca-file", caFile}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: []string{"--cert-file", cert, "--key-file", key}})
	require.NoError(t, echoVia(t, cl.Addr, "as runner-a"))
	waitFor(t, ioTimeout, "runner-a authenticated", func() bool {
		return strings.Contains(srv.log(), `clientSubject="CN=runner-a,O=quictun tests"`)
	})

	copyFile(keyB, key)
	copyFile(certB, cert)
	cl.signal(t, syscall.SIGHUP)
	waitMetric(t, cl, ioTimeout, eq(1), "quictun_client_config_reloads_total", "result", "success")
	require.NoError(t, echoVia(t, cl.Addr, "the open connection keeps runner-a"))

	// A restart of the server makes the client connect again.
	srv.signal(t, syscall.SIGTERM)
	waitFor(t, 30*time.Second, "the server stopped", srv.exited)
	srv2 := startServer(t, serverOpts{StateDir: srv.StateDir, SecretFile: srv.SecretFile, UDPPort: srv.udpPort, AdminPort: srv.adminPort,
		Allow: []string{"tcp:" + echo}, Args: []string{"--client-ca-file", caFile}})
	cl.waitReady(t)
	require.NoError(t, echoVia(t, cl.Addr, "as runner-b"))
	waitFor(t, ioTimeout, "runner-b authenticated", func() bool {
		return strings.Contains(srv2.log(), `clientSubject="CN=runner-b,O=quictun tests"`)
	})
	assert.NotContains(t, srv2.log(), `clientSubject="CN=runner-a`)
}

// TestClientCAReload (issue 21 item 7): the built server reads
// --client-ca-file again on SIGHUP, as it does its certificate: a client
// whose certificate a new CA signed connects after the reload, and the open
// connection of a client of the old CA keeps running (new handshakes and
// resumptions need the new CAs: pkg/transport TestClientCAsReplaced).
func TestClientCAReload(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	caA, issueA := testutil.ClientCAFiles(t)
	caB, issueB := testutil.ClientCAFiles(t)
	certA, keyA := issueA("runner-a")
	certB, keyB := issueB("runner-b")
	caFile := filepath.Join(t.TempDir(), "client-ca.pem")
	copyTo := func(from, to string) {
		b, err := os.ReadFile(from)
		require.NoError(t, err)
		replaceFile(t, to, b)
	}
	copyTo(caA, caFile)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: []string{"--client-ca-file", caFile}})
	a := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: []string{"--cert-file", certA, "--key-file", keyA}})
	aLive := dialApp(t, a.Addr)
	require.NoError(t, roundTrip(aLive, "as runner-a"))
	b := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: []string{"--cert-file", certB, "--key-file", keyB}, NoWait: true})
	require.Error(t, echoVia(t, b.Addr, "CA B is not trusted yet"))

	copyTo(caB, caFile)
	srv.signal(t, syscall.SIGHUP)
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_config_reloads_total", "result", "success")
	waitFor(t, ioTimeout, "runner-b tunnels after the reload", func() bool { return echoVia(t, b.Addr, "as runner-b") == nil })
	assert.Contains(t, srv.log(), "Replaced the client CAs")
	require.NoError(t, roundTrip(aLive, "runner-a's open connection keeps running"))
}
