package server_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/server"
)

// TestShutdownSpread: connections over the rate take that many seconds,
// capped; a second's worth or less takes none.
func TestShutdownSpread(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 20*time.Second, server.ShutdownSpread(5000, 250))
	assert.Equal(t, 10*time.Second, server.ShutdownSpread(5000, 500))
	assert.Equal(t, proto.MaxReconnectSpread, server.ShutdownSpread(100000, 250))
	assert.Zero(t, server.ShutdownSpread(250, 250))
	assert.Zero(t, server.ShutdownSpread(1, 250))
	assert.Zero(t, server.ShutdownSpread(1000, 0))
	assert.Equal(t, 4*time.Second, server.ShutdownSpread(1, 0.25))
}
