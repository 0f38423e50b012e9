package emu

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// MaxPacket is the largest packet read from a device.
const MaxPacket = 65535

// DefaultSpin is how much of each wait is spent spinning rather than sleeping.
const DefaultSpin = time.Millisecond

// DefaultMaxHeld bounds the packets held in one direction's delay line;
// packets beyond it are dropped with cause "overflow".
const DefaultMaxHeld = 200000

// Clock tells the time. Tests inject a fake one.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// RealClock returns the wall clock (monotonic readings).
func RealClock() Clock { return realClock{} }

type heldPacket struct {
	deliver time.Time
	seq     uint64
	data    []byte
}

type packetHeap []heldPacket

func (h packetHeap) Len() int { return len(h) }
func (h packetHeap) Less(i, j int) bool {
	if h[i].deliver.Equal(h[j].deliver) {
		return h[i].seq < h[j].seq
	}
	return h[i].deliver.Before(h[j].deliver)
}
func (h packetHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *packetHeap) Push(x any)   { *h = append(*h, x.(heldPacket)) }
func (h *packetHeap) Pop() any {
	old := *h
	n := len(old)
	x := old[n-1]
	old[n-1] = heldPacket{}
	*h = old[:n-1]
	return x
}

// delayLine holds admitted packets until their delivery time.
type delayLine struct {
	mu     sync.Mutex
	h      packetHeap
	seq    uint64
	notify chan struct{} // size 1: "the head may have changed"
}

func newDelayLine() *delayLine { return &delayLine{notify: make(chan struct{}, 1)} }

func (d *delayLine) push(p heldPacket) int {
	d.mu.Lock()
	d.seq++
	p.seq = d.seq
	heap.Push(&d.h, p)
	n := len(d.h)
	d.mu.Unlock()
	select {
	case d.notify <- struct{}{}:
	default:
	}
	return n
}

// LateThreshold is how late a packet may leave the delay line: one leaving this much or more after
// its delivery time counts as late (Stats late_packets): the emulator was
// too busy, or descheduled, to keep the configured delay.
const LateThreshold = time.Millisecond

// popDue appends every packet due at now to out; it returns the next
// delivery time when none is due, or ok=false if the line is empty, and
// the popped packets' lateness at now (sum, and how many are at least
// LateThreshold late).
func (d *delayLine) popDue(now time.Time, out [][]byte) (res [][]byte, next time.Time, ok bool, lateSum time.Duration, late int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(d.h) > 0 && !d.h[0].deliver.After(now) {
		p := heap.Pop(&d.h).(heldPacket)
		l := now.Sub(p.deliver)
		lateSum += l
		if l >= LateThreshold {
			late++
		}
		out = append(out, p.data)
	}
	if len(d.h) > 0 {
		return out, d.h[0].deliver, true, lateSum, late
	}
	return out, time.Time{}, false, lateSum, late
}

func (d *delayLine) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.h)
}

// Direction names.
const (
	C2S = "c2s"
	S2C = "s2c"
)

// Forwarder moves packets between the client-side and the server-side
// device through two Links.
type Forwarder struct {
	Client, Server io.ReadWriter // packet-preserving: one Read returns one packet
	Links          map[string]*Link
	// Spin is the final part of each wait spent spinning (0 = pure sleep).
	Spin time.Duration
	// MaxHeld bounds each delay line (0 = DefaultMaxHeld).
	MaxHeld int
	// Clock, if nil, is RealClock().
	Clock Clock
}

// NewForwarder returns a forwarder with default spin and bounds.
func NewForwarder(client, server io.ReadWriter, c2s, s2c *Link) *Forwarder {
	return &Forwarder{
		Client: client, Server: server,
		Links: map[string]*Link{C2S: c2s, S2C: s2c},
		Spin:  DefaultSpin, MaxHeld: DefaultMaxHeld, Clock: RealClock(),
	}
}

// Run forwards until ctx is done or a device fails. The caller must close
// the devices after ctx is cancelled to unblock the readers; Run returns
// once its four goroutines have ended. It returns nil when ctx ended it.
func (f *Forwarder) Run(ctx context.Context, closeDevices func()) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	dirs := []struct {
		name     string
		src, dst io.ReadWriter
	}{{C2S, f.Client, f.Server}, {S2C, f.Server, f.Client}}
	for _, d := range dirs {
		link := f.Links[d.name]
		dl := newDelayLine()
		wg.Go(func() {
			if err := f.read(ctx, d.src, link, dl); err != nil {
				cancel(fmt.Errorf("%s read: %w", d.name, err))
			}
		})
		wg.Go(func() {
			if err := f.write(ctx, d.dst, link, dl); err != nil {
				cancel(fmt.Errorf("%s write: %w", d.name, err))
			}
		})
	}
	<-ctx.Done()
	closeDevices()
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func (f *Forwarder) clock() Clock {
	if f.Clock == nil {
		return RealClock()
	}
	return f.Clock
}

func (f *Forwarder) read(ctx context.Context, src io.Reader, link *Link, dl *delayLine) error {
	buf := make([]byte, MaxPacket)
	maxHeld := f.MaxHeld
	if maxHeld <= 0 {
		maxHeld = DefaultMaxHeld
	}
	clk := f.clock()
	for {
		n, err := src.Read(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if n == 0 {
			continue
		}
		now := clk.Now()
		v := link.Offer(now, n)
		if v.Drop != CauseNone {
			continue
		}
		for range v.Copies {
			if dl.len() >= maxHeld {
				link.countDrop(CauseOverflow)
				continue
			}
			data := make([]byte, n)
			copy(data, buf[:n])
			dl.push(heldPacket{deliver: v.Deliver, data: data})
			link.queued(1, int64(n))
		}
	}
}

func (f *Forwarder) write(ctx context.Context, dst io.Writer, link *Link, dl *delayLine) error {
	clk := f.clock()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	logger := klog.FromContext(ctx)
	var due [][]byte
	for {
		now := clk.Now()
		var next time.Time
		var pending bool
		var lateSum time.Duration
		var late int
		due, next, pending, lateSum, late = dl.popDue(now, due[:0])
		if len(due) > 0 {
			link.countLate(lateSum, late)
			blackout := link.InBlackout(now)
			for i, p := range due {
				link.queued(-1, -int64(len(p)))
				switch {
				case blackout:
					link.countDrop(CauseBlackout)
				default:
					if _, err := dst.Write(p); err != nil {
						if ctx.Err() != nil {
							return nil
						}
						// A TUN write fails for a malformed packet or a full
						// socket buffer; count it and go on.
						link.stats.writeErrors.Add(1)
						logger.V(4).Info("Dropped packet on write", "err", err)
						continue
					}
					link.countTx(len(p))
				}
				due[i] = nil
			}
			continue
		}
		if !pending {
			select {
			case <-ctx.Done():
				return nil
			case <-dl.notify:
			}
			continue
		}
		wait := next.Sub(now)
		if wait > f.Spin {
			timer.Reset(wait - f.Spin)
			select {
			case <-ctx.Done():
				return nil
			case <-dl.notify:
				timer.Stop()
			case <-timer.C:
			}
			continue
		}
		// Spin: Go timers oversleep by ~1 ms here (notes/testbed.md).
		for clk.Now().Before(next) {
			if ctx.Err() != nil {
				return nil
			}
			runtime.Gosched()
		}
	}
}
