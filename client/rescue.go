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
	"github.com/quictun/quictun/pkg/tunnel"
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
			_ = conn.CloseWithError(proto.CodeShutdown.ApplicationErrorCode(), closeReason(ctx))
		}
	}()
	if !conn.ConnectionState().SupportsDatagrams.Remote {
		klog.FromContext(ctx).V(2).Info("Server does not support datagrams; heartbeats and tail probes are off")
		<-mctx.Done()
		return
	}
	recv := liveness.NewReceiver(conn, false, 0, &c.liveness)
	rs := []dgram.Registrar{recv, l.Flows}
	if r := c.cfg.Resume; r != nil {
		rs = append(rs, r.Table.Acks(l.Conn)) // the Conn of the tunnels' attachments (ingress.Session.Conn)
	}
	wg.Go(func() { dgram.Serve(mctx, conn, recv.Invalid, c.cfg.Metrics.UDP.ReceiveQueueDrops, rs...) })
	wg.Go(func() { l.Prober.Run(mctx) })
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
			_ = conn.CloseWithError(proto.CodeShutdown.ApplicationErrorCode(), closeReason(ctx))
		}
		r.close()
	}()
	w := newWatch(c, l, recv, r, &wg, klog.FromContext(ctx))
	defer w.tick.Stop()
	defer w.rescuing.Wait()
	roam := c.watchRoute(mctx, &wg, conn.RemoteAddr()) // route changes (roam.go); nil when off
	for {
		select {
		case <-mctx.Done():
			return
		case ch := <-roam:
			w.routeChanged(mctx, ch)
		case <-w.done:
			w.rescueDone(mctx)
		case <-l.Waker.C():
			w.workSeen(time.Now())
		case now := <-w.tickC:
			w.tickAt(mctx, now)
		}
	}
}

// watch is the liveness state of one QUIC link, owned by monitor's loop,
// which calls one method per event: workSeen (the data path woke an idle
// link), tickAt (heartbeat or keep-alive tick: echoes, stall, suspicion,
// rescue), routeChanged and rescueDone.
//
// Heartbeats go out only while the connection has work: a tunnel opening,
// bytes moving in the last IdleAfter, a rescue, or no recent echo. Idle,
// the ticker slows to the keep-alive period and the session's Waker is
// armed: the data path wakes the loop as a tunnel opens or bytes move (an
// idle ssh session that comes back to life), and one keep-alive datagram a
// period (liveness.SendKeepAlive: padded so a restarted server answers it
// with a stateless reset, which quic-go's own PING is too short to draw)
// is all that crosses the network: it goes every nine tenths of the
// period, before quic-go's own keep-alive (the period after the last
// packet received) would, whose timer its acknowledgement restarts.
// watching is when the heartbeats last started: a path that died while
// idle is rescued RescueAfter after the work began, not at once for the
// old echo.
type watch struct {
	c      *Client
	l      *link
	conn   quicConn
	recv   *liveness.Receiver
	r      *rescuer
	wg     *sync.WaitGroup // the sends, owned by monitor
	logger klog.Logger

	interval, keepAlivePeriod time.Duration
	tick                      *time.Ticker
	tickC                     <-chan time.Time // nil: stopped (idle without keep-alives)

	seq     uint64
	sending atomic.Bool // a heartbeat or keep-alive is being handed to quic-go

	// busy: a rescue or move runs (under rescuing) and reports on done;
	// moveTo is a route change waiting for it.
	busy     bool
	rescuing sync.WaitGroup
	done     chan struct{}
	moveTo   *routeChange

	active bool // heartbeats on
	// ackDue: idle, a keep-alive is waiting for any packet from the
	// server, which had received rxAtKeepAlive when it went out.
	ackDue        bool
	rxAtKeepAlive uint64
	mark          tunnel.Activity // the registry's activity mark last seen
	lastWork      time.Time
	watching      time.Time
	// suspectSince: the path went silent and no echo came since (zero:
	// none). lastRx is the count of packets received, lastRxAt when it
	// last grew (or the heartbeats started).
	suspectSince time.Time
	lastRx       uint64
	lastRxAt     time.Time
}

