package proto_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"

	"github.com/quictun/quictun/pkg/proto"
)

func TestReconnectSpread(t *testing.T) {
	t.Parallel()
	closed := func(code proto.Code, remote bool, reason string) error {
		return fmt.Errorf("lost: %w", &quic.ApplicationError{Remote: remote, ErrorCode: code.ApplicationErrorCode(), ErrorMessage: reason})
	}
	for _, tc := range []struct {
		name string
		err  error
		want time.Duration
	}{
		{"asked", closed(proto.CodeShutdown, true, proto.ShutdownReason(16700*time.Millisecond)), 16700 * time.Millisecond},
		{"capped", closed(proto.CodeShutdown, true, proto.ShutdownReason(time.Hour)), proto.MaxReconnectSpread},
		{"none asked", closed(proto.CodeShutdown, true, proto.ShutdownReason(0)), 0},
		{"an older server", closed(proto.CodeShutdown, true, "server shutting down"), 0},
		{"garbage", closed(proto.CodeShutdown, true, "reconnect-spread=soon)"), 0},
		{"negative", closed(proto.CodeShutdown, true, "(reconnect-spread=-5s)"), 0},
		{"another code", closed(proto.CodeTimeout, true, proto.ShutdownReason(time.Second)), 0},
		{"our own close", closed(proto.CodeShutdown, false, proto.ShutdownReason(time.Second)), 0},
		{"no close", errors.New("timeout"), 0},
	} {
		assert.Equal(t, tc.want, proto.ReconnectSpread(tc.err), tc.name)
	}
	assert.Equal(t, "server shutting down (reconnect-spread=16.7s)", proto.ShutdownReason(16700*time.Millisecond))
}

// TestIsUpgrade: only a server's CodeShutdown close with UpgradeReason says
// upgrade; it asks for no spread.
func TestIsUpgrade(t *testing.T) {
	t.Parallel()
	closed := func(code proto.Code, remote bool, reason string) error {
		return fmt.Errorf("lost: %w", &quic.ApplicationError{Remote: remote, ErrorCode: code.ApplicationErrorCode(), ErrorMessage: reason})
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"upgrade", closed(proto.CodeShutdown, true, proto.UpgradeReason), true},
		{"shutdown", closed(proto.CodeShutdown, true, proto.ShutdownReason(time.Second)), false},
		{"another code", closed(proto.CodeTimeout, true, proto.UpgradeReason), false},
		{"our own close", closed(proto.CodeShutdown, false, proto.UpgradeReason), false},
		{"no close", errors.New("timeout"), false},
	} {
		assert.Equal(t, tc.want, proto.IsUpgrade(tc.err), tc.name)
	}
	assert.Zero(t, proto.ReconnectSpread(closed(proto.CodeShutdown, true, proto.UpgradeReason)))
}
