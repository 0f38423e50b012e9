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

// ClientUpgradeGrace is how long the server keeps the reverse forwards'
// listeners of a client that closed its connection for an upgrade
// (proto.ClientUpgradeReason) for the client's new process to bind them
// again: it asks at once, or within its first retry (a second) when its
// bind came before its predecessor let go.
const ClientUpgradeGrace = 10 * time.Second

// held is a reverse forward's socket kept for its client to bind again:
// expire, if set, closes it after ClientUpgradeGrace.
type held struct {
	f      *os.File
	expire *time.Timer
}

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
	h := b.inherited[key]
	delete(b.inherited, key)
	b.mu.Unlock()
	if h != nil {
		if h.expire != nil {
			h.expire.Stop()
		}
		ln, pc, err := socketOf(h.f, ep)
		if err == nil {
			logger.Info("Took over a reverse forward's listener kept for an upgrade", "address", key)
			return ln, pc, nil
		}
		logger.Info("Could not take over a reverse forward's listener kept for an upgrade; listening anew", "address", key, "err", err)
	}
	return b.s.cfg.ListenRemote(ctx, ep)
}

// keepForUpgrade keeps a duplicate of ep's listener (ln or pc), which the
// binding's end is about to close, for ClientUpgradeGrace: its client
// closed the connection for an upgrade, and its new process binds ep again
// (listen). Connections that arrive meanwhile wait in the backlog instead
// of being refused. A UNIX socket keeps its file. At most
// MaxRemoteListens are kept (a client that closes for upgrades over and
// over holds no more).
func (b *binder) keepForUpgrade(ep endpoint.Endpoint, ln net.Listener, pc *net.UDPConn, logger klog.Logger) {
	var sock any = ln
	if pc != nil {
		sock = pc
	}
	fc, ok := sock.(interface{ File() (*os.File, error) })
	if !ok {
		return
	}
	f, err := fc.File()
	if err != nil {
		logger.V(2).Info("Could not keep a reverse forward's listener for the client's upgrade", "address", ep.String(), "err", err)
		return
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	key := ep.String()
	h := &held{f: f}
	b.mu.Lock()
	if b.inherited == nil || len(b.inherited) >= b.s.cfg.MaxRemoteListens { // stopping, or as many kept as listeners allowed
		b.mu.Unlock()
		closeInherited(map[string]*os.File{key: f}, logger)
		return
	}
	old := b.inherited[key]
	b.inherited[key] = h
	h.expire = time.AfterFunc(ClientUpgradeGrace, func() { b.dropHeld(key, h, logger) })
	b.mu.Unlock()
	if old != nil {
		b.closeHeld(key, old, logger)
	}
	logger.V(2).Info("Keeping a reverse forward's listener for the client's new process", "address", key, "for", ClientUpgradeGrace)
}

// dropHeld closes h, kept at key, unless a client took it.
func (b *binder) dropHeld(key string, h *held, logger klog.Logger) {
	b.mu.Lock()
	mine := b.inherited[key] == h
	if mine {
		delete(b.inherited, key)
	}
	b.mu.Unlock()
	if mine {
		b.closeHeld(key, h, logger)
	}
}

// closeHeld closes a kept socket (its timer stopped).
func (b *binder) closeHeld(key string, h *held, logger klog.Logger) {
	if h.expire != nil {
		h.expire.Stop()
	}
	closeInherited(map[string]*os.File{key: h.f}, logger)
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

// dropInheritedAfter closes the sockets the previous process handed over
// that no client took within grace; stop closes every socket kept at once
// (Run's end) and stops the timers.
func (b *binder) dropInheritedAfter(grace time.Duration, logger klog.Logger) (stop func()) {
	t := time.AfterFunc(grace, func() { b.dropHandedOver(logger) })
	return func() {
		t.Stop()
		b.mu.Lock()
		left := b.inherited
		b.inherited = nil
		b.mu.Unlock()
		for key, h := range left {
			b.closeHeld(key, h, logger)
		}
	}
}

// dropHandedOver closes the sockets the previous process handed over that
// no client took (not those kept for a client's upgrade: their own timers).
func (b *binder) dropHandedOver(logger klog.Logger) {
	b.mu.Lock()
	left := map[string]*held{}
	for key, h := range b.inherited {
		if h.expire == nil {
			left[key] = h
			delete(b.inherited, key)
		}
	}
	b.mu.Unlock()
	for key, h := range left {
		b.closeHeld(key, h, logger)
	}
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
		logger.Info("Closed a reverse forward's listener kept for an upgrade: its client did not bind it again", "address", key)
	}
}