func newWatch(c *Client, l *link, recv *liveness.Receiver, r *rescuer, wg *sync.WaitGroup, logger klog.Logger) *watch {
	w := &watch{c: c, l: l, conn: l.conn, recv: recv, r: r, wg: wg, logger: logger,
		interval: c.cfg.HeartbeatInterval, done: make(chan struct{}, 1), active: true,
		mark: c.cfg.Registry.Activity(), lastWork: time.Now(), watching: time.Now()}
	if c.cfg.QUIC != nil {
		w.keepAlivePeriod = c.cfg.QUIC.KeepAlivePeriod
	}
	w.tick = time.NewTicker(w.interval)
	w.tickC = w.tick.C
	return w
}

// send hands one datagram to quic-go on a goroutine: never block the
// loop, a stuck send skips heartbeats rather than the rescue and the
// shutdown.
func (w *watch) send(f func()) {
	if w.sending.CompareAndSwap(false, true) {
		w.wg.Go(func() {
			defer w.sending.Store(false)
			f()
		})
	}
}

func (w *watch) heartbeat() {
	w.seq++
	n := w.seq
	w.send(func() { _ = liveness.SendHeartbeat(w.conn, n, &w.c.liveness) })
}

func (w *watch) keepAlive() {
	w.send(func() { _ = liveness.SendKeepAlive(w.conn, &w.c.liveness) })
}

// workSeen: the data path woke an idle link (a Wake between an Arm and
// its Disarm finds it active).
func (w *watch) workSeen(now time.Time) {
	w.lastWork, w.mark = now, w.c.cfg.Registry.Activity()
	if !w.active {
		w.active, w.tickC, w.watching, w.ackDue = true, w.tick.C, now, false
		w.tick.Reset(w.interval)
		w.heartbeat()
		w.logger.V(4).Info("Connection has work; heartbeats on")
	}
}

// routeChanged: the route to the server changed; the path moves as soon
// as no rescue or move runs.
func (w *watch) routeChanged(ctx context.Context, ch routeChange) {
	w.moveTo = &ch
	w.move(ctx)
}

// rescueDone: the rescue or move in progress ended.
func (w *watch) rescueDone(ctx context.Context) {
	w.busy = false
	w.move(ctx)
}

// move validates a path the new way and switches to it now, if a route
// change waits and nothing else runs.
func (w *watch) move(ctx context.Context) {
	if w.moveTo == nil || w.busy {
		return
	}
	w.busy, w.lastWork = true, time.Now()
	ch := *w.moveTo
	w.moveTo = nil
	w.rescuing.Go(func() {
		w.r.migrate(ctx, ch)
		w.done <- struct{}{}
	})
}

// tickAt: a tick of the ticker. Idle, it runs the keep-alive (idleTick);
// with heartbeats on it looks at the echoes (echoSeen, steerLink), goes
// idle when there has been no work for IdleAfter (sleep), else sends a
// heartbeat, then marks the link whether the path is silent (suspect)
// and starts a rescue when no echo came for RescueAfter.
func (w *watch) tickAt(ctx context.Context, now time.Time) {
	if !w.active && !w.idleTick(now) {
		return
	}
	if m := w.c.cfg.Registry.Activity(); m != w.mark {
		w.mark, w.lastWork = m, now
	}
	heard := w.recv.LastEcho()
	w.echoSeen(heard)
	echo := heard
	if echo.Before(w.watching) {
		echo = w.watching
	}
	w.c.steerLink(w.logger, w.l, now, now.Sub(echo))
	if w.sleep(now, heard) {
		return
	}
	w.heartbeat()
	if rx := w.conn.ConnectionStats().PacketsReceived; rx != w.lastRx || w.lastRxAt.Before(w.watching) {
		w.lastRx, w.lastRxAt = rx, now
	}
	w.suspect(now, echo)
	if !w.busy && now.Sub(echo) > w.c.cfg.RescueAfter && now.Sub(w.r.lastSwitch) > w.c.cfg.RescueAfter {
		w.busy, w.lastWork = true, now
		w.rescuing.Go(func() {
			w.r.rescue(ctx, w.recv)
			w.done <- struct{}{}
		})
	}
}

