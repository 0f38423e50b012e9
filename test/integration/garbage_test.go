package integration

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/metrics"
)

// TestNoVersionNegotiationForGarbage: garbage is counted by reason, and a datagram that looks like a long-header
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
	drops := func(reason string) float64 {
		return promtest.ToFloat64(srv.Metrics.DroppedDatagramsTotal.WithLabelValues(reason))
	}
	assert.Equal(t, 5.0, drops("unexpected_version"), "garbage is counted")

	// Datagrams that are not QUIC at all (first two bits 0) are counted too.
	for i := range 10 {
		_, err = c.Write([]byte{0x00, byte(i), 'x'})
		require.NoError(t, err)
	}
	assert.Eventually(t, func() bool { return drops(metrics.DropNotQUIC) == 10 }, 5*time.Second, 10*time.Millisecond,
		"not_quic drops: %v", drops(metrics.DropNotQUIC))
}
