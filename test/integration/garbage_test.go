package integration

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
)

// TestNoVersionNegotiationForGarbage: a datagram that looks like a long-header
// packet of an unknown version (half of all random datagrams do) gets no
// answer. quic-go would otherwise send a Version Negotiation packet to
// whatever source the datagram claims: work and reflection for an attacker's
// garbage, and no use to quictun clients, which all speak QUIC v1.
func TestNoVersionNegotiationForGarbage(t *testing.T) {
	t.Parallel()
	srv := testutil.StartServer(t, testutil.ServerOptions{})
	c, err := net.Dial("udp", srv.Addr)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()

	pkt := make([]byte, 1200)
	_, _ = rand.Read(pkt)
	pkt[0] = 0xc0                                   // long header, fixed bit
	binary.BigEndian.PutUint32(pkt[1:], 0x1a2a3a4a) // a reserved version (RFC 9000 §15)
	pkt[5] = 8                                      // destination connection ID length
	pkt[14] = 8                                     // source connection ID length
	for range 5 {
		_, err = c.Write(pkt)
		require.NoError(t, err)
	}
	require.NoError(t, c.SetReadDeadline(time.Now().Add(500*time.Millisecond)))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	assert.True(t, errors.Is(err, os.ErrDeadlineExceeded), "the server answered garbage with %d bytes (err %v)", n, err)
}
