package client

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestHasAddress(t *testing.T) {
	t.Parallel()
	assert.True(t, hasAddress(netip.MustParseAddr("127.0.0.1")), "loopback")
	assert.True(t, hasAddress(netip.MustParseAddr("::ffff:127.0.0.1")), "v4-mapped loopback")
	assert.False(t, hasAddress(netip.MustParseAddr("192.0.2.200")), "TEST-NET-1 address")
}
