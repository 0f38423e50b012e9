package app

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// TestRunStartsAndStops runs the whole daemon in-process on loopback: the
// admin server answers, /metrics passes promlint, and cancelling the context
// ends Run without error.
func TestRunStartsAndStops(t *testing.T) {
	clearEnv(t)
	admin := testutil.FreeAddr(t, "tcp")
	c := testutil.StartCommand(t, NewCommand(), admin,
		"--listen-on", "127.0.0.1:0", "--state-dir", filepath.Join(t.TempDir(), "state"),
		"--secret-file", writeFile(t, "secret", strings.Repeat("s", 32)), "--httpd-listen-on", admin, "--drain-timeout", "1s")
	c.WaitStatus(t, "/readyz", http.StatusOK)
	c.RequireMetrics(t, "quictun_build_info", "quictun_server_streams_total", "quictun_quic_connections", "quictun_quic_datagrams_total")
	code, _ := c.Get("/tunnels")
	assert.Equal(t, http.StatusOK, code)
	c.Stop(t)
}

// TestFailedStartReleasesListeners: a start that fails after the admin and
// QUIC sockets were opened (here: --qlog-dir cannot be created) returns the
// error and closes both, so a retry can bind the same addresses.
func TestFailedStartReleasesListeners(t *testing.T) {
	clearEnv(t)
	admin, quicAddr := testutil.FreeAddr(t, "tcp"), testutil.FreeAddr(t, "udp")
	cmd := NewCommand()
	cmd.SetOut(io.Discard)
	cmd.SetArgs([]string{
		"--listen-on", quicAddr, "--state-dir", filepath.Join(t.TempDir(), "state"),
		"--secret-file", writeFile(t, "secret", strings.Repeat("s", 32)), "--httpd-listen-on", admin,
		"--qlog-dir", filepath.Join(writeFile(t, "file", "x"), "qlog"),
	})
	err := cmd.ExecuteContext(context.Background())
	require.ErrorContains(t, err, "--qlog-dir")
	testutil.RequireFree(t, "tcp", admin)
	testutil.RequireFree(t, "udp", quicAddr)
}
