package e2e

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClientRestartResumesWith0RTT: with --session-file, a restarted client
// resumes its session with 0-RTT and its first tunnel works; without it,
// the restarted client does a full handshake.
func TestClientRestartResumesWith0RTT(t *testing.T) {
	echo := startLatencyServe(t)
	srv := startServer(t, serverOpts{Allow: []string{"tcp:" + echo}})
	file := filepath.Join(t.TempDir(), "sessions.json")
	args := []string{"--session-file", file}

	first := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: args})
	require.NoError(t, echoVia(t, first.Addr, "first run"))
	waitFor(t, 10*time.Second, "session file", func() bool { _, err := os.Stat(file); return err == nil })
	fi, err := os.Stat(file)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	first.signal(t, syscall.SIGTERM)
	_, ok := first.waitExit(10 * time.Second)
	require.True(t, ok, "client did not exit")

	second := startClient(t, srv, clientOpts{Token: "tcp:" + echo, Args: args})
	require.NoError(t, echoVia(t, second.Addr, "after restart"))
	m := scrape(t, second)
	assert.Equal(t, 1.0, m.val("quictun_client_dials_total", "result", "ok_0rtt"), "resumed with 0-RTT:\n%s", second.log())
	assert.Zero(t, m.val("quictun_client_dials_total", "result", "ok"))

	// Without the file, a restarted client has no ticket.
	third := startClient(t, srv, clientOpts{Token: "tcp:" + echo})
	require.NoError(t, echoVia(t, third.Addr, "no file"))
	m = scrape(t, third)
	assert.Equal(t, 1.0, m.val("quictun_client_dials_total", "result", "ok"))
	assert.Zero(t, m.val("quictun_client_dials_total", "result", "ok_0rtt"))
}
