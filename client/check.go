package client

import (
	"context"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/proto"
)

// settled waits for l's handshake and reports whether l is still its
// member's link then (false: the connection or ctx ended, or l was replaced,
// e.g. after a 0-RTT rejection).
func (c *Client) settled(ctx context.Context, l *link) bool {
	select {
	case <-l.conn.HandshakeComplete():
	case <-l.conn.Context().Done():
		return false
	case <-ctx.Done():
		return false
	}
	return c.current(l.m) == l
}

// checkDestinations asks the server on sess's connection, once its handshake
// is done and its hello answered, whether its rules admit each destination of
// Config.Check (proto.KindCheck), without dialing them: a forward that can
// never work is reported when the client connects, not at its first use.
// A refusal is logged at -v 0 once until the server allows the destination
// again (which is logged too); a server from before the check answers
// unsupported (or bad_header), and the rest are not asked.
func (c *Client) checkDestinations(ctx context.Context, l *link) {
	if len(c.cfg.Check) == 0 {
		return
	}
	if !c.settled(ctx, l) {
		return // ended, or replaced (0-RTT rejected): the new session checks
	}
	conn := l.Conn
	logger := klog.FromContext(ctx)
	for _, dest := range c.cfg.Check {
		if l.m.srv.authRefused.Load() || conn.Context().Err() != nil || ctx.Err() != nil {
			return
		}
		h, err := proto.NewCheck(dest, time.Now())
		if err != nil {
			logger.V(2).Info("Could not make a destination check", "destination", ingress.LoggableToken(dest), "err", err)
			continue
		}
		err = ask(conn, h, c.signer.Load().Secret())
		code, remote := proto.FromError(err)
		switch {
		case err == nil:
			if c.said.allowed(dest) {
				logger.Info("Server now allows a destination it refused before", "destination", ingress.LoggableToken(dest))
			} else {
				logger.V(4).Info("Server allows the destination", "destination", ingress.LoggableToken(dest))
			}
		case remote && code == proto.CodeRefused:
			if c.said.refused(dest) {
				logger.Info("Server refuses a destination this client forwards to: every connection to it will be reset; "+
					"allow it on the server (its log names the rule to add), or fix the destination here",
					"destination", ingress.LoggableToken(dest))
			}
		case remote && (code == proto.CodeUnsupported || code == proto.CodeBadHeader):
			logger.V(2).Info("Server cannot check destinations (it predates the check); they are checked at first use", "code", code.String())
			return
		default:
			logger.V(2).Info("Server did not answer a destination check", "destination", ingress.LoggableToken(dest), "err", err)
		}
	}
}

// logMemory is what the client logged, so that each outcome is said once:
// the destinations of Config.Check the server refused at its last answer,
// and the outcome last logged per reverse binding and server (logBind).
type logMemory struct {
	mu       sync.Mutex
	refusals map[string]bool
	outcomes map[bindKey]string
}

// refused records that the server refuses dest; it reports whether that
// is news (dest was not refused at the last answer).
func (m *logMemory) refused(dest string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refusals[dest] {
		return false
	}
	if m.refusals == nil {
		m.refusals = map[string]bool{}
	}
	m.refusals[dest] = true
	return true
}

// allowed records that the server allows dest; it reports whether it
// refused it at the last answer.
func (m *logMemory) allowed(dest string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	was := m.refusals[dest]
	delete(m.refusals, dest)
	return was
}

// bindOutcome records outcome as key's last; it reports whether it
// differs from the one before.
func (m *logMemory) bindOutcome(key bindKey, outcome string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.outcomes == nil {
		m.outcomes = map[bindKey]string{}
	}
	prev, seen := m.outcomes[key]
	m.outcomes[key] = outcome
	return !seen || prev != outcome
}
