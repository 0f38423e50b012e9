package client

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/dgram"
	"github.com/quictun/quictun/pkg/liveness"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
)

// monitor runs the session's datagram receiver, tail prober and heartbeats,
// and rescues the connection after a blackout: when no heartbeat echo arrived
// for RescueAfter, it probes a new path (a fresh UDP socket, so the probe is
// not stuck behind the connection's backed-off probe timer) and switches to it
// as soon as the server answers. quic-go then re-sends everything outstanding
// at once. monitor returns when the connection or ctx ends, after every
// goroutine it started has ended.
//
// With several servers it also tells steering (servers.go) how the link
// fares: stalled while no echo came for RescueAfter, so new tunnels go to
// another server; stalled for deadAfter while another server is healthy,
// the connection is closed with CodeTimeout, which resets its tunnels (the
// applications reconnect, onto a live server) and starts a redial.
// suspectLateEchoes is how late heartbeat echoes may be, with packets still
// arriving, before the path counts as silent for the TCP fallback.
const suspectLateEchoes = 5 * time.Second

func (c *Client) monitor(ctx context.Context, tr *quic.Transport, l *link) {
	sess := l.session
	conn := l.conn
	defer l.stalled.Store(false)
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(conn.Context(), cancel)
	defer stop()

	var wg sync.WaitGroup
	defer wg.Wait()
	// quic-go's SendDatagram blocks while its datagram queue is full (a
	// congestion-limited connection in a blackout), and only the
	// connection's end releases it: on shutdown, close the connection
	// before waiting for the goroutines that may be stuck in it.
	defer func() {
		if ctx.Err() != nil {
			_ = conn.CloseWithError(proto.CodeShutdown.ApplicationErrorCode(), "client shutting down")
		}
	}()
	if !conn.ConnectionState().SupportsDatagrams.Remote {
		klog.FromContext(ctx).V(2).Info("Server does not support datagrams; heartbeats and tail probes are off")
		<-mctx.Done()
		return
	}
	recv := liveness.NewReceiver(conn, false, 0, &c.liveness)
	wg.Go(func() { dgram.Serve(mctx, conn, recv.Invalid, c.cfg.Metrics.UDP.ReceiveQueueDrops, recv, sess.Flows) })
	wg.Go(func() { sess.Prober.Run(mctx) })
	if c.cfg.HeartbeatInterval <= 0 {
		<-mctx.Done()
		return
	}
	r := &rescuer{c: c, conn: conn, transports: []*quic.Transport{tr}}
	defer func() {
		// On shutdown the CONNECTION_CLOSE goes out first: closing a
		// transport the connection ever used (a rescue's) destroys it
		// without one, and the server then holds it until its idle timeout.
		if ctx.Err() != nil {
			_ = conn.CloseWithError(proto.CodeShutdown.ApplicationErrorCode(), "client shutting down")
		}
		r.close()
	}()
	roam := c.watchRoute(mctx, &wg, conn) // route changes (roam.go); nil when off
	var moveTo *routeChange               // a route change waiting for the rescue or move in progress
	interval := c.cfg.HeartbeatInterval
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var seq uint64
	var rescuing sync.WaitGroup
	defer rescuing.Wait()
	busy := false
	done := make(chan struct{}, 1)
	var sending atomic.Bool // a heartbeat is being handed to quic-go
	heartbeat := func() {
		seq++
		if sending.CompareAndSwap(false, true) {
			// Never block the loop: a stuck send skips heartbeats
			// rather than the rescue and the shutdown.
			n := seq
			wg.Go(func() {
				defer sending.Store(false)
				_ = liveness.SendHeartbeat(conn, n, &c.liveness)
			})
		}
	}
	// Heartbeats go out only while the connection has work: a tunnel
	// opening, bytes moving in the last IdleAfter, a rescue, or no recent
	// echo. Idle, the ticker slows to the keep-alive period and the
	// session's Waker is armed: the data path wakes the loop as a tunnel
	// opens or bytes move (an idle ssh session that comes back to life), and
	// one keep-alive datagram a period (liveness.SendKeepAlive: padded so a
	// restarted server answers it with a stateless reset, which quic-go's
	// own PING is too short to draw) is all that crosses the network: it
	// goes every nine tenths of the period, before quic-go's own keep-alive
	// (the period after the last packet received) would, whose timer its
	// acknowledgement restarts. watching is when the heartbeats last
	// started: a path that died while idle is rescued RescueAfter after the
	// work began, not at once for the old echo.
	logger := klog.FromContext(ctx)
	var keepAlivePeriod time.Duration
	if c.cfg.QUIC != nil {
		keepAlivePeriod = c.cfg.QUIC.KeepAlivePeriod
	}
	keepAlive := func() {
		if sending.CompareAndSwap(false, true) {
			wg.Go(func() {
				defer sending.Store(false)
				_ = liveness.SendKeepAlive(conn, &c.liveness)
			})
		}
	}
	var ackDue bool          // idle: a keep-alive is waiting for any packet from the server
	var rxAtKeepAlive uint64 // packets received when it went out
	mark := c.cfg.Registry.Activity()
	lastWork, watching := time.Now(), time.Now()
	active := true
	// suspectSince: the path went silent and no echo came since (zero:
	// none). lastRx is the count of packets received, lastRxAt when it last
	// grew (or the heartbeats started).
	var suspectSince time.Time
	var lastRx uint64
	var lastRxAt time.Time
	var tickC <-chan time.Time = tick.C
	move := func() {
		if moveTo != nil && !busy {
			// The route changed: validate a path the new way and switch to it now.
			busy, lastWork = true, time.Now()
			ch := *moveTo
			moveTo = nil
			rescuing.Go(func() {
				r.migrate(mctx, ch)
				done <- struct{}{}
			})
		}
	}
	for {
		select {
		case <-mctx.Done():
			return
		case ch := <-roam:
			moveTo = &ch
			move()
		case <-done:
			busy = false
			move()
		case <-sess.Waker.C():
			now := time.Now()
			lastWork, mark = now, c.cfg.Registry.Activity()
			if !active { // (a Wake between an Arm and its Disarm finds it active)
				active, tickC, watching, ackDue = true, tick.C, now, false
				tick.Reset(interval)
				heartbeat()
				logger.V(4).Info("Connection has work; heartbeats on")
			}
		case now := <-tickC:
			if !active {
				m := c.cfg.Registry.Activity()
				switch {
				case m != mark:
					// Bytes moved and did not wake us (a closed tunnel's).
				case ackDue && conn.ConnectionStats().PacketsReceived > rxAtKeepAlive:
					ackDue = false // the keep-alive was answered
					tick.Reset(max(keepAlivePeriod*9/10-c.cfg.RescueAfter, keepAlivePeriod/10, time.Millisecond))
					continue
				case !ackDue:
					// A keep-alive period passed without work. Nothing
					// answered in RescueAfter means a dead path or a
					// restarted server whose reset was lost (quic-go sends
					// one per packet only while its queue, 256 with our
					// patch 0010, has room): heartbeats then, each padded
					// to draw a reset.
					keepAlive()
					ackDue, rxAtKeepAlive = true, conn.ConnectionStats().PacketsReceived
					tick.Reset(c.cfg.RescueAfter)
					continue
				default:
					logger.V(2).Info("Keep-alive not answered; heartbeats on", "waited", c.cfg.RescueAfter)
				}
				sess.Waker.Disarm()
				ackDue = false
				active, watching = true, now
				tick.Reset(interval)
			}
			if m := c.cfg.Registry.Activity(); m != mark {
				mark, lastWork = m, now
			}
			// An echo since the path went silent clears the suspicion
			// before anything else: the tick that finds the path answering
			// after a blackout may also find the connection idle, and a
			// suspicion left standing through the idle spell would send the
			// next new tunnel over TCP (fallback.go).
			heard := recv.LastEcho()
			if !suspectSince.IsZero() && heard.After(suspectSince) {
				suspectSince = time.Time{}
				c.fb.quicSuspect(l.m, false) // the path answers again
			}
			echo := heard
			if echo.Before(watching) {
				echo = watching
			}
			c.steerLink(logger, l, now, now.Sub(echo))
			// Idle also needs an echo since the heartbeats started, recent
			// enough that no rescue is due: a tunnel that opened onto a path
			// that died while idle moves no bytes, and must not send the
			// heartbeats back to sleep before its rescue.
			if !busy && now.Sub(lastWork) > c.cfg.IdleAfter && heard.After(watching) && now.Sub(heard) < c.cfg.RescueAfter {
				// Arm first, then look once more: work that began before
				// the Waker was armed shows in the mark, work after it wakes.
				sess.Waker.Arm()
				if m := c.cfg.Registry.Activity(); m != mark {
					sess.Waker.Disarm()
					mark, lastWork = m, now
				} else {
					active = false
					if keepAlivePeriod > 0 {
						ackDue = false
						tick.Reset(max(keepAlivePeriod*9/10, time.Millisecond))
					} else {
						tickC = nil
						tick.Stop()
					}
					logger.V(4).Info("Connection idle; heartbeats off", "idleFor", now.Sub(lastWork))
					continue
				}
			}
			heartbeat()
			if rx := conn.ConnectionStats().PacketsReceived; rx != lastRx || lastRxAt.Before(watching) {
				lastRx, lastRxAt = rx, now
			}
			// New tunnels go over TCP (fallback.go) while the path is
			// silent: no echo and not a single packet for RescueAfter. A
			// server that still sends something (acknowledgements, late
			// echoes) is reached over UDP but slow, a crowd reconnecting
			// after its restart: a TCP and TLS handshake of every client
			// would only add to its load. Echoes late beyond
			// suspectLateEchoes count as silence (UDP throttled to a trickle).
			if silentFor, lateFor := now.Sub(lastRxAt), now.Sub(echo); suspectSince.IsZero() && lateFor > c.cfg.RescueAfter &&
				(silentFor > c.cfg.RescueAfter || lateFor > suspectLateEchoes) {
				suspectSince = now
				c.fb.quicSuspect(l.m, true)
			}
			if !busy && now.Sub(echo) > c.cfg.RescueAfter && now.Sub(r.lastSwitch) > c.cfg.RescueAfter {
				busy = true
				lastWork = now
				rescuing.Go(func() {
					r.rescue(mctx, recv)
					done <- struct{}{}
				})
			}
		}
	}
}

