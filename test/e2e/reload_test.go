package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// TestReloadOnSIGHUP: the built server takes new --allow rules and a new
// secret from its config and secret files on SIGHUP, without dropping an
// open tunnel; a broken config is refused as a whole and the old rules keep
// running; the client takes the new secret on its own SIGHUP.
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
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_refused_destinations_total", "network", "tcp", "reason", "not_allowed")

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
	require.NoError(t, live.CloseWrite())
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
	waitMetric(t, srv, ioTimeout, eq(1), "quictun_server_auth_failures_total", "reason", "unknown_key")
	require.NoError(t, echoVia(t, onNew.Addr, "new key"))
	assert.Zero(t, scrape(t, srv).val("quictun_server_auth_failures_total", "reason", "bad_mac"))
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
}
