package ratecap

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Rate is a cap in bytes per second each way (0: none).
type Rate struct {
	Down, Up float64
}

// Rule is one identity's caps (--rate-limit IDENTITY=DOWN[/UP]).
type Rule struct {
	Identity string
	Rate     Rate
}

// Shares are one identity's budgets, shared by all its connections.
type Shares struct {
	Down, Up Bucket
}

// idle reports whether both budgets are full at now (monoNow): no booking
// is outstanding, so a fresh Shares would grant exactly as much.
func (s *Shares) idle(now int64) bool { return s.Down.idle(now) && s.Up.idle(now) }

// Table holds the caps by identity and a default, and the budgets of the
// identities seen (For). Safe for concurrent use.
//
// Its state is bounded (with an auth hook, thousands of identities come
// and go): once it holds sweepAt identities, a new one first drops those
// that are not live (SetLive), were not used (For, SetHooked) for
// IdleAfter and whose budgets are full. A live identity keeps its budgets,
// so its connections and streams always share one; a dropped one's, made
// again, are full, as they were when dropped: no burst beyond the usual.
type Table struct {
	mu    sync.Mutex
	rules map[string]Rate
	def   Rate
	ids   map[string]*tracked
	// live tells whether an identity has a connection or tunnel open (nil:
	// every identity with budgets is, and they are never dropped).
	live func(identity string) bool
	// now is the budgets' clock (monoNow; tests replace it).
	now func() int64
	// sweepAt is the number of identities at which a new one sweeps.
	sweepAt int
	// restDown and restUp are the link's rest each way (SetLink), paced
	// for the identities without a cap of their own.
	restDown, restUp linkShare
	// cappedDown and cappedUp are the budgets in use with a cap, which the
	// rests leave room for (publish).
	cappedDown, cappedUp map[*Bucket]struct{}
}

// tracked is what the Table holds of one identity.
type tracked struct {
	shares *Shares // nil until For
	// hooked is the cap an auth hook's answer gave it (SetHooked), below
	// rules and above def, if hasHooked.
	hooked    Rate
	hasHooked bool
	used      int64 // when For or SetHooked last named it (now)
}

// Bounds of a Table's identities.
const (
	// IdleAfter is how long an identity that is not live is kept after it
	// was last used: longer than any step between taking its budgets
	// (For) and its connection or tunnel being counted live.
	IdleAfter = time.Minute
	// minSweep is the fewest identities a Table sweeps at: after a sweep,
	// the next comes at twice the identities kept, at least this many.
	minSweep = 1024
	// MaxHooked bounds the identities a Table holds apart from the live
	// ones: past it, a sweep drops those not live and not used within the
	// last second, whatever IdleAfter says (those with a hook's caps get
	// them again at their next lookup).
	MaxHooked = 100_000
)

// NewTable returns a Table of rules and the default def.
func NewTable(rules []Rule, def Rate) *Table {
	t := &Table{ids: map[string]*tracked{}, now: monoNow, sweepAt: minSweep,
		cappedDown: map[*Bucket]struct{}{}, cappedUp: map[*Bucket]struct{}{}}
	t.Set(rules, def)
	return t
}

// SetLive tells the Table which identities have a connection or tunnel
// open (the server's usage ledger): only the others' budgets may be
// dropped. live is called with the Table's lock held, and must not call
// the Table.
func (t *Table) SetLive(live func(identity string) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.live = live
}

// Set replaces the caps (a reload): the budgets in use take their new
// rates at once.
func (t *Table) Set(rules []Rule, def Rate) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rules, t.def = make(map[string]Rate, len(rules)), def
	for _, r := range rules {
		t.rules[r.Identity] = r.Rate
	}
	for id, e := range t.ids {
		t.apply(id, e)
	}
	t.publish()
}

