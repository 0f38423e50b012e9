package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/server"
)

// TestQlog: with a qlog directory, each server connection leaves a qlog file
// (JSON-SEQ, as qvis reads) once it ends.
func TestQlog(t *testing.T) {
	dir := t.TempDir()
	echo := testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.QUIC.Tracer = transport.QlogTracer(dir, func(err error) { t.Error(err) })
	}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, WaitReady: true})
	echoCheck(t, dial(t, cl.Addr), 4096)
	cl.Stop(t)
	srv.Stop(t)
	var files []string
	require.Eventually(t, func() bool {
		files, _ = filepath.Glob(filepath.Join(dir, "*_server.sqlog"))
		return len(files) == 1
	}, 5*time.Second, 10*time.Millisecond)
	b, err := os.ReadFile(files[0])
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(b), "\x1e{"), "qlog JSON-SEQ records start with RS")
	assert.Contains(t, string(b), "packet_sent")
}
