package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/handover"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/tunnel"
)

// An upgrade of the client (issue 34, part 3): the old process hands its
// local entry points (the caller's, cmd/internal/cli) and its resumable
// tunnels, parked, to the new one, which has its own connections to the
// servers and re-attaches each tunnel there (pkg/ingress ImportResumable),
// as after a lost connection. The applications' connections stay open
// throughout.

type handoverReq struct {
	// send takes every tunnel once exported; each (if set: HandOverEach)
	// each tunnel as soon as it is.
	send handover.SendFunc
	each *handover.Sender
	done chan error
}

type importReq struct {
	tunnels []handover.Tunnel
	done    chan importResult
}

type importResult struct {
	n   int
	err error
}

// errUpgrading is the cause of the links' end in an upgrade.
var errUpgrading = errors.New("client upgrading")

// closeReason is the reason a connection is closed with once ctx, its
// link's, ended: the upgrade's (the server keeps what the new process
// takes over: its reverse forwards' listeners) or a shutdown.
func closeReason(ctx context.Context) string {
	if errors.Is(context.Cause(ctx), errUpgrading) {
		return proto.ClientUpgradeReason
	}
	return "client shutting down"
}

// settleTimeout bounds the wait for the resumable tunnels to park once the
// connections are closed (they park within milliseconds).
const settleTimeout = 5 * time.Second

// HandOver hands the running client over to its successor (an upgrade):
// Run closes its local entry points (the new process serves the same
// sockets), resets the tunnels that are not resumable (UDP flows, TCP
// fallback, reverse forwards) and closes its connections to the servers
// (the servers park the resumable tunnels), exports its own parked
// tunnels (resume.Table.Export) and calls send with them; then Run
// returns (send's error, or nil). HandOver returns send's error, or
// handover.ErrNotServing if Run did not take the request before ctx ended
// (it is draining, or gone).
func (c *Client) HandOver(ctx context.Context, send handover.SendFunc) error {
	return c.handOverReq(ctx, handoverReq{send: send, done: make(chan error, 1)})
}

// HandOverEach is HandOver sending each tunnel as soon as it is exported
// (handover.SendEach): the new process re-attaches the first ones while
// the rest are exported.
func (c *Client) HandOverEach(ctx context.Context, s handover.Sender) error {
	return c.handOverReq(ctx, handoverReq{each: &s, done: make(chan error, 1)})
}

func (c *Client) handOverReq(ctx context.Context, req handoverReq) error {
	select {
	case c.handovers <- req:
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", handover.ErrNotServing, ctx.Err())
	}
	return <-req.done
}

// handOver is Run's end in an upgrade: see HandOver. stopLinks ends the
// connections' loops (links), each closing its connection.
func (c *Client) handOver(logger klog.Logger, stopLinks context.CancelCauseFunc, links *sync.WaitGroup, req handoverReq) error {
	c.closeEntries(true)
	c.draining.Store(true)
	// The reverse forwards' bind streams are not ended here (a drain's
	// shutdown closes the server's listeners): they end with the
	// connections' close for the upgrade, and the server keeps their
	// listeners for the new process to bind again.
	c.cfg.Registry.AbortWhere(proto.CodeShutdown, func(t *tunnel.Tunnel) bool { return !t.Resumable })
	logger.Info("Upgrading: closing connections; the new process re-attaches the resumable tunnels", "tunnels", c.cfg.Registry.Len())
	start := time.Now()
	stopLinks(errUpgrading) // each connection closes ("client upgrading"): its resumable tunnels park
	links.Wait()
	closed := time.Now()
	r := c.cfg.Resume
	if r != nil {
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		if n := r.Table.Settle(ctx); n > 0 {
			logger.Info("Upgrading: some tunnels did not park in time; they are reset", "tunnels", n, "timeout", settleTimeout)
		}
		cancel()
	}
	settled := time.Now()
	export := func(each func(*resume.State)) {
		if r != nil {
			r.Table.ExportEach(each)
		}
		c.cfg.Registry.AbortAll(proto.CodeShutdown) // what could not be handed over
	}
	var n int
	var err error
	if req.each != nil {
		n, err = handover.SendEach(export, *req.each)
	} else {
		var states []*resume.State
		export(func(st *resume.State) { states = append(states, st) })
		n, err = handover.SendStates(states, req.send)
	}
	if err != nil {
		return err
	}
	logger.Info("Handed the client over to the new process", "tunnels", n, "closeDuration", closed.Sub(start),
		"settleDuration", settled.Sub(closed), "handOverDuration", time.Since(settled))
	return nil
}

// HandoverLimits are the bounds of what this client takes from its
// predecessor in an upgrade: at most egress.DefaultMaxResumable tunnels,
// each within the resume cap (plus one read), all within its resume
// budget; nothing without resumable tunnels.
func (c *Client) HandoverLimits() handover.Limits {
	return handover.LimitsOf(c.cfg.Resume, egress.DefaultMaxResumable)
}

// Import continues the tunnels the previous process handed over (while
// Run runs): each re-attaches to its server on this client's next
// connection. It returns how many it took; the others (over the budget,
// a duplicate ID) are reset and their errors joined.
func (c *Client) Import(ctx context.Context, tunnels []handover.Tunnel) (int, error) {
	req := importReq{tunnels: tunnels, done: make(chan importResult, 1)}
	select {
	case c.imports <- req:
	case <-ctx.Done():
		for i := range tunnels {
			_ = tunnels[i].Conn.Close()
		}
		return 0, fmt.Errorf("%w: %w", handover.ErrNotServing, ctx.Err())
	}
	r := <-req.done
	return r.n, r.err
}

// ImportTunnel continues one tunnel the previous process handed over, as
// Import (while Run runs): the new process re-attaches each as it arrives.
func (c *Client) ImportTunnel(ctx context.Context, t handover.Tunnel) error {
	_, err := c.Import(ctx, []handover.Tunnel{t})
	return err
}

// importTunnels is Import in Run (ctx: the session's).
func (c *Client) importTunnels(ctx context.Context, tunnels []handover.Tunnel, handlers *sync.WaitGroup) (int, error) {
	return handover.ImportAll(tunnels, func(st *resume.State, t *tunnel.Tunnel) error {
		return c.ingress.ImportResumable(ctx, st, t, handlers)
	})
}

// Connected waits until a connection to a server is up (Ready), or ctx
// ends, or wait passed. It looks again when a link changes, and every 5 ms
// (the hello's acceptance, which Ready also waits for, wakes no one).
func (c *Client) Connected(ctx context.Context, wait time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		c.mu.Lock()
		changed := c.changed
		c.mu.Unlock()
		if c.Ready() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		case <-tick.C:
		}
	}
}