// idleTick is a tick of an idle link: it sends a keep-alive, notes its
// answer, and reports whether the heartbeats start again (bytes moved, or
// the keep-alive was not answered in RescueAfter).
func (w *watch) idleTick(now time.Time) bool {
	c := w.c
	switch {
	case c.cfg.Registry.Activity() != w.mark:
		// Bytes moved and did not wake us (a closed tunnel's).
	case w.ackDue && w.conn.ConnectionStats().PacketsReceived > w.rxAtKeepAlive:
		w.ackDue = false // the keep-alive was answered
		w.tick.Reset(max(w.keepAlivePeriod*9/10-c.cfg.RescueAfter, w.keepAlivePeriod/10, time.Millisecond))
		return false
	case !w.ackDue:
		// A keep-alive period passed without work. Nothing answered in
		// RescueAfter means a dead path or a restarted server whose reset
		// was lost (quic-go sends one per packet only while its queue, 256
		// with our patch 0010, has room): heartbeats then, each padded to
		// draw a reset.
		w.keepAlive()
		w.ackDue, w.rxAtKeepAlive = true, w.conn.ConnectionStats().PacketsReceived
		w.tick.Reset(c.cfg.RescueAfter)
		return false
	default:
		w.logger.V(2).Info("Keep-alive not answered; heartbeats on", "waited", c.cfg.RescueAfter)
	}
	w.l.Waker.Disarm()
	w.ackDue = false
	w.active, w.watching = true, now
	w.tick.Reset(w.interval)
	return true
}

// echoSeen: an echo since the path went silent clears the suspicion
// before anything else: the tick that finds the path answering after a
// blackout may also find the connection idle, and a suspicion left
// standing through the idle spell would send the next new tunnel over TCP
// (fallback.go).
func (w *watch) echoSeen(heard time.Time) {
	if !w.suspectSince.IsZero() && heard.After(w.suspectSince) {
		w.suspectSince = time.Time{}
		w.l.suspect.Store(false) // the path answers again
		w.c.sessionsChanged()
	}
}

// sleep stops the heartbeats and reports true when the link has had no
// work for IdleAfter and an echo since the heartbeats started, recent
// enough that no rescue is due: a tunnel that opened onto a path that died
// while idle moves no bytes, and must not send the heartbeats back to
// sleep before its rescue.
func (w *watch) sleep(now, heard time.Time) bool {
	c := w.c
	if w.busy || now.Sub(w.lastWork) <= c.cfg.IdleAfter || !heard.After(w.watching) || now.Sub(heard) >= c.cfg.RescueAfter {
		return false
	}
	// Arm first, then look once more: work that began before the Waker
	// was armed shows in the mark, work after it wakes.
	w.l.Waker.Arm()
	if m := c.cfg.Registry.Activity(); m != w.mark {
		w.l.Waker.Disarm()
		w.mark, w.lastWork = m, now
		return false
	}
	w.active = false
	if w.keepAlivePeriod > 0 {
		w.ackDue = false
		w.tick.Reset(max(w.keepAlivePeriod*9/10, time.Millisecond))
	} else {
		w.tickC = nil
		w.tick.Stop()
	}
	w.logger.V(4).Info("Connection idle; heartbeats off", "idleFor", now.Sub(w.lastWork))
	return true
}

// suspect marks the link's path silent (link.suspect): no echo and not a
// single packet for RescueAfter. Its server's TCP row is then wanted, and
// new tunnels go over TCP (fallback.go, pick). A
// server that still sends something (acknowledgements, late echoes) is
// reached over UDP but slow, a crowd reconnecting after its restart: a TCP
// and TLS handshake of every client would only add to its load. Echoes
// late beyond suspectLateEchoes count as silence (UDP throttled to a
// trickle).
func (w *watch) suspect(now, echo time.Time) {
	after := w.c.cfg.RescueAfter
	silentFor, lateFor := now.Sub(w.lastRxAt), now.Sub(echo)
	if w.suspectSince.IsZero() && lateFor > after && (silentFor > after || lateFor > suspectLateEchoes) {
		w.suspectSince = now
		w.l.suspect.Store(true)
		w.c.sessionsChanged()
	}
}

// rescuer owns the extra sockets of one connection. They must live as long
// as the connection: closing a quic.Transport destroys every connection that
// ever used it.
type rescuer struct {
	c          *Client
	conn       quicConn
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
	path, err := r.conn.addPath(r.transports[idx])
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