// SetLink sets the server link's rate each way (0: not set, the default):
// the identities without a cap of their own then share one budget of what
// the capped identities leave of it (see link.go). Set it a little below
// the link's real rate, where the server's own pacing, not the link's
// queue, is the bottleneck.
func (t *Table) SetLink(r Rate) {
	t.restDown.setLink(r.Down)
	t.restUp.setLink(r.Up)
}

// Rest returns the rates the uncapped identities share now under the link
// rate (0 each way without one).
func (t *Table) Rest() Rate {
	return Rate{Down: t.restDown.restRate(), Up: t.restUp.restRate()}
}

// Link returns the link's rates (SetLink).
func (t *Table) Link() Rate {
	return Rate{Down: t.restDown.rate(), Up: t.restUp.rate()}
}

// Rate returns identity's caps: its own, or the default.
func (t *Table) Rate(identity string) Rate {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rateOf(identity, t.ids[identity])
}

// rateOf returns identity's caps; e is its entry (nil: none).
func (t *Table) rateOf(identity string, e *tracked) Rate {
	if r, ok := t.rules[identity]; ok {
		return r
	}
	if e != nil && e.hasHooked {
		return e.hooked
	}
	return t.def
}

// SetHooked sets the caps an auth hook's answer gives identity (ok false:
// the answer gave none, the default applies again). A cap configured for
// identity (--rate-limit) wins over it. Its budgets in use take the rate
// at once.
func (t *Table) SetHooked(identity string, r Rate, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.ids[identity]
	if e == nil {
		if !ok {
			return
		}
		e = t.add(identity)
	}
	e.used = t.now()
	if e.hasHooked == ok && e.hooked == r {
		return // the common case: the same answer, from the hook's cache
	}
	e.hooked, e.hasHooked = r, ok
	if !ok {
		e.hooked = Rate{}
	}
	t.apply(identity, e)
	if e.shares != nil {
		t.publish()
	}
}

// Hooked returns the number of identities with caps from a hook.
func (t *Table) Hooked() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, e := range t.ids {
		if e.hasHooked {
			n++
		}
	}
	return n
}

// Len returns the number of identities the Table holds (with budgets or
// a hook's caps).
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.ids)
}

// apply sets e's budgets, if any, to identity's rate. Call with mu.
func (t *Table) apply(identity string, e *tracked) {
	if e.shares == nil {
		return
	}
	r := t.rateOf(identity, e)
	e.shares.Down.SetRate(r.Down)
	e.shares.Up.SetRate(r.Up)
	track(t.cappedDown, &e.shares.Down)
	track(t.cappedUp, &e.shares.Up)
}

// track keeps b in capped while it has a cap.
func track(capped map[*Bucket]struct{}, b *Bucket) {
	if b.Capped() {
		capped[b] = struct{}{}
	} else {
		delete(capped, b)
	}
}

// untrack drops e's budgets from the capped ones (e is dropped). Call with
// mu.
func (t *Table) untrack(e *tracked) {
	if e.shares != nil {
		delete(t.cappedDown, &e.shares.Down)
		delete(t.cappedUp, &e.shares.Up)
	}
}

// publish hands the rests the capped budgets in use. Call with mu.
func (t *Table) publish() {
	for _, p := range []struct {
		s      *linkShare
		capped map[*Bucket]struct{}
	}{{&t.restDown, t.cappedDown}, {&t.restUp, t.cappedUp}} {
		list := make([]*Bucket, 0, len(p.capped))
		for b := range p.capped {
			list = append(list, b)
		}
		p.s.capped.Store(&list)
	}
}

// For returns identity's budgets, the same for all its connections.
func (t *Table) For(identity string) *Shares {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.ids[identity]
	if e == nil {
		e = t.add(identity)
	}
	e.used = t.now()
	if e.shares == nil {
		e.shares = &Shares{}
		e.shares.Down.rest, e.shares.Up.rest = &t.restDown, &t.restUp
		t.apply(identity, e)
		if e.shares.Down.Capped() || e.shares.Up.Capped() {
			t.publish()
		}
	}
	return e.shares
}

