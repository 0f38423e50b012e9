package e2e

import (
	"crypto/rand"
	"encoding/base64"
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
	"github.com/quictun/quictun/pkg/transport"
)

// TestReloadOnSIGHUP: the built server takes new --allow rules and a new
// secret from its config and secret files on SIGHUP, without dropping an
// open tunnel for new rules (one of the replaced secret is reset,
// --cut-removed-keys); a broken config is refused as a whole and the old
// rules keep running; the client takes the new secret on its own SIGHUP.
func TestReloadOnSIGHUP(t *testing.T) {
	checkLeaks(t)
	a, b := testutil.EchoServer(t), testutil.EchoServer(t)
	cfg := writeFile(t, "server.yaml", "allow: [tcp:"+a+"]\n")
	srv := startServer(t, serverOpts{Args: []string{"--config", cfg}})
	toA := startClient(t, srv, clientOpts{Token: "tcp:" + a})
	toB := startClient(t, srv, clientOpts{Token: "tcp:" + b})

	live := dialApp(t, toA.Addr)
	require.NoError(t, roundTrip(live, "before"))
	require.Error(t, echoVia(t, toB.Addr, "refused before the reload"))
	// toB's destination check when it connected, and its tunnel.
	waitMetric(t, srv, ioTimeout, eq(2), "quictun_server_refused_destinations_total", "network", "tcp", "reason", "not_allowed")

	// New rules: b allowed, a no longer.
	require.NoError(t, os.WriteFile(cfg, []byte("allow: [tcp:"+b+"]\n"), 0o600))
	srv.signal(t, syscall.SIGHUP)
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_config_reloads_total", "result", "success")
	require.NoError(t, echoVia(t, toB.Addr, "allowed after the reload"))
	require.Error(t, echoVia(t, toA.Addr, "refused after the reload"))
	require.NoError(t, roundTrip(live, "the open tunnel to a keeps running"), "an open tunnel must survive a reload")
	assert.Contains(t, srv.log(), `allowAdded=["tcp:`+b+`"]`)

	// A broken config changes nothing.
	require.NoError(t, os.WriteFile(cfg, []byte("allow: [tcp:"+b+"\n"), 0o600))
	srv.signal(t, syscall.SIGHUP)
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_config_reloads_total", "result", "failure")
	assert.Equal(t, 0.0, scrape(t, srv).val("quictun_server_config_last_reload_successful"))
	require.NoError(t, echoVia(t, toB.Addr, "still allowed"))
	waitFor(t, ioTimeout, "the failure logged with the fix", func() bool {
		return strings.Contains(srv.log(), "Configuration reload failed; still running the previous configuration")
	})

	// A change that needs a restart is reported, the rest applied.
	require.NoError(t, os.WriteFile(cfg, []byte("allow: [tcp:"+b+"]\nmax-connections: 7\n"), 0o600))
	srv.signal(t, syscall.SIGHUP)
	waitMetric(t, srv, ioTimeout, eq(2), "quictun_server_config_reloads_total", "result", "success")
	waitFor(t, ioTimeout, "needsRestart logged", func() bool { return strings.Contains(srv.log(), `needsRestart=["max-connections"]`) })

	// Secret rotation: both ends read the same secret file here.
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	require.NoError(t, os.WriteFile(srv.SecretFile, []byte(base64.StdEncoding.EncodeToString(k)+"\n"), 0o600))
	srv.signal(t, syscall.SIGHUP)
	waitMetric(t, srv, ioTimeout, eq(3), "quictun_server_config_reloads_total", "result", "success")
	require.Error(t, echoVia(t, toB.Addr, "old secret refused"))
	waitMetric(t, srv, ioTimeout, ge(1), "quictun_server_streams_total", "result", "auth_failed")
	toB.signal(t, syscall.SIGHUP)
	waitMetric(t, toB, ioTimeout, eq(1), "quictun_client_config_reloads_total", "result", "success")
	waitFor(t, 10*time.Second, "the client tunnels with the new secret", func() bool {
		return echoVia(t, toB.Addr, "new secret") == nil
	})
	// The open tunnel was made with the replaced secret: --cut-removed-keys
	// (the default) reset it at that reload.
	_ = live.SetReadDeadline(time.Now().Add(ioTimeout))
	_, err := live.Read(make([]byte, 1))
	require.True(t, isReset(err), "the replaced secret's open tunnel is reset, got %v", err)
}

