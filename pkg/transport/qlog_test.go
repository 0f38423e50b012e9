package transport_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quictun/quictun/internal/testutil/quictest"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/transport"
)

// tracedPair connects a client and a server with the given quic.Configs,
// carries one stream, and closes everything.
func tracedPair(t *testing.T, clientConf, serverConf *quic.Config) {
	t.Helper()
	cli, srv := quictest.PairWith(t, serverConf, clientConf)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := cli.OpenStreamSync(ctx)
	require.NoError(t, err)
	_, err = s.Write([]byte("traced"))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	ss, err := srv.AcceptStream(ctx)
	require.NoError(t, err)
	got, err := io.ReadAll(ss)
	require.NoError(t, err)
	require.Equal(t, "traced", string(got))
	require.NoError(t, cli.CloseWithError(0, ""))
	<-srv.Context().Done()
}

func TestQlogTracer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var mu sync.Mutex
	var errs []error
	onErr := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}
	cconf := transport.QUICConfig(transport.DefaultQUICOptions())
	cconf.Tracer = transport.QlogTracer(dir, onErr)
	sconf := transport.QUICConfig(transport.DefaultQUICOptions())
	sconf.Tracer = transport.QlogTracer(dir, onErr)
	tracedPair(t, cconf, sconf)

	// quic-go closes the traces with their connections; the files are flushed then.
	require.Eventually(t, func() bool {
		var roles []string
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			info, err := e.Info()
			require.NoError(t, err)
			if info.Size() == 0 {
				return false
			}
			assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), e.Name())
			name := strings.TrimSuffix(e.Name(), ".sqlog")
			_, role, ok := strings.Cut(name, "_")
			require.True(t, ok, e.Name())
			roles = append(roles, role)
		}
		slices.Sort(roles)
		return assert.ObjectsAreEqual([]string{"client", "server"}, roles)
	}, 10*time.Second, 20*time.Millisecond)
	mu.Lock()
	assert.Empty(t, errs)
	mu.Unlock()
}

func TestQlogTracerUnwritableDir(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var errs []error
	missing := filepath.Join(t.TempDir(), "missing")
	cconf := transport.QUICConfig(transport.DefaultQUICOptions())
	cconf.Tracer = transport.QlogTracer(missing, func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	})
	tracedPair(t, cconf, transport.QUICConfig(transport.DefaultQUICOptions())) // the connection still works
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, errs)
	assert.Contains(t, errs[0].Error(), "qlog file")
	assert.ErrorIs(t, errs[0], os.ErrNotExist)

	// A nil onError is allowed.
	cconf.Tracer = transport.QlogTracer(missing, nil)
	tracedPair(t, cconf, transport.QUICConfig(transport.DefaultQUICOptions()))
}
