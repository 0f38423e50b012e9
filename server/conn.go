package server

import (
	"context"
	"crypto/tls"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/dgram"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/liveness"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/udpflow"
)

// serveConn serves one accepted QUIC connection until it ends: admit it
// within the connection limits, register it, start its datagram
// goroutines and its authentication deadline, accept its streams (each
// served by egress on a goroutine of its own), then wait for them and
// record how it ended. Each step is a method of conn. sourceHeld: the
// connection already holds its place among its source's connections
// (MaxConnsPerSource; a TCP connection takes it at accept), which
// serveConn takes over and gives back.
func (s *Server) serveConn(ctx context.Context, tc tunnelConn, sourceHeld bool) {
	c := &conn{s: s, tc: tc, id: s.nextConnID.Add(1), src: sourceIP(tc.RemoteAddr()), sourceHeld: sourceHeld}
	c.logger = klog.LoggerWithValues(klog.FromContext(ctx), "connID", c.id, "remoteAddress", tc.RemoteAddr().String())
	if !c.admit(ctx) {
		return
	}
	defer c.release()
	ctx = klog.NewContext(ctx, c.logger)
	c.register()
	stop := context.AfterFunc(ctx, func() {
		reason := proto.ShutdownReason(time.Duration(s.reconnectSpread.Load()))
		if s.upgrading.Load() {
			reason = proto.UpgradeReason // the new process serves them at once: no spread
		}
		_ = tc.CloseWithError(proto.CodeShutdown.ApplicationErrorCode(), reason)
	})
	c.startDatagrams()
	c.startAuthDeadline()
	acceptErr := c.acceptStreams(ctx)
	c.streams.Wait()
	stop()
	c.gate.stopDeadline()
	c.closed(acceptErr)
}

// conn is one connection being served (QUIC, or TCP: the fallback for
// clients whose UDP is blocked), and what its steps share.
type conn struct {
	s   *Server
	tc  tunnelConn
	id  uint64
	src string // its source, as the per-source limits count it
	// sourceHeld: it held its place among src's connections before
	// admit (taken at accept, for TCP).
	sourceHeld bool
	logger     klog.Logger

	// gate is what the connection may hold before it has proven the secret.
	gate *connGate
	// flows routes its UDP flows' datagrams; prober sends its tail-loss
	// probes (nil: the client has no datagram support).
	flows  *udpflow.Table
	prober *liveness.TailProber
	// streams are the goroutines the connection started (its streams, its
	// datagram reader and prober).
	streams sync.WaitGroup
	// accounted ends the connection's count among its identity's
	// (identified; nil: not counted).
	accounted atomic.Pointer[func()]
}

// admit takes the connection's place within MaxConnections and
// MaxConnsPerSource (unless it holds that one already), or refuses it
// with overloaded, giving back what it held.
func (c *conn) admit(ctx context.Context) bool {
	s := c.s
	if n := s.active.Add(1); n > int64(s.cfg.MaxConnections) {
		s.active.Add(-1)
		if c.sourceHeld {
			s.limits.closed(c.src, time.Now())
		}
		s.cfg.Metrics.RefusedConnectionsTotal.WithLabelValues(metrics.RefusedMaxConnections).Inc()
		c.logger.V(2).Info("Refused connection: the server is at its connection limit; raise --max-connections if clients need more", "limit", s.cfg.MaxConnections)
		refuseConn(ctx, c.tc, "server at its connection limit")
		return false
	}
	if !c.sourceHeld && !s.limits.open(c.src, time.Now()) {
		s.active.Add(-1)
		s.cfg.Metrics.RefusedConnectionsTotal.WithLabelValues("per_source_limit").Inc()
		c.logger.V(2).Info("Refused connection: too many from this address", "limit", s.cfg.MaxConnsPerSource)
		refuseConn(ctx, c.tc, "too many connections from this address")
		return false
	}
	return true
}

// release gives back what admit took.
func (c *conn) release() {
	c.s.limits.closed(c.src, time.Now())
	c.s.active.Add(-1)
}

// register makes the connection known (ConnStats) with its egress state.
func (c *conn) register() {
	s := c.s
	c.gate = &connGate{slots: make(chan struct{}, s.cfg.MaxUnverifiedStreamsPerConn), state: s.egress.NewConn()}
	s.mu.Lock()
	s.conns[c.id] = liveConn{conn: c.tc, state: c.gate.state, verified: &c.gate.verified}
	s.mu.Unlock()
	s.cfg.Metrics.ActiveConnections.Inc()
	if c.tc.asQUIC() == nil {
		s.cfg.Metrics.ActiveTCPConnections.Inc()
	}
	c.logger.V(2).Info("Accepted connection", "transport", transportOf(c.tc.asQUIC()), "used0RTT", c.tc.ConnectionState().Used0RTT)
}

