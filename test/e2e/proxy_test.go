package e2e

import (
	"bufio"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/proxy"

	"github.com/quictun/quictun/internal/testutil"
)

// connectVia sends an HTTP CONNECT for target through the proxy at addr,
// with a Proxy-Authorization: Basic header when user is not empty, and
// returns the response; on 200 it echoes a message through the tunnel.
func connectVia(t *testing.T, addr, target, user, password string) (*http.Response, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n"
	if user != "" {
		req += "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password)) + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		return nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return nil, err
	}
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		if _, err := io.WriteString(c, "ping"); err != nil {
			return nil, err
		}
		b := make([]byte, 4)
		if _, err := io.ReadFull(br, b); err != nil || string(b) != "ping" {
			return nil, io.ErrUnexpectedEOF
		}
	}
	return resp, nil
}

// socksVia echoes a message to target through the SOCKS5 proxy at addr,
// authenticating as user.
func socksVia(addr, target, user, password string) error {
	d, err := proxy.SOCKS5("tcp", addr, &proxy.Auth{User: user, Password: password}, proxy.Direct)
	if err != nil {
		return err
	}
	c, err := d.Dial("tcp", target)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	return echoOnce(c.(*net.TCPConn), "through socks5")
}

// TestProxyCredentials (issue 21 item 5): --proxy-credentials-file protects
// both proxy kinds, the HTTP CONNECT one with Proxy-Authorization: Basic (407
// without it); the start log says which proxies require credentials; SIGHUP
// re-reads the file (removed users stop working, new ones work, the reload
// is logged); a file that cannot be read keeps the credentials in force.
func TestProxyCredentials(t *testing.T) {
	checkLeaks(t)
	echo := testutil.EchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}})
	creds := writeFile(t, "proxy-credentials", "app:old-pass\n")
	socksAddr, httpAddr := testutil.FreeAddr(t, "tcp"), testutil.FreeAddr(t, "tcp")
	cl := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: []string{
		"--proxy", "socks5:" + socksAddr, "--proxy", "http-connect:" + httpAddr, "--proxy-credentials-file", creds,
	}})
	for _, want := range []string{
		`"Proxy entry point requires credentials" address="` + socksAddr + `" kind="socks5" users=1`,
		`"Proxy entry point requires credentials" address="` + httpAddr + `" kind="http-connect" users=1`,
	} {
		assertLogged(t, cl, want)
	}

	for _, tc := range []struct{ name, user, password string }{
		{"no credentials", "", ""}, {"wrong password", "app", "wrong"}, {"unknown user", "bob", "old-pass"},
	} {
		resp, err := connectVia(t, httpAddr, echo, tc.user, tc.password)
		if assert.NoError(t, err, tc.name) {
			assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode, tc.name)
			assert.Equal(t, `Basic realm="quictun"`, resp.Header.Get("Proxy-Authenticate"), tc.name)
		}
	}
	resp, err := connectVia(t, httpAddr, echo, "app", "old-pass")
	if assert.NoError(t, err) {
		assert.Equal(t, http.StatusOK, resp.StatusCode, "the right credentials")
	}
	assert.NoError(t, socksVia(socksAddr, echo, "app", "old-pass"))
	assert.Equal(t, 1.0, scrape(t, cl).val("quictun_client_proxy_auth_failures_total", "proxy", "http_connect", "reason", "missing"))
	assert.Equal(t, 2.0, scrape(t, cl).val("quictun_client_proxy_auth_failures_total", "proxy", "http_connect", "reason", "wrong"))

	// New credentials on SIGHUP: the old password stops working.
	replaceFile(t, creds, []byte("app:new-pass\nops:ops-pass\n"))
	cl.signal(t, syscall.SIGHUP)
	waitMetric(t, cl, ioTimeout, eq(1), "quictun_client_config_reloads_total", "result", "success")
	assertLogged(t, cl, `"Reloaded proxy credentials" file="`+creds+`" users=2`)
	assert.Error(t, socksVia(socksAddr, echo, "app", "old-pass"), "removed by the reload")
	assert.NoError(t, socksVia(socksAddr, echo, "app", "new-pass"))
	assert.NoError(t, socksVia(socksAddr, echo, "ops", "ops-pass"))
	resp, err = connectVia(t, httpAddr, echo, "app", "old-pass")
	if assert.NoError(t, err) {
		assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode, "removed by the reload")
	}
	resp, err = connectVia(t, httpAddr, echo, "ops", "ops-pass")
	if assert.NoError(t, err) {
		assert.Equal(t, http.StatusOK, resp.StatusCode, "added by the reload")
	}

	// A broken file: the reload fails, the credentials in force stay.
	replaceFile(t, creds, []byte("no colon here\n"))
	cl.signal(t, syscall.SIGHUP)
	waitMetric(t, cl, ioTimeout, eq(1), "quictun_client_config_reloads_total", "result", "failure")
	assertLogged(t, cl, "--proxy-credentials-file "+creds+": line 1: want USER:PASSWORD")
	assert.NoError(t, socksVia(socksAddr, echo, "app", "new-pass"), "still in force")
	require.NoError(t, os.Remove(creds))
	cl.signal(t, syscall.SIGHUP)
	waitMetric(t, cl, ioTimeout, eq(2), "quictun_client_config_reloads_total", "result", "failure")
	assert.NoError(t, socksVia(socksAddr, echo, "ops", "ops-pass"), "still in force")
	assertLogged(t, cl, "Configuration reload failed; still running the previous configuration")
}

// assertLogged checks that d's log has want (without printing the whole log).
func assertLogged(t *testing.T, d *daemon, want string) {
	t.Helper()
	assert.True(t, strings.Contains(d.log(), want), "%s did not log %s", d.name, want)
}