// add makes identity's entry, sweeping first if the Table holds sweepAt
// identities. Call with mu.
func (t *Table) add(identity string) *tracked {
	if len(t.ids) >= t.sweepAt {
		t.sweep()
		t.sweepAt = max(2*len(t.ids), minSweep)
		if t.sweepAt > MaxHooked && len(t.ids) < MaxHooked*9/10 {
			t.sweepAt = MaxHooked
		}
	}
	e := &tracked{}
	t.ids[identity] = e
	return e
}

// sweep drops the identities that are not live, whose budgets are full and
// that were not used within IdleAfter (holding MaxHooked: within the last
// second); still holding MaxHooked, it drops caps of a hook that no budget
// uses (arbitrary ones: they come back with their identity's next lookup,
// before its budgets are taken) down to nine tenths of MaxHooked. A scan is
// followed by at least as many new identities as it kept, or a tenth of
// MaxHooked, before the next. Call with mu.
func (t *Table) sweep() {
	now := t.now()
	full := len(t.ids) >= MaxHooked
	idle := int64(IdleAfter)
	if full {
		idle = int64(time.Second)
	}
	for id, e := range t.ids {
		switch {
		case now-e.used < idle:
		case e.shares != nil && (t.live == nil || t.live(id) || !e.shares.idle(now)):
		default:
			t.untrack(e)
			delete(t.ids, id)
		}
	}
	t.publish()
	for id, e := range t.ids {
		if !full || len(t.ids) <= MaxHooked*9/10 {
			return
		}
		if e.shares == nil {
			delete(t.ids, id)
		}
	}
}

// ParseRule parses IDENTITY=DOWN[/UP] (the identity may itself hold '=':
// the last one splits).
func ParseRule(spec string) (Rule, error) {
	i := strings.LastIndex(spec, "=")
	if i <= 0 {
		return Rule{}, fmt.Errorf("--rate-limit %q: want IDENTITY=DOWN[/UP], e.g. key=alice=20Mbit/5Mbit", spec)
	}
	r, err := ParseRate(spec[i+1:])
	if err != nil {
		return Rule{}, fmt.Errorf("--rate-limit %q: %w", spec, err)
	}
	return Rule{Identity: spec[:i], Rate: r}, nil
}

// ParseRate parses DOWN[/UP]; UP defaults to DOWN. Each is a number with a
// unit: bit, kbit, Mbit, Gbit (bits per second, powers of 1000), B, kB,
// MB, GB (bytes per second) or KiB, MiB, GiB; 0 is no cap.
func ParseRate(s string) (Rate, error) {
	down, up, hasUp := strings.Cut(s, "/")
	d, err := ParseBytesPerSecond(down)
	if err != nil {
		return Rate{}, err
	}
	u := d
	if hasUp {
		if u, err = ParseBytesPerSecond(up); err != nil {
			return Rate{}, err
		}
	}
	return Rate{Down: d, Up: u}, nil
}

var units = []struct {
	suffix string
	bytes  float64
}{
	{"Gbit", 1e9 / 8}, {"Mbit", 1e6 / 8}, {"kbit", 1e3 / 8}, {"bit", 1.0 / 8},
	{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"GB", 1e9}, {"MB", 1e6}, {"kB", 1e3}, {"B", 1},
}

// ParseBytesPerSecond parses one rate, a number with a unit (see ParseRate),
// into bytes per second; "0" is 0.
func ParseBytesPerSecond(s string) (float64, error) {
	if s == "0" {
		return 0, nil
	}
	for _, u := range units {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			if err != nil || v < 0 || v > 1e6 {
				break
			}
			bps := v * u.bytes
			if bps != 0 && bps < 1000 {
				return 0, fmt.Errorf("rate %q: at least 8kbit (1kB/s), or 0 for none", s)
			}
			return bps, nil
		}
	}
	return 0, fmt.Errorf("rate %q: a number and a unit: bit, kbit, Mbit, Gbit, B, kB, MB, GB, KiB, MiB, GiB (e.g. 20Mbit), or 0", s)
}
