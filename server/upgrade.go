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
	send HandOverFunc
	done chan error
}

// ErrNotServing is returned by HandOver when Run ended before it took the
// request.
var ErrNotServing = handover.ErrNotServing

// HandOver hands the running server over to its successor (an upgrade):
// Run stops accepting, resets the tunnels that are not resumable (as the
// end of a drain does), closes every connection with
// proto.UpgradeReason (clients reconnect at once, and their resumable
// tunnels park), exports the parked tunnels (resume.Table.Export), stops
// reading the UDP socket, and calls send with them; then Run returns
// (send's error, or nil). HandOver returns send's error, or ErrNotServing
// if Run did not take the request before ctx ended (it is draining, or
// gone).
func (s *Server) HandOver(ctx context.Context, send HandOverFunc) error {
	req := handoverReq{send: send, done: make(chan error, 1)}
	select {
	case s.handover <- req:
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrNotServing, ctx.Err())
	}
	return <-req.done
}

// handOver is Run's end in an upgrade, once the listeners are closed: see
// HandOver.
func (s *Server) handOver(logger klog.Logger, tr *quic.Transport, cancelConns func(), conns *sync.WaitGroup, send HandOverFunc) error {
	s.cfg.Registry.AbortWhere(proto.CodeShutdown, func(t *tunnel.Tunnel) bool { return !t.Resumable })
	nconns, _ := s.countConns()
	logger.Info("Upgrading: closing connections; their clients re-attach their resumable tunnels to the new process",
		"connections", nconns, "tunnels", s.cfg.Registry.Len())
	// Stop reading the socket before the clients learn of the close: the
	// first packets of their new connections must wait in the socket for
	// the new process (the old one would drop them, and the clients would
	// resend only after a probe timeout). Our reader spins on the expired
	// deadline until the transport is closed below (milliseconds); sending
	// the closes goes on.
	_ = s.pc.SetReadDeadline(time.Unix(1, 0))
	cancelConns() // each connection closes with UpgradeReason
	conns.Wait()  // the resumable tunnels have parked
	var states []*resume.State
	if r := s.cfg.Resume; r != nil {
		states = r.Table.Export()
	}
	_ = tr.Close()                              // from now on the new process reads the socket
	s.cfg.Registry.AbortAll(proto.CodeShutdown) // what could not be handed over
	s.saveFinalUsage(logger)
	n, err := handover.SendStates(states, send)
	if err != nil {
		return err
	}
	logger.Info("Handed the server over to the new process", "tunnels", n)
	return nil
}

// saveFinalUsage writes the accounting's last totals before the new
// process reads them (Import): the tunnels handed over were accounted here
// up to now (their new process counts from there), the others are ending
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
// before Run): each is parked in the resume Table for its client's
// re-attachment. It returns how many it took; the others (over the
// budget, a duplicate ID) are reset and their errors joined.
func (s *Server) Import(ctx context.Context, tunnels []handover.Tunnel) (int, error) {
	logger := klog.FromContext(ctx)
	if u := s.cfg.Usage; u != nil {
		// The previous process saved its last totals before it sent the
		// tunnels: read them now (usage.Config.Deferred).
		if err := u.LoadDeferred(); err != nil {
			logger.Error(err, "Upgrade: could not read the accounting's totals; counting from zero")
		}
	}
	return handover.ImportAll(tunnels, func(st *resume.State, t *tunnel.Tunnel) error {
		return s.egress.ImportResumable(st, t, logger)
	})
}
