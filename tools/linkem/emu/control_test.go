package emu

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

func TestControlOverUnixSocket(t *testing.T) {
	clk := &fakeClock{now: t0}
	c2s, s2c := NewLink(DefaultParams(), 1), NewLink(DefaultParams(), 2)
	ctl := NewControl(c2s, s2c, clk)
	sock := filepath.Join(t.TempDir(), "linkem.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	srv := &http.Server{Handler: ctl.Handler(), ReadHeaderTimeout: time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	cl := NewClient(sock)
	t.Cleanup(cl.Close)
	ctx := t.Context()

	cfg, err := cl.SetConfig(ctx, ConfigUpdate{
		Both: map[string]any{"delay": "12.5ms", "loss": 0.01},
		S2C:  map[string]any{"rate": "100mbit"},
	})
	require.NoError(t, err)
	assert.Equal(t, "12.5ms", cfg[C2S]["delay"])
	assert.Equal(t, "0.01", cfg[S2C]["loss"])
	assert.Equal(t, "0", cfg[C2S]["rate"])
	assert.Equal(t, "100mbit", cfg[S2C]["rate"])
	assert.Equal(t, int64(100e6), s2c.Params().RateBits)

	// All or nothing: one bad value leaves both directions unchanged.
	_, err = cl.SetConfig(ctx, ConfigUpdate{C2S: map[string]any{"delay": "1ms"}, S2C: map[string]any{"loss": 7}})
	require.ErrorContains(t, err, "s2c")
	assert.Equal(t, 12500*time.Microsecond, c2s.Params().Delay)

	_, err = cl.SetConfig(ctx, ConfigUpdate{Both: map[string]any{"bogus": 1}})
	require.ErrorContains(t, err, "bogus")

	require.NoError(t, cl.Blackout(ctx, 5*time.Second, "c2s"))
	assert.True(t, c2s.InBlackout(t0.Add(time.Second)))
	assert.False(t, s2c.InBlackout(t0.Add(time.Second)))
	require.Error(t, cl.Blackout(ctx, time.Second, "sideways"))

	c2s.Offer(t0, 100) // dropped by the blackout
	clk.now = t0.Add(2 * time.Second)
	st, err := cl.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), st.C2S.RxPackets)
	assert.Equal(t, uint64(1), st.C2S.Dropped["blackout"])
	assert.Equal(t, "3s", st.C2S.BlackoutLeft)
	assert.Equal(t, "2s", st.Uptime)

	got, err := cl.Config(ctx)
	require.NoError(t, err)
	assert.Equal(t, "100mbit", got[S2C]["rate"])
}
