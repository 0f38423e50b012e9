package emu

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Params are the properties of one direction of the emulated link.
// The zero value is a perfect link: no delay, no loss, no rate limit.
type Params struct {
	// Delay is the one-way propagation delay.
	Delay time.Duration
	// Jitter adds a uniform random delay in [-Jitter, +Jitter] to each packet.
	// Packet order is kept unless Reorder > 0.
	Jitter time.Duration
	// Loss is the probability that a packet is dropped (Bernoulli).
	Loss float64
	// GEP is the Gilbert-Elliott probability of moving from the good to the bad
	// state, per packet. 0 disables the model.
	GEP float64
	// GER is the Gilbert-Elliott probability of moving from the bad to the good state.
	GER float64
	// GELossGood is the loss probability in the good state (1-k).
	GELossGood float64
	// GELossBad is the loss probability in the bad state (1-h).
	GELossBad float64
	// RateBits is the link rate in bit/s. 0 means unlimited.
	RateBits int64
	// QueueBytes bounds the bytes waiting for the rate limiter; a packet that
	// does not fit is dropped (tail drop). 0 means the default: the bytes the
	// link sends in DefaultQueueTime, at least MinQueueBytes.
	QueueBytes int
	// Duplicate is the probability that a packet is delivered twice.
	Duplicate float64
	// Reorder is the probability that a packet is held back by ReorderDelay
	// so that later packets overtake it.
	Reorder float64
	// ReorderDelay is the extra delay of a reordered packet. 0 means 1 ms.
	ReorderDelay time.Duration
}

// DefaultParams is a perfect link whose Gilbert-Elliott bad state, once
// enabled with GEP, loses every packet (the Gilbert model).
func DefaultParams() Params { return Params{GELossBad: 1} }

const (
	// DefaultQueueTime sizes the default rate-limiter queue.
	DefaultQueueTime = 50 * time.Millisecond
	// MinQueueBytes is the smallest default rate-limiter queue.
	MinQueueBytes = 64 << 10
	// DefaultReorderDelay is used when ReorderDelay is 0.
	DefaultReorderDelay = time.Millisecond
)

// EffectiveQueueBytes returns the rate-limiter queue bound in bytes.
func (p Params) EffectiveQueueBytes() int {
	if p.QueueBytes > 0 {
		return p.QueueBytes
	}
	q := int(float64(p.RateBits) / 8 * DefaultQueueTime.Seconds())
	return max(q, MinQueueBytes)
}

// Validate reports every invalid field.
func (p Params) Validate() error {
	var errs []error
	probs := map[string]float64{
		"loss": p.Loss, "ge-p": p.GEP, "ge-r": p.GER, "ge-loss-good": p.GELossGood,
		"ge-loss-bad": p.GELossBad, "duplicate": p.Duplicate, "reorder": p.Reorder,
	}
	names := make([]string, 0, len(probs))
	for n := range probs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if v := probs[n]; v < 0 || v > 1 || math.IsNaN(v) {
			errs = append(errs, fmt.Errorf("%s: probability %v not in [0,1]", n, v))
		}
	}
	if p.Delay < 0 {
		errs = append(errs, fmt.Errorf("delay: %v is negative", p.Delay))
	}
	if p.Jitter < 0 {
		errs = append(errs, fmt.Errorf("jitter: %v is negative", p.Jitter))
	}
	if p.ReorderDelay < 0 {
		errs = append(errs, fmt.Errorf("reorder-delay: %v is negative", p.ReorderDelay))
	}
	if p.RateBits < 0 {
		errs = append(errs, fmt.Errorf("rate: %d is negative", p.RateBits))
	}
	if p.QueueBytes < 0 {
		errs = append(errs, fmt.Errorf("queue-bytes: %d is negative", p.QueueBytes))
	}
	if p.GEP > 0 && p.GER == 0 {
		errs = append(errs, errors.New("ge-r: must be > 0 when ge-p > 0 (the bad state would never end)"))
	}
	return errors.Join(errs...)
}

// Field describes one link parameter as it appears in flags and in the
// control API (same names in both).
type Field struct {
	Name  string
	Usage string
	// Set parses s into p.
	Set func(p *Params, s string) error
	// Get formats the value of p.
	Get func(p Params) string
}

