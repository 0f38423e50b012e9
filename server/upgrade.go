package server

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/handover"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/tunnel"
)

// HandOverFunc gives the tunnels of an upgrade to the new process
// (handover.Conn.SendTunnels and the wait for its answer); the files in
// them are closed after it returns.
type HandOverFunc = handover.SendFunc

type handoverReq struct {
	steps handover.Steps
	done  chan error
}

// ErrNotServing is returned by HandOver when Run ended before it took the
// request.
var ErrNotServing = handover.ErrNotServing

// HandOver hands the running server over to its successor (an upgrade),
// as HandOverSteps with send alone: the successor serves only once it has
// the tunnels.
func (s *Server) HandOver(ctx context.Context, send HandOverFunc) error {
	return s.HandOverSteps(ctx, handover.Steps{Send: send})
}

// HandOverSteps hands the running server over to its successor (an
// upgrade): Run stops accepting, resets the tunnels that are not
// resumable (as the end of a drain does), stops reading the UDP socket,
// closes every connection with proto.UpgradeReason (clients reconnect at
// once, and their resumable tunnels park), closes its QUIC transport once
// the closes are sent, and calls steps.Released (if set: the successor
// serves the socket from then on); then it exports the parked tunnels
// (resume.Table.Export) and calls steps.Send with them, saves the
// accounting's last totals and calls steps.Saved (if set); then Run
// returns (the first error, or nil). Without Released the totals are
// saved before Send (the successor reads them as it imports). HandOverSteps
// returns that error, or ErrNotServing if Run did not take the request
// before ctx ended (it is draining, or gone).
func (s *Server) HandOverSteps(ctx context.Context, steps handover.Steps) error {
	req := handoverReq{steps: steps, done: make(chan error, 1)}
	select {
	case s.handover <- req:
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrNotServing, ctx.Err())
	}
	return <-req.done
}

// closesSentTimeout bounds the wait for the connections' closes to be
// written before the socket is released.
const closesSentTimeout = time.Second

// handOver is Run's end in an upgrade, once the listeners are closed: see
// HandOverSteps. Each step's time since the start is logged.
func (s *Server) handOver(logger klog.Logger, tr *quic.Transport, cancelConns func(), conns *sync.WaitGroup, steps handover.Steps) error {
	if steps.Send == nil {
		steps.Send = func([]handover.Tunnel) error { return nil }
	}
	times := newStepTimes()
	s.cfg.Registry.AbortWhere(proto.CodeShutdown, func(t *tunnel.Tunnel) bool { return !t.Resumable })
	nconns, _ := s.countConns()
	logger.Info("Upgrading: closing connections; their clients re-attach their resumable tunnels to the new process",
		"connections", nconns, "tunnels", s.cfg.Registry.Len())
	// Stop reading the socket before the clients learn of the close: the
	// first packets of their new connections are for the new process (the
	// old one would drop them, and the clients would resend only after a
	// probe timeout). quic-go's reader looks again every millisecond until
	// the transport is closed below (our patch 0014: it spun on the
	// expired deadline, which took half the CPU of a daemon pinned to one
	// from the closes and the hand-over, or with GOMAXPROCS 1 held them up
	// until the next preemption: 58 ms to send one close).
	_ = s.pc.SetReadDeadline(time.Unix(1, 0))
	cancelConns() // each connection closes with UpgradeReason
	s.waitClosesSent(closesSentTimeout)
	times.mark("closesSent")
	// Its reader has returned once Close does: from now on only the new
	// process reads the socket (never both at once), and the closes went
	// out before it can answer a packet of these connections.
	_ = tr.Close()
	times.mark("transportClosed")
	if steps.Released != nil {
		if err := steps.Released(); err != nil {
			return s.handOverFailed(logger, conns, times, fmt.Errorf("tell the new process the socket is released: %w", err))
		}
		times.mark("released")
	}
	conns.Wait() // the resumable tunnels have parked
	times.mark("parked")
	var states []*resume.State
	if r := s.cfg.Resume; r != nil {
		states = r.Table.Export()
	}
	times.mark("exported")
	s.cfg.Registry.AbortAll(proto.CodeShutdown) // what could not be handed over
	if steps.Saved == nil {
		s.saveFinalUsage(logger)
		times.mark("usageSaved")
	}
	n, err := handover.SendStates(states, steps.Send)
	times.mark("sent")
	if err != nil {
		return err
	}
	if steps.Saved != nil {
		// Off the clients' path: the new process serves and re-attaches
		// the tunnels meanwhile, and reads the totals once told.
		s.saveFinalUsage(logger)
		times.mark("usageSaved")
		if err := steps.Saved(); err != nil {
			return err
		}
		times.mark("answered")
	}
	logger.Info("Handed the server over to the new process", append([]any{"tunnels", n}, times.kv()...)...)
	return nil
}