// rescuer owns the extra sockets of one connection. They must live as long
// as the connection: closing a quic.Transport destroys every connection that
// ever used it.
type rescuer struct {
	c          *Client
	conn       *quic.Conn
	transports []*quic.Transport // [0] dialed the connection; at most one more
	udp        []*net.UDPConn
	active     int
	lastSwitch time.Time
}

func (r *rescuer) close() {
	for _, t := range r.transports[1:] {
		_ = t.Close()
	}
	for _, u := range r.udp {
		_ = u.Close()
	}
}

// other returns a transport other than the active one, creating the spare socket once.
func (r *rescuer) other(logger klog.Logger) (int, error) {
	if len(r.transports) == 1 {
		// Same address family and local address as the main socket, new port; a
		// wildcard main socket gets a wildcard dual-stack one.
		network, laddr := "udp", &net.UDPAddr{}
		if ua, ok := r.transports[0].Conn.LocalAddr().(*net.UDPAddr); ok && !ua.IP.IsUnspecified() {
			laddr.IP = ua.IP
			network = "udp6"
			if ua.IP.To4() != nil {
				network = "udp4"
			}
		}
		u, err := net.ListenUDP(network, laddr)
		if err != nil {
			return 0, fmt.Errorf("rescue socket: %w", err)
		}
		r.udp = append(r.udp, u)
		var pc net.PacketConn = u
		if r.c.cfg.WrapConn != nil {
			pc = r.c.cfg.WrapConn(u)
		}
		r.transports = append(r.transports, &quic.Transport{Conn: sendErrorsAsLoss(pc, logger)})
	}
	return 1 - r.active, nil
}