// Fields lists every link parameter, in the order they are documented.
func Fields() []Field {
	dur := func(name, usage string, ptr func(*Params) *time.Duration) Field {
		return Field{Name: name, Usage: usage,
			Set: func(p *Params, s string) error {
				d, err := time.ParseDuration(s)
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				*ptr(p) = d
				return nil
			},
			Get: func(p Params) string { return ptr(&p).String() },
		}
	}
	prob := func(name, usage string, ptr func(*Params) *float64) Field {
		return Field{Name: name, Usage: usage,
			Set: func(p *Params, s string) error {
				v, err := ParseProbability(s)
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				*ptr(p) = v
				return nil
			},
			Get: func(p Params) string { return strconv.FormatFloat(*ptr(&p), 'g', -1, 64) },
		}
	}
	return []Field{
		dur("delay", "one-way delay, e.g. 12.5ms", func(p *Params) *time.Duration { return &p.Delay }),
		dur("jitter", "uniform jitter +/- this much added to the delay (order is kept unless --reorder)", func(p *Params) *time.Duration { return &p.Jitter }),
		prob("loss", "Bernoulli loss probability, e.g. 0.01 or 1%", func(p *Params) *float64 { return &p.Loss }),
		prob("ge-p", "Gilbert-Elliott good->bad transition probability per packet (0 disables)", func(p *Params) *float64 { return &p.GEP }),
		prob("ge-r", "Gilbert-Elliott bad->good transition probability per packet", func(p *Params) *float64 { return &p.GER }),
		prob("ge-loss-good", "Gilbert-Elliott loss probability in the good state", func(p *Params) *float64 { return &p.GELossGood }),
		prob("ge-loss-bad", "Gilbert-Elliott loss probability in the bad state", func(p *Params) *float64 { return &p.GELossBad }),
		{Name: "rate", Usage: "rate limit, e.g. 100mbit, 1gbit, 500kbit; 0 = unlimited",
			Set: func(p *Params, s string) error {
				v, err := ParseRate(s)
				if err != nil {
					return fmt.Errorf("rate: %w", err)
				}
				p.RateBits = v
				return nil
			},
			Get: func(p Params) string { return FormatRate(p.RateBits) },
		},
		{Name: "queue-bytes", Usage: "rate-limiter queue bound in bytes (tail drop); 0 = 50ms at the rate, min 64KiB",
			Set: func(p *Params, s string) error {
				v, err := strconv.Atoi(s)
				if err != nil {
					return fmt.Errorf("queue-bytes: %w", err)
				}
				p.QueueBytes = v
				return nil
			},
			Get: func(p Params) string { return strconv.Itoa(p.QueueBytes) },
		},
		prob("duplicate", "probability that a packet is delivered twice", func(p *Params) *float64 { return &p.Duplicate }),
		prob("reorder", "probability that a packet is held back by --reorder-delay (later packets overtake it)", func(p *Params) *float64 { return &p.Reorder }),
		dur("reorder-delay", "extra delay of a reordered packet (0 = 1ms)", func(p *Params) *time.Duration { return &p.ReorderDelay }),
	}
}

// FieldByName returns the field called name.
func FieldByName(name string) (Field, bool) {
	for _, f := range Fields() {
		if f.Name == name {
			return f, true
		}
	}
	return Field{}, false
}

// ToMap formats every field of p.
func (p Params) ToMap() map[string]string {
	m := map[string]string{}
	for _, f := range Fields() {
		m[f.Name] = f.Get(p)
	}
	return m
}

// Apply sets the named fields of p from m and validates the result.
func (p Params) Apply(m map[string]string) (Params, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys {
		f, ok := FieldByName(k)
		if !ok {
			errs = append(errs, fmt.Errorf("unknown link parameter %q", k))
			continue
		}
		if err := f.Set(&p, m[k]); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return p, err
	}
	return p, p.Validate()
}

// ParseProbability accepts "0.01" or "1%".
func ParseProbability(s string) (float64, error) {
	s = strings.TrimSpace(s)
	scale := 1.0
	if strings.HasSuffix(s, "%") {
		s = strings.TrimSuffix(s, "%")
		scale = 100
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("parse probability: %w", err)
	}
	v /= scale
	if v < 0 || v > 1 || math.IsNaN(v) {
		return 0, fmt.Errorf("probability %v not in [0,1]", v)
	}
	return v, nil
}

var rateUnits = []struct {
	suffix string
	mult   float64
}{
	{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1},
	{"gbps", 8e9}, {"mbps", 8e6}, {"kbps", 8e3}, {"bps", 8},
}

// ParseRate parses a rate in bit/s: "100mbit", "1gbit", "500kbit", "1000000"
// (bit/s), or "12mbps" (megabytes per second, as tc does). "", "0" and
// "unlimited" mean no limit.
func ParseRate(s string) (int64, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" || s == "0" || s == "unlimited" || s == "none" {
		return 0, nil
	}
	mult := 1.0
	for _, u := range rateUnits {
		if strings.HasSuffix(s, u.suffix) {
			s = strings.TrimSuffix(s, u.suffix)
			mult = u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("parse rate: %w", err)
	}
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("rate %v out of range", v)
	}
	return int64(v * mult), nil
}

// FormatRate formats bit/s the way ParseRate reads it.
func FormatRate(bits int64) string {
	switch {
	case bits == 0:
		return "0"
	case bits%1e9 == 0:
		return strconv.FormatInt(bits/1e9, 10) + "gbit"
	case bits%1e6 == 0:
		return strconv.FormatInt(bits/1e6, 10) + "mbit"
	case bits%1e3 == 0:
		return strconv.FormatInt(bits/1e3, 10) + "kbit"
	default:
		return strconv.FormatInt(bits, 10) + "bit"
	}
}
