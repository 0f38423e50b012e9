package cli

import (
	"context"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/admin"
	"github.com/quictun/quictun/pkg/fec"
	"github.com/quictun/quictun/pkg/liveness"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/tunnel"
)

// Socket is a daemon's UDP socket as QUIC uses it: wrapped by the forward
// error correction layer when --fec is on, with the QUIC config to run on it.
type Socket struct {
	Conn net.PacketConn // what the quic.Transport reads and writes
	QUIC *quic.Config
	FEC  *fec.Layer // nil when --fec is off
	// Wrap wraps another socket the way Conn was (the client's path-rescue
	// sockets, into the same FEC stats); nil when --fec is off.
	Wrap func(net.PacketConn) net.PacketConn
}

// OpenSocket opens the UDP socket on address (pushing its Close on cleanup),
// wraps it in the FEC layer --fec asks for (encoding toward every peer when
// encodeAll: the client), and builds the QUIC config from q with --qlog-dir.
func (d *DaemonFlags) OpenSocket(address string, q transport.QUICOptions, encodeAll bool, cleanup *Cleanup, logger klog.Logger) (*Socket, error) {
	pc, err := transport.ListenUDP(address)
	if err != nil {
		return nil, err
	}
	return d.SocketOn(pc, q, encodeAll, cleanup, logger)
}

// SocketOn is OpenSocket on a socket already open (an upgrade's inherited
// one); it pushes its Close on cleanup.
func (d *DaemonFlags) SocketOn(pc *net.UDPConn, q transport.QUICOptions, encodeAll bool, cleanup *Cleanup, logger klog.Logger) (*Socket, error) {
	cleanup.Push(func() { _ = pc.Close() })
	layer, err := d.FECLayer(encodeAll)
	if err != nil {
		return nil, err
	}
	s := &Socket{Conn: pc, FEC: layer}
	if layer != nil {
		s.Wrap = func(u net.PacketConn) net.PacketConn {
			if uc, ok := u.(*net.UDPConn); ok {
				transport.ForceSocketBuffers(uc, 7<<20)
			}
			return layer.Wrap(u)
		}
		s.Conn = s.Wrap(pc)
		q.DisablePathMTUDiscovery = true // leave room for the FEC header
		msg := "Forward error correction on"
		if !encodeAll {
			msg += " for clients that use it"
		}
		logger.Info(msg, "fec", d.FEC)
	}
	s.QUIC = transport.QUICConfig(q)
	if err := EnableQlog(s.QUIC, d.QlogDir, logger); err != nil {
		return nil, err
	}
	return s, nil
}

// Service is what a daemon runs: client.Client or server.Server.
type Service interface {
	Run(ctx context.Context) error
	Ready() bool
	ConnStats() []transport.ConnStats
	LivenessStats() *liveness.Stats
}

// Serving is what Serve needs of a built daemon.
type Serving struct {
	Side     string // "client" or "server", the metrics' subsystem
	Service  Service
	Socket   *Socket
	Metrics  *prometheus.Registry
	QUICStat prometheus.Collector
	Tunnels  *tunnel.Registry
	Admin    *Admin
	Reloader *Reloader // nil: no reload on SIGHUP
	Apply    Apply
	// Identities serves /identities on the admin API (nil: not served).
	Identities admin.Identities
}

// Serve is the tail both daemons' Run share: it registers the QUIC,
// liveness and FEC collectors, starts the admin server, runs the service with
// the SIGHUP reload watch beside it until ctx is cancelled and the drain is
// over, then stops the admin server. It returns the service's error, or else
// the admin server's.
func (d *DaemonFlags) Serve(ctx context.Context, s Serving) error {
	s.Metrics.MustRegister(s.QUICStat, metrics.NewLivenessCollector(s.Side, livenessCounts(s.Service.LivenessStats())))
	if s.Socket.FEC != nil {
		s.Metrics.MustRegister(metrics.NewFECCollector(s.Side, fecCounts(s.Socket.FEC.Stats())))
	}
	if s.Admin != nil {
		s.Admin.Start(ctx, admin.Options{
			Gatherer: s.Metrics, Ready: s.Service.Ready, Registry: s.Tunnels, Conns: s.Service.ConnStats,
			EnablePprof: d.EnablePprof, Refused: metrics.NewAdminRefused(s.Metrics, s.Side, admin.RefusedReasons()),
			Identities: s.Identities,
		})
	}
	var g errgroup.Group
	rctx, stopReload := context.WithCancel(ctx)
	if s.Reloader != nil {
		reloads := metrics.NewReload(s.Metrics, s.Side)
		g.Go(func() error {
			s.Reloader.Watch(rctx, s.Apply, reloads)
			return nil
		})
	}
	err := s.Service.Run(ctx)
	stopReload()
	_ = g.Wait()
	return RunErr(err, s.Admin.Stop())
}
