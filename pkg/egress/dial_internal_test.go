package egress

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/tunnel"
)

func newTestHandler(t *testing.T, mutate func(*Config)) *Handler {
	t.Helper()
	parser, err := token.NewParser(token.PluginCleartext, "")
	require.NoError(t, err)
	cfg := Config{
		Parser: parser, Allow: endpoint.DefaultAllowList(),
		MaxConcurrentDials: 8, MaxDialsPerDestination: 2, MaxReplayEntries: 64, MaxReplayEntriesPerConn: 8,
		Events: NopEvents{}, Registry: tunnel.NewRegistry(),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	e, err := New(cfg)
	require.NoError(t, err)
	return e
}

type fakeDialer struct{}

func (fakeDialer) DialContext(context.Context, string, string) (net.Conn, error) { return nil, nil }

func TestCheckedDialer(t *testing.T) {
	t.Parallel()
	allow := endpoint.MustParseAllowList("db=tcp:localhost:1").WithSelf(nil, netip.MustParseAddrPort("127.0.0.1:9"))
	var f fakeDialer
	assert.Equal(t, Dialer(f), checkedDialer(f, func() *endpoint.AllowList { return allow }), "other dialers are left alone")

	var called []string
	orig := &net.Dialer{Control: func(network, address string, _ syscall.RawConn) error {
		called = append(called, address)
		return nil
	}}
	d, ok := checkedDialer(orig, func() *endpoint.AllowList { return allow }).(*net.Dialer)
	require.True(t, ok)
	assert.NotSame(t, orig, d, "the caller's dialer is copied")
	assert.Nil(t, orig.ControlContext)
	err := d.ControlContext(context.Background(), "tcp4", "127.0.0.1:9", nil)
	require.ErrorIs(t, err, endpoint.ErrSelf)
	require.NoError(t, d.ControlContext(context.Background(), "tcp4", "127.0.0.1:10", nil))
	require.ErrorIs(t, d.ControlContext(context.Background(), "tcp6", "[::]:10", nil), endpoint.ErrReserved)
	require.NoError(t, d.ControlContext(context.Background(), "unix", "/run/x.sock", nil))
	assert.Equal(t, []string{"127.0.0.1:10", "/run/x.sock"}, called, "the caller's Control still runs after the check")
}

func TestSelfRefused(t *testing.T) {
	t.Parallel()
	self := netip.MustParseAddrPort("127.0.0.1:7500")
	e := newTestHandler(t, func(c *Config) { c.Self = []netip.AddrPort{self} })
	dest, err := endpoint.Parse("tcp:" + self.String())
	require.NoError(t, err)
	_, _, err = e.policy.Load().authorize(context.Background(), nil, dest, nil)
	require.ErrorIs(t, err, endpoint.ErrSelf)
	e.SetAllowList(endpoint.MustParseAllowList("tcp:127.0.0.0/8:*"), map[string]*endpoint.AllowList{"CN=x": endpoint.MustParseAllowList("tcp:127.0.0.0/8:*")})
	_, _, err = e.policy.Load().authorize(context.Background(), nil, dest, []string{"CN=x"})
	require.ErrorIs(t, err, endpoint.ErrSelf, "new rules keep the server's own listeners refused, identity rules too")
}

func TestDestinationSlots(t *testing.T) {
	t.Parallel()
	e := newTestHandler(t, func(c *Config) { c.MaxDialsPerDestination = 2 })
	a1 := e.destination("a")
	a2 := e.destination("a")
	b := e.destination("b")
	assert.Same(t, a1, a2, "one semaphore per destination")
	assert.NotSame(t, a1, b)
	assert.Equal(t, 2, a1.refs)

	a1.slots <- struct{}{}
	a2.slots <- struct{}{}
	select {
	case a1.slots <- struct{}{}:
		t.Fatal("a third concurrent dial to one destination got a slot")
	default:
	}
	select {
	case b.slots <- struct{}{}: // another destination is not affected
	default:
		t.Fatal("destination b blocked by a")
	}

	e.releaseDestination("a", true)
	assert.Len(t, a1.slots, 1, "a held slot is freed")
	e.releaseDestination("a", true)
	e.releaseDestination("b", true)
	e.dialsMu.Lock()
	assert.Empty(t, e.dialsByDest, "unused destinations are forgotten")
	e.dialsMu.Unlock()
}

func TestDestinationSlotsConcurrent(t *testing.T) {
	t.Parallel()
	const limit = 3
	e := newTestHandler(t, func(c *Config) { c.MaxDialsPerDestination = limit })
	var inFlight, peak atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			dest := []string{"x", "y"}[w%2]
			for range 50 {
				d := e.destination(dest)
				d.slots <- struct{}{}
				if dest == "x" {
					n := inFlight.Add(1)
					for {
						p := peak.Load()
						if n <= p || peak.CompareAndSwap(p, n) {
							break
						}
					}
					inFlight.Add(-1)
				}
				e.releaseDestination(dest, true)
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, peak.Load(), int64(limit), "never more than the limit per destination")
	e.dialsMu.Lock()
	defer e.dialsMu.Unlock()
	assert.Empty(t, e.dialsByDest)
}

func TestNewSizesFromConfig(t *testing.T) {
	t.Parallel()
	e := newTestHandler(t, func(c *Config) { c.MaxConcurrentDials, c.ReplayWindow, c.MaxReplayEntries = 3, 7*time.Second, 99 })
	assert.Equal(t, 3, cap(e.dials), "dial semaphore sized from the limit")
	assert.Equal(t, 7*time.Second, e.replay.window)
	assert.Equal(t, 99, e.replay.max)
	assert.NotNil(t, e.cfg.Dialer)
	_, err := New(Config{})
	require.Error(t, err)
}
