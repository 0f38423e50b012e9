package integration

import (
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// linkFaults is what a faultLink does to packets; every probability applies
// to each packet in each direction independently.
type linkFaults struct {
	Loss      float64 // dropped
	Reorder   float64 // held back by ReorderBy, so later packets overtake it
	ReorderBy time.Duration
	Dup       float64 // sent twice
	Dark      bool    // everything dropped (a blackout)
}

func (f linkFaults) String() string {
	if f.Dark {
		return "dark"
	}
	return fmt.Sprintf("loss=%.4g%% reorder=%.4g%%/%s dup=%.4g%%", 100*f.Loss, 100*f.Reorder, f.ReorderBy, 100*f.Dup)
}

// linkCounts counts what a faultLink did.
type linkCounts struct {
	forwarded, dropped, reordered, duplicated atomic.Int64
}

func (c *linkCounts) String() string {
	return fmt.Sprintf("forwarded %d, dropped %d, reordered %d, duplicated %d",
		c.forwarded.Load(), c.dropped.Load(), c.reordered.Load(), c.duplicated.Load())
}

// faultLink is an emulated UDP link in front of a server: a fixed one-way
// delay plus the faults set with set. Like a NAT, it relays each client
// address through its own socket, so the server sees a new address when the
// client moves to a new socket. Close releases every socket and goroutine.
type faultLink struct {
	ln     *net.UDPConn
	server *net.UDPAddr
	delay  time.Duration
	closed chan struct{}
	wg     sync.WaitGroup
	counts linkCounts

	mu     sync.Mutex
	faults linkFaults
	rng    *mrand.Rand
	paths  map[string]*linkPath
	// darkPaths are client addresses cut off while newer ones still work
	// (the old path of a client that then moves).
	darkPaths map[string]bool
}

// linkPath is one client address and the socket that relays it to the server.
type linkPath struct {
	client *net.UDPAddr
	up     *net.UDPConn // connected to the server
	toSrv  chan linkPacket
	toCli  chan linkPacket
}

type linkPacket struct {
	due time.Time
	b   []byte
}

// newFaultLink starts a link to server with oneWay delay; seed makes its
// random choices repeatable. It is closed when the test ends.
func newFaultLink(t testing.TB, server string, oneWay time.Duration, seed uint64) *faultLink {
	t.Helper()
	ln, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	sa, err := net.ResolveUDPAddr("udp", server)
	require.NoError(t, err)
	_ = ln.SetReadBuffer(4 << 20)
	_ = ln.SetWriteBuffer(4 << 20)
	l := &faultLink{ln: ln, server: sa, delay: oneWay, closed: make(chan struct{}),
		rng: mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), paths: map[string]*linkPath{}, darkPaths: map[string]bool{}}
	l.wg.Go(l.readClients)
	t.Cleanup(l.Close)
	return l
}

// Addr is the address clients send to.
func (l *faultLink) Addr() string { return l.ln.LocalAddr().String() }

// set replaces the faults from now on.
func (l *faultLink) set(f linkFaults) {
	l.mu.Lock()
	l.faults = f
	l.mu.Unlock()
}

// darkenPaths(true) cuts off every client address seen so far, while
// addresses that appear later (a client's new socket) get through;
// darkenPaths(false) lights them all again.
func (l *faultLink) darkenPaths(on bool) {
	l.mu.Lock()
	clear(l.darkPaths)
	if on {
		for a := range l.paths {
			l.darkPaths[a] = true
		}
	}
	l.mu.Unlock()
}

// Close stops the link, closes its sockets and waits for its goroutines.
func (l *faultLink) Close() {
	l.mu.Lock()
	select {
	case <-l.closed:
		l.mu.Unlock()
		return
	default:
	}
	close(l.closed)
	_ = l.ln.Close()
	for _, p := range l.paths {
		_ = p.up.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

func (l *faultLink) readClients() {
	for {
		b := make([]byte, 1500)
		n, addr, err := l.ln.ReadFromUDP(b)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p := l.path(addr)
		if p == nil {
			return // closed
		}
		l.forward(addr.String(), p.toSrv, b[:n])
	}
}

// path returns the relay of client address a, starting it on first use; nil once the link is closed.
func (l *faultLink) path(a *net.UDPAddr) *linkPath {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.paths[a.String()]; p != nil {
		return p
	}
	select {
	case <-l.closed:
		return nil
	default:
	}
	up, err := net.DialUDP("udp", nil, l.server)
	if err != nil {
		return nil
	}
	_ = up.SetReadBuffer(4 << 20)
	_ = up.SetWriteBuffer(4 << 20)
	p := &linkPath{client: a, up: up, toSrv: make(chan linkPacket, 4096), toCli: make(chan linkPacket, 4096)}
	l.paths[a.String()] = p
	l.wg.Go(func() { l.send(p.toSrv, func(b []byte) { _, _ = up.Write(b) }) })
	l.wg.Go(func() { l.send(p.toCli, func(b []byte) { _, _ = l.ln.WriteToUDP(b, a) }) })
	l.wg.Go(func() {
		for {
			b := make([]byte, 1500)
			n, err := up.Read(b)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // e.g. ECONNREFUSED while the server restarts
			}
			l.forward(a.String(), p.toCli, b[:n])
		}
	})
	return p
}

// forward applies the faults to one packet of client address client and queues it.
func (l *faultLink) forward(client string, q chan linkPacket, b []byte) {
	l.mu.Lock()
	f := l.faults
	drop := f.Dark || l.darkPaths[client] || (f.Loss > 0 && l.rng.Float64() < f.Loss)
	hold := !drop && f.Reorder > 0 && l.rng.Float64() < f.Reorder
	dup := !drop && f.Dup > 0 && l.rng.Float64() < f.Dup
	l.mu.Unlock()
	if drop {
		l.counts.dropped.Add(1)
		return
	}
	enqueue := func(b []byte) {
		select {
		case q <- linkPacket{due: time.Now().Add(l.delay), b: b}:
			l.counts.forwarded.Add(1)
		case <-l.closed:
		default:
			l.counts.dropped.Add(1) // queue full: tail drop, as a router does
		}
	}
	if dup {
		l.counts.duplicated.Add(1)
		enqueue(append([]byte(nil), b...))
	}
	if hold {
		l.counts.reordered.Add(1)
		l.wg.Add(1)
		time.AfterFunc(f.ReorderBy, func() { defer l.wg.Done(); enqueue(b) })
		return
	}
	enqueue(b)
}

// send writes the packets of q when they are due, in order.
func (l *faultLink) send(q chan linkPacket, write func([]byte)) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var pk linkPacket
		select {
		case pk = <-q:
		case <-l.closed:
			return
		}
		if wait := time.Until(pk.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-l.closed:
				return
			}
		}
		write(pk.b)
	}
}