// TestKeyRotationWithKeysFile rotates a shared secret without downtime on the
// built binaries: the server's --keys-file gains the new key (reload), a
// client moves to it, the old key is removed (reload); a client still on the
// old key is then refused with unknown_key, and logs name the keys.
func TestKeyRotationWithKeysFile(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	secret := func() string {
		k := make([]byte, 32)
		_, _ = rand.Read(k)
		return base64.StdEncoding.EncodeToString(k)
	}
	oldKey, newKey := secret(), secret()
	keys := writeFile(t, "keys", "v1 "+oldKey+"\n")
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: []string{"--keys-file", keys}})
	onOld := startClient(t, srv, clientOpts{Token: "tcp:" + echo, SecretFile: writeFile(t, "old", oldKey+"\n")})
	require.NoError(t, echoVia(t, onOld.Addr, "old key"))
	waitFor(t, ioTimeout, "the audit line with the key's name", func() bool {
		return strings.Contains(srv.log(), `"Closed tunnel"`) && strings.Contains(srv.log(), `identity="key=v1" destination="tcp:`+echo+`" result="ok" bytesUpstream=7 bytesDownstream=7`)
	})

	require.NoError(t, os.WriteFile(keys, []byte("v1 "+oldKey+"\nv2 "+newKey+"\n"), 0o600))
	srv.signal(t, syscall.SIGHUP)
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_config_reloads_total", "result", "success")
	waitFor(t, ioTimeout, "keysAdded logged", func() bool { return strings.Contains(srv.log(), `keysAdded=["v2 (`) })
	onNew := startClient(t, srv, clientOpts{Token: "tcp:" + echo, SecretFile: writeFile(t, "new", newKey+"\n")})
	require.NoError(t, echoVia(t, onNew.Addr, "new key"))
	require.NoError(t, echoVia(t, onOld.Addr, "old key still accepted"))

	require.NoError(t, os.WriteFile(keys, []byte("v2 "+newKey+"\n"), 0o600))
	srv.signal(t, syscall.SIGHUP)
	waitMetric(t, srv, ioTimeout, eq(2), "quictun_server_config_reloads_total", "result", "success")
	require.Error(t, echoVia(t, onOld.Addr, "old key removed"))
	// At least 1: the refused client reconnects and its hellos with the old
	// key count too (integration TestKeyRotation).
	waitMetric(t, srv, ioTimeout, ge(1), "quictun_server_auth_failures_total", "reason", "unknown_key")
	require.NoError(t, echoVia(t, onNew.Addr, "new key"))
	assert.Zero(t, scrape(t, srv).val("quictun_server_auth_failures_total", "reason", "bad_mac"))
}

// TestRemovedKeyCutsOpenTunnels (issue 21 item 7): removing a key from
// --keys-file and reloading (the built server, a real SIGHUP) resets the
// open tunnels of that key with auth_failed, the default of
// --cut-removed-keys: a revoked key keeps no access. Tunnels of the other
// key keep running.
func TestRemovedKeyCutsOpenTunnels(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	oldKey, newKey := randomSecret(), randomSecret()
	keys := writeFile(t, "keys", "v1 "+oldKey+"\nv2 "+newKey+"\n")
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: []string{"--keys-file", keys}})
	onOld := startClient(t, srv, clientOpts{Token: "tcp:" + echo, SecretFile: writeFile(t, "old", oldKey+"\n")})
	onNew := startClient(t, srv, clientOpts{Token: "tcp:" + echo, SecretFile: writeFile(t, "new", newKey+"\n")})
	oldLive, newLive := dialApp(t, onOld.Addr), dialApp(t, onNew.Addr)
	require.NoError(t, roundTrip(oldLive, "old key"))
	require.NoError(t, roundTrip(newLive, "new key"))

	require.NoError(t, os.WriteFile(keys, []byte("v2 "+newKey+"\n"), 0o600))
	srv.signal(t, syscall.SIGHUP)
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_config_reloads_total", "result", "success")
	_ = oldLive.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := oldLive.Read(make([]byte, 1))
	require.Error(t, err)
	require.True(t, isReset(err), "the removed key's open tunnel must be reset, got %v", err)
	waitFor(t, ioTimeout, "the cut tunnel's audit line", func() bool {
		return strings.Contains(srv.log(), `identity="key=v1" destination="tcp:`+echo+`" result="auth_failed"`)
	})
	assert.Contains(t, srv.log(), `cutRemovedKeys=true`)
	require.NoError(t, roundTrip(newLive, "the other key's tunnel keeps running"))
}