// rescue probes one new path until it validates, the link recovers by itself
// (a heartbeat echo arrives), or ctx ends.
func (r *rescuer) rescue(ctx context.Context, recv *liveness.Receiver) {
	logger := klog.FromContext(ctx)
	m := r.c.cfg.Metrics
	idx, err := r.other(logger)
	if err != nil {
		m.PathRescuesTotal.WithLabelValues("error").Inc()
		logger.Error(err, "Could not open a socket for path rescue")
		return
	}
	path, err := r.conn.AddPath(r.transports[idx])
	if err != nil {
		m.PathRescuesTotal.WithLabelValues("error").Inc()
		logger.V(2).Info("Could not add a path", "err", err)
		return
	}
	start := time.Now()
	logger.V(2).Info("No heartbeat echo; probing a new path", "quiet", time.Since(recv.LastEcho()))
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err = path.Probe(pctx) // each call sends a PATH_CHALLENGE at once
		cancel()
		if err == nil {
			break
		}
		if time.Since(recv.LastEcho()) < r.c.cfg.RescueAfter {
			// The old path came back by itself.
			_ = path.Close()
			m.PathRescuesTotal.WithLabelValues("recovered").Inc()
			return
		}
	}
	if ctx.Err() != nil {
		_ = path.Close()
		return
	}
	if err := path.Switch(); err != nil {
		_ = path.Close()
		m.PathRescuesTotal.WithLabelValues("error").Inc()
		logger.V(2).Info("Could not switch path", "err", err)
		return
	}
	r.active = idx
	r.lastSwitch = time.Now()
	m.PathRescuesTotal.WithLabelValues("switched").Inc()
	m.PathSwitchesTotal.WithLabelValues(metrics.SwitchBlackout).Inc()
	logger.V(2).Info("Switched to a new path after a blackout", "localAddress", r.transports[idx].Conn.LocalAddr().String(),
		"probing", time.Since(start))
}