// startDatagrams starts what runs beside the streams: the log line of a
// client certificate (mutual TLS), and with datagram support the
// connection's datagram reader (heartbeats, UDP flows) and its tail prober.
// A client without datagram support has its flows carried on their streams.
func (c *conn) startDatagrams() {
	s, conn, m := c.s, c.tc, c.s.cfg.Metrics
	if s.cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert {
		// With mutual TLS, say who connected once the handshake has shown it.
		c.streams.Go(func() {
			select {
			case <-conn.HandshakeComplete():
				c.logger.V(2).Info("Authenticated client certificate", "clientSubject", egress.ClientSubject(conn))
			case <-conn.Context().Done():
			}
		})
	}
	c.flows = udpflow.NewTable(m.UDP.Drop)
	if qc := c.tc.asQUIC(); qc != nil && qc.ConnectionState().SupportsDatagrams.Remote {
		c.prober = liveness.NewTailProber(qc, s.cfg.TailProbes, s.cfg.TailProbeDelay, &s.liveness).
			WithRTT(func() time.Duration { return qc.ConnectionStats().SmoothedRTT })
		recv := liveness.NewReceiver(qc, true, s.cfg.MaxEchoesPerSecond, &s.liveness)
		rs := []dgram.Registrar{recv, c.flows}
		if r := s.cfg.Resume; r != nil {
			rs = append(rs, r.Table.Acks(c.tc)) // the Conn of the tunnels' attachments (egress.Stream.Conn)
		}
		c.streams.Go(func() { dgram.Serve(qc.Context(), qc, recv.Invalid, m.UDP.ReceiveQueueDrops, rs...) })
		// No goroutine to wait for the end: a server holds thousands of idle connections.
		c.prober.StopWhenDone(qc.Context())
	}
}

// startAuthDeadline starts the connection's deadline to present a verified
// header (IdleAuthTimeout from now, AuthTimeout from its first stream).
// With mutual TLS or without authentication the handshake is all the proof
// there is: the connection starts verified, with no deadline.
func (c *conn) startAuthDeadline() {
	s, gate := c.s, c.gate
	gate.onVerified = func() { c.tc.verified(s.raiseStreamsTo); c.identified() }
	gate.verified.Store(s.egress.Keys().Len() == 0)
	if gate.verified.Load() {
		// Keys removed by a reload since the server started with the
		// smaller pre-authentication bounds: lift them now.
		c.tc.verified(s.raiseStreamsTo)
		// Its identity is its client certificate's (mutual TLS), which
		// an early connection (accepted for 0-RTT) shows only once its
		// handshake completes: account and cap it by it then. (It was
		// counted as anonymous, and its downloads paced by anonymous's
		// cap, not by its CN's.)
		c.streams.Go(func() {
			select {
			case <-c.tc.HandshakeComplete():
				c.identified()
			case <-c.tc.Context().Done():
			}
		})
		return
	}
	// Clients prove the secret at once (a hello): a connection that does
	// not is closed, streams or not.
	fired := atomic.Bool{}
	gate.deadlineAt = time.Now().Add(s.cfg.IdleAuthTimeout)
	gate.deadline = time.AfterFunc(s.cfg.IdleAuthTimeout, func() {
		if gate.verified.Load() || !fired.CompareAndSwap(false, true) {
			return
		}
		c.authTimedOut()
	})
}

// authTimedOut closes a connection that presented no verified header in
// time, with the code that tells its client what happened.
func (c *conn) authTimedOut() {
	s, gate, conn := c.s, c.gate, c.tc
	s.cfg.Metrics.PreauthRejectionsTotal.WithLabelValues(metrics.PreauthAuthTimeout).Inc()
	if gate.sawMAC.Load() {
		// Headers made with the secret, none of them fresh, new and
		// allowed (a client whose clock is off, or a leaked header):
		// timeout, not auth_failed, so a client with the secret does
		// not report its credentials as refused.
		c.logger.V(2).Info("Closed connection: its stream headers had a valid MAC but none was fresh, new and allowed in time",
			"authTimeout", s.cfg.AuthTimeout)
		_ = conn.CloseWithError(proto.CodeTimeout.ApplicationErrorCode(), "no fresh authenticated stream header in time")
		return
	}
	if gate.sawStream.Load() {
		c.logger.V(2).Info("Closed connection: no authenticated stream header in time", "authTimeout", s.cfg.AuthTimeout)
		_ = conn.CloseWithError(proto.CodeAuthFailed.ApplicationErrorCode(), "no authenticated stream header in time")
		return
	}
	// Most likely a client from before the hello that has had no tunnel
	// yet: timeout, not auth_failed, so it reconnects without reporting its
	// credentials as refused.
	c.logger.V(2).Info("Closed connection: it presented no authenticated stream header since its handshake; clients from before the hello reconnect",
		"idleAuthTimeout", s.cfg.IdleAuthTimeout)
	_ = conn.CloseWithError(proto.CodeTimeout.ApplicationErrorCode(), "no authenticated stream header since the handshake")
}

