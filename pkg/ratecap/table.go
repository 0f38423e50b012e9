package ratecap

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
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

// Table holds the caps by identity and a default, and the budgets of the
// identities seen (For). Safe for concurrent use.
type Table struct {
	mu     sync.Mutex
	rules  map[string]Rate
	def    Rate
	shares map[string]*Shares
	// hooked are the caps an auth hook's answers gave identities
	// (SetHooked), below rules and above def; at most MaxHooked.
	hooked map[string]Rate
}

// MaxHooked bounds the identities with caps from an auth hook (the hook's
// own cache holds at most as many answers). Past it, a tenth of them is
// dropped: those identities get the default until the hook answers for
// them again (within its TTL).
const MaxHooked = 100_000

// NewTable returns a Table of rules and the default def.
func NewTable(rules []Rule, def Rate) *Table {
	t := &Table{shares: map[string]*Shares{}, hooked: map[string]Rate{}}
	t.Set(rules, def)
	return t
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
	for id, s := range t.shares {
		t.apply(id, s)
	}
}

// Rate returns identity's caps: its own, or the default.
func (t *Table) Rate(identity string) Rate {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rateOf(identity)
}

func (t *Table) rateOf(identity string) Rate {
	if r, ok := t.rules[identity]; ok {
		return r
	}
	if r, ok := t.hooked[identity]; ok {
		return r
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
	old, had := t.hooked[identity]
	if had == ok && old == r {
		return // the common case: the same answer, from the hook's cache
	}
	if !ok {
		delete(t.hooked, identity)
	} else {
		if !had && len(t.hooked) >= MaxHooked {
			t.dropHooked()
		}
		t.hooked[identity] = r
	}
	if s := t.shares[identity]; s != nil {
		t.apply(identity, s)
	}
}

// dropHooked drops a tenth of the hooked caps (arbitrary ones), so the map
// is scanned once per MaxHooked/10 new identities. Call with mu.
func (t *Table) dropHooked() {
	low := MaxHooked - MaxHooked/10
	for id := range t.hooked {
		if len(t.hooked) <= low {
			break
		}
		delete(t.hooked, id)
		if s := t.shares[id]; s != nil {
			t.apply(id, s)
		}
	}
}

// Hooked returns the number of identities with caps from a hook.
func (t *Table) Hooked() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.hooked)
}

func (t *Table) apply(identity string, s *Shares) {
	r := t.rateOf(identity)
	s.Down.SetRate(r.Down)
	s.Up.SetRate(r.Up)
}

// For returns identity's budgets, the same for all its connections.
func (t *Table) For(identity string) *Shares {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.shares[identity]
	if s == nil {
		s = &Shares{}
		t.apply(identity, s)
		t.shares[identity] = s
	}
	return s
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