// TestAuditLogSwitch: --audit-log=false leaves out the per-tunnel line.
func TestAuditLogSwitch(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: []string{"--audit-log=false"}})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo})
	require.NoError(t, echoVia(t, cl.Addr, "not audited"))
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_streams_total", "result", "ok")
	assert.NotContains(t, srv.log(), "Closed tunnel")
}

// TestForwards: one client carries several forwards (each its own local
// listener and destination) over one QUIC connection; /tunnels shows each
// tunnel's destination.
func TestForwards(t *testing.T) {
	checkLeaks(t)
	a, b := testutil.EchoServer(t), testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + a, "tcp:" + b}})
	pa, pb := testutil.FreeAddr(t, "tcp"), testutil.FreeAddr(t, "tcp")
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + a, Args: []string{
		"--forward", "tcp:" + pa + "=tcp:" + a, "--forward", "tcp:" + pb + "=tcp:" + b,
	}})
	ca, cb := dialApp(t, pa), dialApp(t, pb)
	require.NoError(t, roundTrip(ca, "to a"))
	require.NoError(t, roundTrip(cb, "to b"))
	code, body := httpDo(http.MethodGet, cl.AdminURL+"/tunnels")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"serverAppAddr": "tcp:`+a+`"`)
	assert.Contains(t, body, `"serverAppAddr": "tcp:`+b+`"`)
	require.NoError(t, echoVia(t, cl.Addr, "the single-forward form still works"))
	assert.Equal(t, 1.0, scrape(t, srv).val("quictun_server_active_connections"), "all forwards share one QUIC connection")
	_ = ca.Close()
	_ = cb.Close()

	// The same as a YAML list in a --config file.
	pc, pd := testutil.FreeAddr(t, "tcp"), testutil.FreeAddr(t, "tcp")
	file := writeFile(t, "client.yaml", "forward:\n  - tcp:"+pc+"=tcp:"+a+"\n  - tcp:"+pd+"=tcp:"+b+"\n")
	startClient(t, srv, clientOpts{Token: "tcp:" + a, Args: []string{"--config", file}})
	cc, cd := dialApp(t, pc), dialApp(t, pd)
	require.NoError(t, roundTrip(cc, "to a, from the YAML list"))
	require.NoError(t, roundTrip(cd, "to b, from the YAML list"))
	_ = cc.Close()
	_ = cd.Close()
}

// replaceFile writes content to path through a rename, as an operator's
// tooling (or certbot) should, so a reader never sees half a file.
func replaceFile(t *testing.T, path string, content []byte) {
	t.Helper()
	tmp := path + ".new"
	require.NoError(t, os.WriteFile(tmp, content, 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// TestServerCertificateRotation rotates the server's certificate without
// restarting a client, on the built binaries (SECURITY.md, "Rotating the
// server certificate"): a client pinned to OLD is reloaded to OLD,NEW and
// keeps its open tunnel; the server's state dir gets the NEW certificate and
// the server reloads it, the tunnel still open; a new client pinning only NEW
// connects and verifies it; the reloaded client verifies NEW on its next
// connection (the server restarted to force one) and is reloaded to NEW alone.
func TestServerCertificateRotation(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}})
	oldFP := srv.Fingerprint
	newDir := filepath.Join(t.TempDir(), "new-state")
	newFP := strings.TrimSpace(run(t, nil, bins.server, "fingerprint", "--state-dir", newDir).stdout)
	require.NotEqual(t, oldFP, newFP)

	cfg := writeFile(t, "client.yaml", "server-fingerprint: ["+oldFP+"]\n")
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Fingerprint: "-", Args: []string{"--config", cfg}})
	live := dialApp(t, cl.Addr)
	require.NoError(t, roundTrip(live, "before"))

	// 1. The client accepts both certificates.
	require.NoError(t, os.WriteFile(cfg, []byte("server-fingerprint: ["+oldFP+", "+newFP+"]\n"), 0o600))
	cl.signal(t, syscall.SIGHUP)
	waitMetric(t, cl, ioTimeout, eq(1), "quictun_client_config_reloads_total", "result", "success")
	waitFor(t, ioTimeout, "the added pin logged", func() bool {
		return strings.Contains(cl.log(), `serverFingerprintsAdded=["`+newFP+`"]`)
	})
	assert.NotContains(t, cl.log(), "needsRestart")
	require.NoError(t, roundTrip(live, "the open tunnel after the client's reload"))

	// 2. The server presents the new certificate: its files are replaced in
	// the state dir, then a reload.
	for _, f := range []string{transport.KeyFileName, transport.CertFileName} {
		b, err := os.ReadFile(filepath.Join(newDir, f))
		require.NoError(t, err)
		replaceFile(t, filepath.Join(srv.StateDir, f), b)
	}
	srv.signal(t, syscall.SIGHUP)
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_config_reloads_total", "result", "success")
	waitFor(t, ioTimeout, "the new certificate logged", func() bool {
		return strings.Contains(srv.log(), `"Replaced the server certificate; new connections get the new one, open ones keep theirs" fingerprint="`+newFP+`"`)
	})
	require.NoError(t, roundTrip(live, "the open tunnel after the server's reload"))
	require.NoError(t, echoVia(t, cl.Addr, "a new tunnel of the reloaded client"))
	assert.Equal(t, newFP, strings.TrimSpace(run(t, nil, bins.server, "fingerprint", "--state-dir", srv.StateDir).stdout))

	// 3. A new client that pins only the new certificate connects.
	fresh := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Fingerprint: newFP})
	require.NoError(t, echoVia(t, fresh.Addr, "a client pinning NEW"))
	assert.Contains(t, fresh.log(), `serverFingerprint="`+newFP+`"`)

	// 4. The reloaded client's next connection verifies the new certificate
	// (a full handshake: its tickets are kept per pin set).
	require.NoError(t, live.CloseWrite())
	srv.signal(t, syscall.SIGTERM)
	waitFor(t, 30*time.Second, "the server stopped", srv.exited)
	srv2 := startServer(t, serverOpts{StateDir: srv.StateDir, SecretFile: srv.SecretFile, UDPPort: srv.udpPort, AdminPort: srv.adminPort,
		Allow: []string{"tcp:" + echo}})
	require.Equal(t, newFP, srv2.Fingerprint)
	cl.waitReady(t)
	waitFor(t, ioTimeout, "the client reconnected to NEW", func() bool {
		return strings.Contains(cl.log(), `serverFingerprint="`+newFP+`"`)
	})
	require.NoError(t, echoVia(t, cl.Addr, "after the reconnect"))

	// 5. The old certificate is dropped from the client.
	require.NoError(t, os.WriteFile(cfg, []byte("server-fingerprint: ["+newFP+"]\n"), 0o600))
	cl.signal(t, syscall.SIGHUP)
	waitMetric(t, cl, ioTimeout, eq(2), "quictun_client_config_reloads_total", "result", "success")
	waitFor(t, ioTimeout, "the removed pin logged", func() bool {
		return strings.Contains(cl.log(), `serverFingerprintsRemoved=["`+oldFP+`"]`)
	})
	require.NoError(t, echoVia(t, cl.Addr, "pinning NEW alone"))
}

// TestServerCertificateReloadRefusesBrokenFiles: a --cert-file that does not
// load fails the reload as a whole; the server keeps presenting the
// certificate it had.
func TestServerCertificateReloadRefusesBrokenFiles(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	src := filepath.Join(t.TempDir(), "src")
	fp := strings.TrimSpace(run(t, nil, bins.server, "fingerprint", "--state-dir", src).stdout)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for from, to := range map[string]string{transport.CertFileName: certFile, transport.KeyFileName: keyFile} {
		b, err := os.ReadFile(filepath.Join(src, from))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(to, b, 0o600))
	}
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}, Args: []string{"--cert-file", certFile, "--key-file", keyFile}})

	replaceFile(t, certFile, []byte("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n"))
	srv.signal(t, syscall.SIGHUP)
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_config_reloads_total", "result", "failure")
	waitFor(t, ioTimeout, "the failure logged", func() bool {
		return strings.Contains(srv.log(), "Configuration reload failed") && strings.Contains(srv.log(), "server certificate")
	})
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Fingerprint: fp})
	require.NoError(t, echoVia(t, cl.Addr, "the certificate it had"))
}