// acceptStreams accepts the connection's streams until it ends, each served
// on a goroutine of its own once it holds its place in the
// pre-authentication budget; it returns AcceptStream's error.
func (c *conn) acceptStreams(ctx context.Context) error {
	s, conn, m := c.s, c.tc, c.s.cfg.Metrics
	for {
		str, err := conn.AcceptStream(conn.Context())
		if err != nil {
			return err
		}
		early := !transport.HandshakeComplete(conn)
		if s.draining.Load() {
			egress.Reset(str, proto.CodeShutdown)
			m.StreamsTotal.WithLabelValues(proto.CodeShutdown.String()).Inc()
			continue
		}
		// The connection's budget of streams awaiting a verified header:
		// wait for a slot rather than start a goroutine per stream. A peer
		// with the secret frees slots in microseconds; one without holds
		// them until its headers time out or AuthTimeout closes it.
		select {
		case c.gate.slots <- struct{}{}:
		case <-conn.Context().Done():
			egress.Reset(str, proto.CodeShutdown)
			return conn.Context().Err()
		}
		release, ok := c.hold(str)
		if !ok {
			continue
		}
		c.goStream(func() { c.serveStream(ctx, str, early, release) })
	}
}

// goStream runs f, a stream's service, on one of the server's stream
// workers, counted among the connection's goroutines until it returns.
func (c *conn) goStream(f func()) {
	c.streams.Add(1)
	c.s.workers.Go(func() {
		defer c.streams.Done()
		f()
	})
}

// hold takes the places of a stream (whose connection slot is held) in the
// pre-authentication budgets of its source and of the server, if its
// connection is not verified yet; the returned func gives back all of them,
// once. A stream over a budget is refused (false).
func (c *conn) hold(str egress.TunnelStream) (release func(), ok bool) {
	s, gate := c.s, c.gate
	global := false
	releaseSource := func() {}
	if !gate.verified.Load() {
		// The source's share first, so that a source over it does not
		// touch the server-wide budget.
		if releaseSource, ok = s.limits.holdUnverified(c.src); !ok {
			<-gate.slots
			s.refuseUnverified(c.logger, str, metrics.PreauthSourceUnverifiedStreamsLimit,
				"Refused stream: too many streams from this address awaiting authentication; raise --max-unverified-streams-per-source if legitimate clients behind one address hit this",
				s.cfg.MaxUnverifiedStreamsPerSource)
			return nil, false
		}
		select {
		case s.unverified <- struct{}{}:
			global = true
		default:
			<-gate.slots
			releaseSource()
			s.refuseUnverified(c.logger, str, metrics.PreauthUnverifiedStreamsLimit,
				"Refused stream: too many streams awaiting authentication on the server; raise --max-unverified-streams if legitimate clients hit this",
				s.cfg.MaxUnverifiedStreams)
			return nil, false
		}
		if gate.sawStream.CompareAndSwap(false, true) && time.Until(gate.deadlineAt) > s.cfg.AuthTimeout {
			gate.deadline.Reset(s.cfg.AuthTimeout) // from the first stream
		}
	}
	s.cfg.Metrics.UnverifiedStreams.Inc()
	return sync.OnceFunc(func() {
		<-gate.slots
		if global {
			<-s.unverified
			releaseSource()
		}
		s.cfg.Metrics.UnverifiedStreams.Dec()
	}), true
}

// serveStream hands one stream to egress; its places in the
// pre-authentication budget are given back as soon as its header is
// verified (or it fails).
func (c *conn) serveStream(ctx context.Context, str egress.TunnelStream, early bool, release func()) {
	defer release() // a stream that fails before its header is verified
	gate := c.gate
	c.s.egress.Serve(ctx, egress.Stream{Conn: c.tc, ConnID: c.id, Stream: str, Early: early, Prober: c.prober, Conn0: gate.state,
		Flows: c.flows, Source: c.src,
		// On a connection that has proven the secret a valid MAC is
		// enough to free the slot (the rules may take a DNS lookup);
		// otherwise the header must also be fresh and not a replay.
		MACVerified: func() {
			gate.sawMAC.Store(true)
			if gate.verified.Load() {
				release()
			}
		},
		Verified: func() { gate.markVerified(); release() }})
}

// closed records how the connection ended and forgets it.
func (c *conn) closed(acceptErr error) {
	s, m := c.s, c.s.cfg.Metrics
	// AcceptStream can return the close error before quic-go cancels the
	// connection's context: then that error is the cause.
	cause := context.Cause(c.tc.Context())
	if cause == nil {
		cause = acceptErr
	}
	result := connResult(cause)
	m.ConnectionsTotal.WithLabelValues(result).Inc()
	m.ActiveConnections.Dec()
	qc := c.tc.asQUIC()
	if qc == nil {
		m.ActiveTCPConnections.Dec()
	}
	s.mu.Lock()
	delete(s.conns, c.id)
	s.mu.Unlock()
	c.unaccount()
	if s.cfg.QUICStat != nil && qc != nil {
		s.cfg.QUICStat.Closed(qc.ConnectionStats())
	}
	c.logger.V(2).Info("Closed connection", "result", result, "err", cause)
}
