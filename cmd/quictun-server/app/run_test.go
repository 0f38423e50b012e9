package app

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// freePort returns a loopback TCP address that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// TestRunStartsAndStops runs the whole daemon in-process on loopback: the
// admin server answers, /metrics passes promlint, and cancelling the context
// ends Run without error.
func TestRunStartsAndStops(t *testing.T) {
	clearEnv(t)
	admin := freePort(t)
	secret := writeFile(t, "secret", strings.Repeat("s", 32))
	cmd := NewCommand()
	cmd.SetOut(io.Discard)
	cmd.SetArgs([]string{
		"--listen-on", "127.0.0.1:0", "--state-dir", filepath.Join(t.TempDir(), "state"),
		"--secret-file", secret, "--httpd-listen-on", admin, "--drain-timeout", "1s",
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
		code, _ := get("/readyz")
		return code == http.StatusOK
	}, 15*time.Second, 20*time.Millisecond, "server never ready")

	code, body := get("/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, name := range []string{"quictun_build_info", "quictun_server_streams_total", "quictun_quic_connections", "quictun_quic_datagrams_total"} {
		assert.Contains(t, body, name)
	}
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	require.NoError(t, err)
	assert.Empty(t, problems)
	code, _ = get("/tunnels")
	assert.Equal(t, http.StatusOK, code)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// TestFailedStartReleasesListeners: a start that fails after the admin and
// QUIC sockets were opened (here: --qlog-dir cannot be created) returns the
// error and closes both, so a retry can bind the same addresses.
func TestFailedStartReleasesListeners(t *testing.T) {
	clearEnv(t)
	admin := freePort(t)
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	quicAddr := udp.LocalAddr().String()
	require.NoError(t, udp.Close())
	notADir := writeFile(t, "file", "x")
	cmd := NewCommand()
	cmd.SetOut(io.Discard)
	cmd.SetArgs([]string{
		"--listen-on", quicAddr, "--state-dir", filepath.Join(t.TempDir(), "state"),
		"--secret-file", writeFile(t, "secret", strings.Repeat("s", 32)), "--httpd-listen-on", admin,
		"--qlog-dir", filepath.Join(notADir, "qlog"),
	})
	err = cmd.ExecuteContext(context.Background())
	require.ErrorContains(t, err, "--qlog-dir")
	ln, err := net.Listen("tcp", admin)
	require.NoError(t, err, "the admin listener leaked")
	require.NoError(t, ln.Close())
	pc, err := net.ListenPacket("udp", quicAddr)
	require.NoError(t, err, "the QUIC socket leaked")
	require.NoError(t, pc.Close())
}
