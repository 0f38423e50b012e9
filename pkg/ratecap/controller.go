package ratecap

import (
	"sync/atomic"
	"time"

	qc "github.com/quic-go/quic-go/congestion"

	"github.com/quictun/quictun/pkg/congestion"
)

// Controller wraps a connection's congestion controller and paces its
// packets by the Bucket of the connection's identity as well (Bind): a
// packet leaves when both the controller beneath and the identity's
// budget let it, so the identity's connections together send no faster
// than its download cap. Unbound it only passes through. Its methods are
// called by quic-go from the connection's run loop; Bind from anywhere.
type Controller struct {
	inner qc.Controller
	// tail is inner as a qc.TailCopier (nil: it is none), asserted once:
	// quic-go asks for tail copies with every packet of stream data.
	tail qc.TailCopier
	down atomic.Pointer[Bucket]
	// offset is quic-go's clock (qc.Time) less the budgets' (monoNow): a
	// Bucket is kept in monoNow's time, because the TCP fallback's capped
	// streams book the same identity's download budget. (quic-go's clock
	// starts an hour before its package loaded: booking the budget in both
	// clocks made a TCP stream beside a QUIC connection wait about an hour,
	// and the cap not hold across them.) Both clocks are monotonic, so the
	// offset is a constant, learnt from the first offsetSamples times
	// quic-go passes (each at most the true offset: quic-go read it just
	// before), then used without reading the clock.
	offset  atomic.Int64
	samples atomic.Int32
	// credit is what the connection booked in creditOf ahead of its
	// packets (gcraRate.prepay), spent without touching the shared budget:
	// at high rates a packet then costs no atomic write. Only quic-go's run
	// loop uses them, as every method but Bind.
	credit   int
	creditOf *Bucket
	// maxDatagram is the largest packet quic-go may send (SetMaxDatagramSize).
	maxDatagram int
}

// defaultMaxDatagram is maxDatagram until quic-go sets it: more than any
// packet on a 1500 B MTU.
const defaultMaxDatagram = 1500

// offsetSamples is how many of quic-go's times the offset is learnt from.
const offsetSamples = 16

// budgetTime is now, a qc.Time quic-go just read, on the budgets' clock.
func (c *Controller) budgetTime(now qc.Time) int64 {
	if n := c.samples.Load(); n < offsetSamples {
		off := int64(now) - monoNow()
		if n == 0 || off > c.offset.Load() {
			c.offset.Store(off)
		}
		c.samples.Add(1)
	}
	return int64(now) - c.offset.Load()
}

// Wrap returns a Controller over inner.
func Wrap(inner qc.Controller) *Controller {
	tail, _ := inner.(qc.TailCopier)
	return &Controller{inner: inner, tail: tail, maxDatagram: defaultMaxDatagram}
}

// Factory wraps every controller newController makes (nil: nil, quic-go's
// own NewReno, which has no hook and so no download cap).
func Factory(newController qc.NewController) qc.NewController {
	if newController == nil {
		return nil
	}
	return func(info qc.Info) qc.Controller { return Wrap(newController(info)) }
}

// Bind paces the connection by b from now on (nil: no cap).
func (c *Controller) Bind(b *Bucket) { c.down.Store(b) }

// Bound reports whether Bind gave the controller a Bucket.
func (c *Controller) Bound() bool { return c.down.Load() != nil }

// OnPacketSent implements qc.Controller: the identity's budget is charged
// with the packet's bytes, from the credit booked ahead while it lasts.
func (c *Controller) OnPacketSent(p qc.SentPacket) {
	c.inner.OnPacketSent(p)
	if !p.AckEliciting {
		return
	}
	b := c.down.Load().paced()
	if b == nil {
		return
	}
	if b == c.creditOf && c.credit >= p.Bytes {
		c.credit -= p.Bytes
		return
	}
	c.book(b, p)
}

