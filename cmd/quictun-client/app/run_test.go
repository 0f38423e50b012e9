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

// TestFailedStartReleasesListeners: a start that fails after the admin
// listener and some local entry points were opened returns the error and
// closes every one of them, so a retry can bind the same addresses (the
// client leaked them before). It fails at the QUIC step (--qlog-dir cannot
// be created), at a --forward and at a --proxy whose address is taken.
func TestFailedStartReleasesListeners(t *testing.T) {
	clearEnv(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = busy.Close() }()
	taken := busy.Addr().String()
	local := func() string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }
	notADir := writeFile(t, "file", "x")
	for _, tc := range []struct {
		name    string
		args    func(tcp, udp []string) []string // flags opening the local addresses tcp and udp
		wantErr string
	}{{
		name: "qlog dir",
		args: func(tcp, udp []string) []string {
			return []string{"--listen-on", "tcp:" + tcp[0], "--forward", "tcp:" + tcp[1] + "=tcp:127.0.0.1:22",
				"--forward", "udp:" + udp[0] + "=udp:127.0.0.1:53", "--proxy", "socks5:" + tcp[2],
				"--qlog-dir", filepath.Join(notADir, "qlog")}
		},
		wantErr: "--qlog-dir",
	}, {
		name: "forward",
		args: func(tcp, udp []string) []string {
			return []string{"--listen-on", "tcp:" + tcp[0], "--forward", "tcp:" + tcp[1] + "=tcp:127.0.0.1:22",
				"--forward", "udp:" + udp[0] + "=udp:127.0.0.1:53", "--forward", "tcp:" + taken + "=tcp:127.0.0.1:80"}
		},
		wantErr: "--forward tcp:" + taken,
	}, {
		name: "proxy",
		args: func(tcp, udp []string) []string {
			return []string{"--listen-on", "tcp:" + tcp[0], "--forward", "tcp:" + tcp[1] + "=tcp:127.0.0.1:22",
				"--forward", "udp:" + udp[0] + "=udp:127.0.0.1:53", "--proxy", "socks5:" + tcp[2], "--proxy", "http-connect:" + taken}
		},
		wantErr: "--proxy tcp:" + taken,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			admin := local()
			tcp := []string{local(), local(), local()}
			udp := []string{local()} // a free TCP port is almost always a free UDP one; a clash fails the start loudly
			cmd := NewCommand()
			cmd.SetOut(io.Discard)
			cmd.SetArgs(append([]string{
				"--server-endpoint", "127.0.0.1:9", "--token-source", "tcp:127.0.0.1:22", "--insecure-skip-verify",
				"--secret-file", writeFile(t, "secret", strings.Repeat("s", 32)), "--httpd-listen-on", admin,
			}, tc.args(tcp, udp)...))
			err := cmd.ExecuteContext(context.Background())
			require.ErrorContains(t, err, tc.wantErr)
			for _, addr := range append(tcp, admin) {
				ln, err := net.Listen("tcp", addr)
				require.NoError(t, err, "%s leaked", addr)
				require.NoError(t, ln.Close())
			}
			pc, err := net.ListenPacket("udp", udp[0])
			require.NoError(t, err, "udp %s leaked", udp[0])
			require.NoError(t, pc.Close())
		})
	}
}
