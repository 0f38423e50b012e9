package app

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

// TestRunStartsAndStops runs the client in-process against a UDP socket that
// never answers: it stays not ready, serves promlint-clean metrics, and
// stops cleanly when its context is cancelled.
func TestRunStartsAndStops(t *testing.T) {
	clearEnv(t)
	silent, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer func() { _ = silent.Close() }()
	admin := "127.0.0.1:" + strconv.Itoa(freePort(t))
	secret := writeFile(t, "secret", strings.Repeat("s", 32))
	cmd := NewCommand()
	cmd.SetOut(io.Discard)
	cmd.SetArgs([]string{
		"--listen-on", "tcp:127.0.0.1:" + strconv.Itoa(freePort(t)), "--server-endpoint", silent.LocalAddr().String(),
		"--token-source", "tcp:127.0.0.1:22", "--insecure-skip-verify", "--secret-file", secret,
		"--httpd-listen-on", admin, "--drain-timeout", "1s", "--handshake-timeout", "500ms",
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	get := func(path string) (int, string) {
		resp, err := hc.Get("http://" + admin + path)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run ended early: %v", err)
		default:
		}
		code, _ := get("/healthz")
		return code == http.StatusOK
	}, 15*time.Second, 20*time.Millisecond, "admin server never up")

	code, _ := get("/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code, "no server: not ready")
	code, body := get("/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, name := range []string{"quictun_build_info", "quictun_client_session_up 0", "quictun_client_dials_total"} {
		assert.Contains(t, body, name)
	}
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	require.NoError(t, err)
	assert.Empty(t, problems)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// TestFailedStartReleasesListeners: a start that fails after the admin and
// local listeners were opened (here: --qlog-dir cannot be created) returns
// the error and closes them all (the client leaked them before).
func TestFailedStartReleasesListeners(t *testing.T) {
	clearEnv(t)
	admin := "127.0.0.1:" + strconv.Itoa(freePort(t))
	local := "127.0.0.1:" + strconv.Itoa(freePort(t))
	notADir := writeFile(t, "file", "x")
	cmd := NewCommand()
	cmd.SetOut(io.Discard)
	cmd.SetArgs([]string{
		"--listen-on", "tcp:" + local, "--server-endpoint", "127.0.0.1:9",
		"--token-source", "tcp:127.0.0.1:22", "--insecure-skip-verify", "--secret-file", writeFile(t, "secret", strings.Repeat("s", 32)),
		"--httpd-listen-on", admin, "--qlog-dir", filepath.Join(notADir, "qlog"),
	})
	err := cmd.ExecuteContext(context.Background())
	require.ErrorContains(t, err, "--qlog-dir")
	for _, addr := range []string{admin, local} {
		ln, err := net.Listen("tcp", addr)
		require.NoError(t, err, "%s leaked", addr)
		require.NoError(t, ln.Close())
	}
}