// book charges b with the packet's bytes the credit does not cover, and at
// least a prepay's worth: what is left over is the new credit. A credit
// of another budget (a Bind since) is dropped, booked there for nothing:
// at most a prepay's worth, once.
func (c *Controller) book(b *Bucket, p qc.SentPacket) {
	r := b.rate.Load()
	if r == nil {
		c.credit = 0
		return
	}
	have := 0
	if b == c.creditOf {
		have = c.credit
	}
	n := max(p.Bytes-have, r.prepay)
	b.take(r, c.budgetTime(p.Time), n)
	c.credit, c.creditOf = have+n-p.Bytes, b
}

// paidAhead reports whether the connection's credit in p covers a full
// packet: the next one may go without looking at the budget, whose
// arrival time already holds the credit. Less than that, the budget
// decides, as without credit (the credit keeps the budget ahead by up to
// a prepay, so the identity's rate holds).
func (c *Controller) paidAhead(p *Bucket) bool {
	return p == c.creditOf && c.credit >= c.maxDatagram
}

// OnEvent implements qc.Controller.
func (c *Controller) OnEvent(e *qc.Event) { c.inner.OnEvent(e) }

// OnAppLimited implements qc.Controller.
func (c *Controller) OnAppLimited(bytesInFlight int) { c.inner.OnAppLimited(bytesInFlight) }

// SetMaxDatagramSize implements qc.Controller.
func (c *Controller) SetMaxDatagramSize(n int) {
	c.maxDatagram = max(n, defaultMaxDatagram)
	c.inner.SetMaxDatagramSize(n)
}

// CanSend implements qc.Controller.
func (c *Controller) CanSend(bytesInFlight int) bool { return c.inner.CanSend(bytesInFlight) }

// HasPacingBudget implements qc.Controller: the controller's pacer and the
// identity's budget must both let the packet go.
func (c *Controller) HasPacingBudget(now qc.Time) bool {
	if !c.inner.HasPacingBudget(now) {
		return false
	}
	b := c.down.Load()
	p := b.paced()
	if p == nil || c.paidAhead(p) {
		return true // nothing paces it, or its bytes are paid: no clock read
	}
	t := c.budgetTime(now)
	if p != b {
		b.rest.refresh(t) // the link's rest paces it (Bucket.pacer)
	}
	return p.ready(t)
}

// TimeUntilSend implements qc.Controller: the later of the two pacers'.
func (c *Controller) TimeUntilSend(bytesInFlight int) qc.Time {
	t := c.inner.TimeUntilSend(bytesInFlight)
	if b := c.down.Load().paced(); b != nil && !c.paidAhead(b) {
		if next := b.next(); next != 0 {
			if n := qc.Time(next + c.offset.Load()); n > t {
				return n
			}
		}
	}
	return t
}

var _ qc.TailCopier = (*Controller)(nil)

// TailCopies implements qc.TailCopier with the answer of the controller
// beneath (none if it asks for no copies): quic-go asks the connection's
// controller, this wrapper, so without it a server with caps (or an auth
// hook) sent no tail copies at all. The copies are not booked on the
// identity's budget: quic-go does not count them as sent (they repeat
// packets already booked), and a burst gets at most a few.
func (c *Controller) TailCopies() (int, time.Duration) {
	if c.tail == nil {
		return 0, 0
	}
	return c.tail.TailCopies()
}

// CongestionWindow implements qc.Controller.
func (c *Controller) CongestionWindow() int { return c.inner.CongestionWindow() }

// InSlowStart implements qc.Controller.
func (c *Controller) InSlowStart() bool { return c.inner.InSlowStart() }

// InRecovery implements qc.Controller.
func (c *Controller) InRecovery() bool { return c.inner.InRecovery() }

// Stats implements congestion.StatsReporter with the state of the
// controller beneath.
func (c *Controller) Stats() congestion.Stats {
	s, _ := congestion.StatsOf(c.inner)
	return s
}
