package integration

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/fec"
	"github.com/quictun/quictun/pkg/transport"
)

// TestFECUnderLoss carries 2 MiB each way through a link losing 3 % of
// packets with forward error correction on both ends: every byte arrives
// intact, and the receivers rebuilt lost datagrams from parity.
func TestFECUnderLoss(t *testing.T) {
	echo := testutil.EchoServer(t)
	cfg := fec.DefaultConfig()
	var srvFEC *fec.Conn
	srv := testutil.StartServer(t, testutil.ServerOptions{
		Allow: []string{"tcp:" + echo},
		QUIC:  func(o *transport.QUICOptions) { o.DisablePathMTUDiscovery = true },
		WrapConn: func(pc net.PacketConn) net.PacketConn {
			c, err := fec.New(pc, cfg)
			require.NoError(t, err)
			srvFEC = c
			return c
		},
	})
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	var dark atomic.Bool
	proxy := lossyProxy(t, srv, 2*time.Millisecond, &dark, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return rng.Float64() < 0.03
	})
	ccfg := cfg
	ccfg.EncodeAll = true
	var cliFEC *fec.Conn
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{
		Token: "tcp:" + echo, ServerAddr: proxy, WaitReady: true,
		QUIC: func(o *transport.QUICOptions) { o.DisablePathMTUDiscovery = true },
		WrapConn: func(pc net.PacketConn) net.PacketConn {
			c, err := fec.New(pc, ccfg)
			require.NoError(t, err)
			cliFEC = c
			return c
		},
	})
	echoCheck(t, dial(t, cl.Addr), 2<<20)
	assert.Positive(t, srvFEC.Stats().Recovered.Load()+cliFEC.Stats().Recovered.Load(), "lost datagrams must be rebuilt from parity")
	assert.Positive(t, srvFEC.Stats().ParitySent.Load(), "the server answers a FEC client with FEC")
	t.Logf("recovered: server %d, client %d; parity sent: server %d, client %d", srvFEC.Stats().Recovered.Load(),
		cliFEC.Stats().Recovered.Load(), srvFEC.Stats().ParitySent.Load(), cliFEC.Stats().ParitySent.Load())
}
