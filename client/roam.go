package client

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/route"
)

// Roaming before the path dies (Config.RouteWatch, Linux only): a watcher of
// the routing table, addresses and links looks up the route to the server
// after each burst of changes; when it leaves from another source address or
// interface, the monitor validates a path from a fresh socket (which the
// kernel routes the new way) and switches to it while the old path may still
// work (make-before-break), instead of waiting for the blackout rescue.
const (
	// routeQuiet and routeSettle debounce a burst of changes (an address
	// removal also removes its routes; a link going down takes both): look
	// up the route once routeQuiet passed without another change, at most
	// routeSettle after the first.
	routeQuiet  = 10 * time.Millisecond
	routeSettle = 50 * time.Millisecond
	// migrateTimeout bounds probing a new path after a route change; the
	// blackout rescue covers what it does not.
	migrateTimeout = 3 * time.Second
	// probeInterval is how often a PATH_CHALLENGE goes out while migrating.
	probeInterval = 200 * time.Millisecond
)

// RouteWatchSupported reports whether this platform has the route watcher;
// elsewhere paths switch only after a blackout (RescueAfter).
const RouteWatchSupported = route.Supported

// logRouteWatch says at start when the route watch is asked for but off.
func (c *Client) logRouteWatch(logger klog.Logger) {
	switch {
	case !c.cfg.RouteWatch:
	case !route.Supported:
		logger.Info("Route watch is off on this platform: the connection moves to a new path only after a blackout (--rescue-after)")
	case c.cfg.HeartbeatInterval <= 0:
		logger.Info("Route watch is off with --heartbeat-interval=0: the connection does not move to a new path")
	}
}

// routeChange is a change of the route to the server.
type routeChange struct {
	reason string     // metrics.SwitchRouteChanged or SwitchAddressRemoved
	path   route.Path // the new route
	at     time.Time  // when the first change of its burst arrived
}

// watchRoute starts, under wg, a watcher of the route to the server at remote when
// Config.RouteWatch is on and the platform has one. The channel it returns
// carries each change of the route; it holds only the latest. It returns nil
// (a channel that never delivers) when the watcher is off; the watcher stops
// when ctx ends.
func (c *Client) watchRoute(ctx context.Context, wg *sync.WaitGroup, remote net.Addr) <-chan routeChange {
	if !c.cfg.RouteWatch || !route.Supported {
		return nil
	}
	logger := klog.FromContext(ctx)
	ua, ok := remote.(*net.UDPAddr)
	if !ok {
		return nil
	}
	dst := ua.AddrPort().Addr().Unmap()
	w, err := route.NewWatcher()
	if err != nil {
		logger.Error(err, "Could not watch the route to the server; the connection moves to a new path only after a blackout",
			"fix", "allow the client rtnetlink sockets (seccomp, container policy), or turn the watch off with --route-watch=false")
		return nil
	}
	last, err := route.Lookup(dst)
	if err != nil {
		logger.V(2).Info("Could not look up the route to the server", "address", dst, "err", err)
	}
	out := make(chan routeChange, 1)
	stop := context.AfterFunc(ctx, func() { _ = w.Close() })
	wg.Go(func() {
		defer func() {
			if stop() { // ended by itself: the watcher is still open
				_ = w.Close()
			}
		}()
		for {
			at, err := w.Wait(routeQuiet, routeSettle)
			if err != nil {
				if ctx.Err() == nil {
					logger.Error(err, "Route watch stopped; the connection moves to a new path only after a blackout")
				}
				return
			}
			p, err := route.Lookup(dst)
			if err != nil {
				// No route now (an address or link going away): nothing to
				// move to yet; the next change looks again.
				logger.V(2).Info("No route to the server", "address", dst, "err", err)
				continue
			}
			if p == last {
				continue
			}
			reason := metrics.SwitchRouteChanged
			if last.Valid() && !hasAddress(last.Source) {
				reason = metrics.SwitchAddressRemoved
			}
			logger.V(2).Info("Route to the server changed", "address", dst, "reason", reason,
				"oldSource", last, "newSource", p, "newInterface", interfaceName(p.Interface))
			last = p
			select { // keep only the latest; the only sender, so the send never blocks
			case <-out:
			default:
			}
			out <- routeChange{reason: reason, path: p, at: at}
		}
	})
	return out
}

// interfaceName names the interface with index i, or gives its number.
func interfaceName(i int) string {
	if ifc, err := net.InterfaceByIndex(i); err == nil {
		return ifc.Name
	}
	return strconv.Itoa(i)
}

// hasAddress reports whether ip is still assigned to an interface of the host.
func hasAddress(ip netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // cannot tell: not "removed"
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if x, ok := netip.AddrFromSlice(n.IP); ok && x.Unmap() == ip.Unmap() {
				return true
			}
		}
	}
	return false
}

// migrate validates a path from the spare socket and switches the connection
// to it after a route change (make-before-break): quic-go re-sends what is
// outstanding on the new path at once. It gives up after migrateTimeout,
// leaving the blackout rescue armed.
func (r *rescuer) migrate(ctx context.Context, change routeChange) {
	logger := klog.FromContext(ctx)
	reason := change.reason
	m := r.c.cfg.Metrics
	fail := func(msg string, err error) {
		m.PathSwitchFailuresTotal.WithLabelValues(reason).Inc()
		logger.Info(msg, "reason", reason, "err", err)
	}
	idx, err := r.other(logger)
	if err != nil {
		fail("Could not open a socket for a path switch", err)
		return
	}
	path, err := r.conn.addPath(r.transports[idx])
	if err != nil {
		fail("Could not add a path", err)
		return
	}
	start := time.Now()
	mctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	for {
		pctx, pcancel := context.WithTimeout(mctx, probeInterval)
		err = path.Probe(pctx) // each call sends a PATH_CHALLENGE at once
		pcancel()
		if err == nil || mctx.Err() != nil {
			break
		}
	}
	if err == nil {
		err = path.Switch()
	}
	if err != nil {
		_ = path.Close()
		if ctx.Err() == nil {
			fail("Could not switch to a new path after a route change; the blackout rescue stays armed", err)
		}
		return
	}
	r.active = idx
	r.lastSwitch = time.Now()
	m.PathSwitchesTotal.WithLabelValues(reason).Inc()
	logger.Info("Switched to a new path after a route change", "reason", reason, "localAddress", change.path.Source,
		"interface", interfaceName(change.path.Interface), "probing", time.Since(start), "sinceChange", time.Since(change.at))
}
