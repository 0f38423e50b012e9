package server

import (
	"context"
	"net"
	"net/netip"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/endpoint"
)

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

func TestNewRefusesOwnQUICAddress(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, nil)
	dest, err := endpoint.Parse("tcp:" + s.Addr().String())
	require.NoError(t, err)
	_, _, err = s.policy.Load().all.Authorize(context.Background(), nil, dest)
	require.ErrorIs(t, err, endpoint.ErrSelf)
}
