package server

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/endpoint"
)

// Reverse forwards in an upgrade: the old process hands each reverse
// forward's listening socket to the new one (ReverseSockets, named
// ReverseSocketPrefix + the listen address), which takes it over when the
// client binds that address again (Config.InheritedReverse). Connections
// that arrive meanwhile wait in the socket's backlog instead of being
// refused, and the address is never free for another program to take.

// ReverseSocketPrefix begins the handover name of a reverse forward's
// listening socket; the listen address (endpoint.String) follows.
const ReverseSocketPrefix = "reverse:"

// InheritedReverseGrace is how long a new process keeps the reverse
// forwards' sockets its predecessor handed over for their clients to bind
// them again (they reconnect at once after an upgrade); then it closes
// those not taken.
const InheritedReverseGrace = 30 * time.Second

// ReverseSockets returns at most limit of the reverse forwards' listening
// sockets (*net.TCPListener, *net.UnixListener or *net.UDPConn) by handover
// name, for an upgrade to duplicate and hand over. A UNIX socket returned
// keeps its file when the handover closes it here.
func (s *Server) ReverseSockets(limit int) map[string]any {
	if s.binder == nil {
		return nil
	}
	return s.binder.sockets(limit)
}

func (b *binder) sockets(limit int) map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]any{}
	for _, key := range slices.Sorted(maps.Keys(b.bound)) {
		bd := b.bound[key]
		if bd.sock == nil || len(out) >= limit {
			continue
		}
		out[ReverseSocketPrefix+key] = bd.sock
		bd.handedOver = true
	}
	return out
}

// keepHandedOver keeps the files of the UNIX sockets handed over when they
// are closed here (the new process listens on them).
func (b *binder) keepHandedOver() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, bd := range b.bound {
		if ul, ok := bd.sock.(*net.UnixListener); ok && bd.handedOver {
			ul.SetUnlinkOnClose(false)
		}
	}
}

// setSocket records the socket of the binding at key, which conn connID
// holds.
func (b *binder) setSocket(key string, connID uint64, ln net.Listener, pc *net.UDPConn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if bd := b.bound[key]; bd != nil && bd.connID == connID {
		if pc != nil {
			bd.sock = pc
		} else {
			bd.sock = ln
		}
	}
}

// listen opens ep's listener: the socket the previous process handed over
// for it, if any, else a new one (Config.ListenRemote).
func (b *binder) listen(ctx context.Context, ep endpoint.Endpoint, logger klog.Logger) (net.Listener, *net.UDPConn, error) {
	key := ep.String()
	b.mu.Lock()
	f := b.inherited[key]
	delete(b.inherited, key)
	b.mu.Unlock()
	if f != nil {
		ln, pc, err := socketOf(f, ep)
		if err == nil {
			logger.Info("Took over a reverse forward's listener from the previous process", "address", key)
			return ln, pc, nil
		}
		logger.Info("Could not take over a reverse forward's listener from the previous process; listening anew", "address", key, "err", err)
	}
	return b.s.cfg.ListenRemote(ctx, ep)
}

// socketOf is the listener or UDP socket of f, handed over for ep (f is
// closed; the socket holds its own descriptor). A UNIX listener removes
// its file when closed, as one this process opened would.
func socketOf(f *os.File, ep endpoint.Endpoint) (net.Listener, *net.UDPConn, error) {
	defer func() { _ = f.Close() }()
	if ep.Network == endpoint.NetworkUDP {
		c, err := net.FilePacketConn(f)
		if err != nil {
			return nil, nil, err
		}
		uc, ok := c.(*net.UDPConn)
		if !ok {
			_ = c.Close()
			return nil, nil, fmt.Errorf("a %T for %s", c, ep)
		}
		return nil, uc, nil
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, nil, err
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(true)
	}
	return ln, nil, nil
}

// dropInheritedAfter closes the sockets handed over that no client took
// within grace; stop closes them at once (Run's end) and stops the timer.
func (b *binder) dropInheritedAfter(grace time.Duration, logger klog.Logger) (stop func()) {
	t := time.AfterFunc(grace, func() { b.dropInherited(logger) })
	return func() {
		t.Stop()
		b.dropInherited(logger)
	}
}

// dropInherited closes the sockets handed over that no client took.
func (b *binder) dropInherited(logger klog.Logger) {
	b.mu.Lock()
	left := b.inherited
	b.inherited = nil
	b.mu.Unlock()
	closeInherited(left, logger)
}

// closeInherited closes reverse forwards' sockets handed over (a UNIX
// socket's file removed).
func closeInherited(left map[string]*os.File, logger klog.Logger) {
	for key, f := range left {
		ep, err := endpoint.Parse(key)
		if err != nil {
			_ = f.Close()
			continue
		}
		if ln, pc, err := socketOf(f, ep); err == nil {
			closeListener(ln, pc)
		}
		logger.Info("Closed a reverse forward's listener the previous process handed over: its client did not bind it again", "address", key)
	}
}
