package transport_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/transport"
)

// connPairs returns n client connections to one loopback server.
func connPairs(t *testing.T, n int) []*quic.Conn {
	t.Helper()
	st, err := transport.LoadOrCreateState(filepath.Join(t.TempDir(), "s"), "", "")
	require.NoError(t, err)
	addr, _ := serveOnce(t, st)
	pin, err := transport.ParseFingerprint(st.Fingerprint())
	require.NoError(t, err)
	var out []*quic.Conn
	for range n {
		c := dialEarly(t, addr, nil, pin)
		t.Cleanup(func() { _ = c.CloseWithError(0, "") })
		out = append(out, c)
	}
	return out
}

func TestLinger(t *testing.T) {
	t.Parallel()
	t.Run("no connections", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		transport.Linger(context.Background(), nil)
		assert.Less(t, time.Since(start), 100*time.Millisecond)
	})
	t.Run("ended connections", func(t *testing.T) {
		t.Parallel()
		conns := connPairs(t, 2)
		for _, c := range conns {
			require.NoError(t, c.CloseWithError(0, ""))
		}
		start := time.Now()
		transport.Linger(context.Background(), conns)
		assert.Less(t, time.Since(start), 150*time.Millisecond, "nothing to wait for")
	})
	t.Run("live connection waits the minimum, bounded", func(t *testing.T) {
		t.Parallel()
		conns := connPairs(t, 1)
		start := time.Now()
		transport.Linger(context.Background(), conns)
		d := time.Since(start)
		assert.GreaterOrEqual(t, d, 200*time.Millisecond, "at least 200 ms on a fast path")
		assert.Less(t, d, 3500*time.Millisecond, "at most 3 s")
	})
	t.Run("returns when the last connection ends", func(t *testing.T) {
		t.Parallel()
		conns := connPairs(t, 2)
		go func() {
			time.Sleep(10 * time.Millisecond) // the connections end while Linger waits
			for _, c := range conns {
				_ = c.CloseWithError(0, "")
			}
		}()
		start := time.Now()
		transport.Linger(context.Background(), conns)
		assert.Less(t, time.Since(start), 195*time.Millisecond, "did not wait for the timer")
	})
	t.Run("ctx done", func(t *testing.T) {
		t.Parallel()
		conns := connPairs(t, 1)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		start := time.Now()
		transport.Linger(ctx, conns)
		assert.Less(t, time.Since(start), 100*time.Millisecond)
	})
}