// deadAfter is how long a connection goes without a heartbeat echo, while
// another server is healthy, before the client gives up on it.
func (c *Client) deadAfter() time.Duration { return 3 * c.cfg.RescueAfter }

// steerLink records whether l is stalled (quiet: the time since the last
// heartbeat echo, or since the heartbeats started), and closes its connection
// with CodeTimeout once quiet for deadAfter while another server is healthy.
func (c *Client) steerLink(logger klog.Logger, l *link, now time.Time, quiet time.Duration) {
	stalled := quiet > c.cfg.RescueAfter
	was := l.stalled.Swap(stalled)
	defer c.resteer()
	if !stalled {
		if was {
			logger.V(2).Info("Server answers heartbeats again", "server", l.m.srv.label)
		}
		return
	}
	l.m.srv.markBad(now)
	if len(c.servers) == 1 {
		return
	}
	if !was {
		logger.V(2).Info("Server stopped answering heartbeats; new tunnels go to another server", "server", l.m.srv.label, "quiet", quiet)
	}
	if quiet < c.deadAfter() || !c.otherServerHealthy(l.m.srv) {
		return
	}
	logger.Info("Server stopped answering; closing its connection, its tunnels are reset and new ones go to another server",
		"server", l.m.srv.label, "quiet", quiet.Round(time.Millisecond), "tunnels", l.active.Load())
	_ = l.Conn.CloseWithError(proto.CodeTimeout.ApplicationErrorCode(), "server stopped answering")
}

// otherServerHealthy reports whether a server other than s is healthy.
func (c *Client) otherServerHealthy(s *server) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range c.servers {
		if o != s && serverHealthy(o) {
			return true
		}
	}
	return false
}