// handOverFailed ends a handover that failed after the connections were
// closed: the parked tunnels are given up, the accounting saved.
func (s *Server) handOverFailed(logger klog.Logger, conns *sync.WaitGroup, times *stepTimes, err error) error {
	conns.Wait()
	if r := s.cfg.Resume; r != nil {
		r.Table.Close()
	}
	s.cfg.Registry.AbortAll(proto.CodeShutdown)
	s.saveFinalUsage(logger)
	logger.Info("Upgrade: the handover failed after the connections were closed", append([]any{"err", err}, times.kv()...)...)
	return err
}

// waitClosesSent waits, at most d, until every QUIC connection has
// written its close (a quic.Conn's context ends once its
// CONNECTION_CLOSE is sent).
func (s *Server) waitClosesSent(d time.Duration) {
	conns := s.quicConns()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for _, q := range conns {
		select {
		case <-q.Context().Done():
		case <-timer.C:
			return
		}
	}
}

// stepTimes records when each step of a handover ended, since its start.
type stepTimes struct {
	start time.Time
	kvs   []any
}

func newStepTimes() *stepTimes { return &stepTimes{start: time.Now()} }

// mark records step as ended now.
func (st *stepTimes) mark(step string) {
	st.kvs = append(st.kvs, step, time.Since(st.start).Round(100*time.Microsecond))
}

// kv are the steps as log key/values.
func (st *stepTimes) kv() []any { return st.kvs }

// saveFinalUsage writes the accounting's last totals before the new
// process reads them: the tunnels handed over were accounted here up to
// now (their new process counts from there), the others are ending
// (bounded wait). Nothing is saved here after it.
func (s *Server) saveFinalUsage(logger klog.Logger) {
	u := s.cfg.Usage
	if u == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = s.cfg.Registry.WaitEmpty(ctx)
	cancel()
	if err := u.SaveFinal(); err != nil {
		logger.Error(err, "Upgrading: could not save the accounting's last totals; the new process reads the last saved ones")
	}
}

// HandoverLimits are the bounds of what this server takes from its
// predecessor in an upgrade: at most its maximum of resumable tunnels,
// each within the resume cap (plus one read), all within its resume
// budget; nothing without resumable tunnels.
func (s *Server) HandoverLimits() handover.Limits {
	r := s.cfg.Resume
	if r == nil {
		return handover.Limits{}
	}
	return handover.LimitsOf(&r.Settings, cmp.Or(r.Max, egress.DefaultMaxResumable))
}

// Import continues the tunnels the previous process handed over (call it
// before Run): LoadUsage, then ImportTunnels.
func (s *Server) Import(ctx context.Context, tunnels []handover.Tunnel) (int, error) {
	s.LoadUsage(ctx)
	return s.ImportTunnels(ctx, tunnels)
}

// BeginImport tells Run that the tunnels of the previous process are
// coming (an upgrade's new process serves before it has them): until end
// is called, a re-attachment whose tunnel is not held yet waits for it
// instead of being refused (resume.Table.BeginImport).
func (s *Server) BeginImport() (end func()) {
	if r := s.cfg.Resume; r != nil {
		return r.Table.BeginImport()
	}
	return func() {}
}

// LoadUsage reads the accounting's totals the previous process saved last
// (usage.Config.Deferred); they add up with what this process counted
// meanwhile.
func (s *Server) LoadUsage(ctx context.Context) {
	if u := s.cfg.Usage; u != nil {
		if err := u.LoadDeferred(); err != nil {
			klog.FromContext(ctx).Error(err, "Upgrade: could not read the accounting's totals; counting from zero")
		}
	}
}

// ImportTunnel continues one tunnel the previous process handed over
// (while Run runs, after BeginImport: as each arrives), parked in the
// resume Table; a re-attachment waiting for it goes on. On error it is
// reset.
func (s *Server) ImportTunnel(ctx context.Context, t handover.Tunnel) error {
	logger := klog.FromContext(ctx)
	return handover.ImportOne(&t, func(st *resume.State, t *tunnel.Tunnel) error {
		return s.egress.ImportResumable(st, t, logger)
	})
}

// ImportTunnels continues the tunnels the previous process handed over
// (before Run, or while it runs after BeginImport): each is parked in the
// resume Table for its client's re-attachment. It returns how many it
// took; the others (over the budget, a duplicate ID) are reset and their
// errors joined.
func (s *Server) ImportTunnels(ctx context.Context, tunnels []handover.Tunnel) (int, error) {
	logger := klog.FromContext(ctx)
	return handover.ImportAll(tunnels, func(st *resume.State, t *tunnel.Tunnel) error {
		return s.egress.ImportResumable(st, t, logger)
	})
}
