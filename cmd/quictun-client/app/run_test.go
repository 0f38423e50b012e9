package app

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// TestRunStartsAndStops runs the client in-process against a UDP socket that
// never answers: it stays not ready, serves promlint-clean metrics, and
// stops cleanly when its context is cancelled.
func TestRunStartsAndStops(t *testing.T) {
	clearEnv(t)
	silent, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer func() { _ = silent.Close() }()
	admin := testutil.FreeAddr(t, "tcp")
	c := testutil.StartCommand(t, NewCommand(), admin,
		"--listen-on", "tcp:"+testutil.FreeAddr(t, "tcp"), "--server-endpoint", silent.LocalAddr().String(),
		"--token-source", "tcp:127.0.0.1:22", "--insecure-skip-verify", "--secret-file", writeFile(t, "secret", strings.Repeat("s", 32)),
		"--httpd-listen-on", admin, "--drain-timeout", "1s", "--handshake-timeout", "500ms")
	c.WaitStatus(t, "/healthz", http.StatusOK)
	code, _ := c.Get("/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code, "no server: not ready")
	c.RequireMetrics(t, "quictun_build_info", "quictun_client_session_up 0", "quictun_client_dials_total")
	c.Stop(t)
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
			admin := testutil.FreeAddr(t, "tcp")
			tcp := []string{testutil.FreeAddr(t, "tcp"), testutil.FreeAddr(t, "tcp"), testutil.FreeAddr(t, "tcp")}
			udp := []string{testutil.FreeAddr(t, "udp")}
			cmd := NewCommand()
			cmd.SetOut(io.Discard)
			cmd.SetArgs(append([]string{
				"--server-endpoint", "127.0.0.1:9", "--token-source", "tcp:127.0.0.1:22", "--insecure-skip-verify",
				"--secret-file", writeFile(t, "secret", strings.Repeat("s", 32)), "--httpd-listen-on", admin,
			}, tc.args(tcp, udp)...))
			err := cmd.ExecuteContext(context.Background())
			require.ErrorContains(t, err, tc.wantErr)
			testutil.RequireFree(t, "tcp", append(tcp, admin)...)
			testutil.RequireFree(t, "udp", udp...)
		})
	}
}
