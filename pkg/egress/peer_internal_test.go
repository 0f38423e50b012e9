package egress

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"sync/atomic"
	"testing"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"
)

// stateCounter is a Conn that counts the reads of its ConnectionState and
// completes its handshake when the test closes done.
type stateCounter struct {
	Conn
	done  chan struct{}
	state quic.ConnectionState
	reads atomic.Int64
}

func (c *stateCounter) HandshakeComplete() <-chan struct{} { return c.done }

func (c *stateCounter) ConnectionState() quic.ConnectionState {
	c.reads.Add(1)
	return c.state
}

// TestConnStatePeerKeptAfterHandshake: a connection's client certificate
// is read once its handshake is complete and kept for its later streams
// (quic-go's ConnectionState is a large copy per tunnel); before it (0-RTT
// streams) it is read each time, as is a connection without ConnState.
func TestConnStatePeerKeptAfterHandshake(t *testing.T) {
	t.Parallel()
	c := &stateCounter{done: make(chan struct{})}
	c.state.TLS.PeerCertificates = []*x509.Certificate{{Subject: pkix.Name{CommonName: "ci-runner", Organization: []string{"Example"}}}}
	s := &ConnState{}
	for range 2 {
		p := s.peerOf(c)
		require.Equal(t, "ci-runner", p.cn)
	}
	require.EqualValues(t, 2, c.reads.Load(), "before the handshake: read for each stream")
	close(c.done)
	for range 3 {
		p := s.peerOf(c)
		require.Equal(t, "CN=ci-runner,O=Example", p.subject)
		require.Equal(t, []string{"CN=ci-runner", "key=k"}, p.identities("k"))
	}
	require.EqualValues(t, 3, c.reads.Load(), "after it: read once")
	require.Equal(t, "CN=ci-runner", s.Identity(c))
	require.EqualValues(t, 3, c.reads.Load())
	var none *ConnState
	require.Equal(t, "ci-runner", none.peerOf(c).cn)
	require.EqualValues(t, 4, c.reads.Load(), "no ConnState: read each time")
}
