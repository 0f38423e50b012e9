package usage

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// quotaBuckets is how many parts a quota's window is counted in: the
// window rolls by a thirtieth of itself (a day for 30d).
const quotaBuckets = 30

// Quota is how many bytes (up and down together) an identity may move in
// any window of Window: a rolling window, counted in quotaBuckets parts.
type Quota struct {
	Bytes  int64
	Window time.Duration
}

// granularity is the part of the window a bucket counts.
func (q Quota) granularity() time.Duration { return q.Window / quotaBuckets }

// quotas are the quotas by identity and the default (none: zero Quota).
type quotas struct {
	mu    sync.RWMutex
	rules map[string]Quota
	def   Quota
	// hooked are the quotas an auth hook's answers gave identities
	// (SetHookedQuota), below rules and above def; at most MaxHooked.
	hooked map[string]Quota
}

// MaxHooked bounds the identities with a quota from an auth hook. Past it,
// a tenth of them is dropped: those identities get the default until the
// hook answers for them again (within its TTL).
const MaxHooked = 100_000

func (q *quotas) of(identity string) Quota {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if r, ok := q.rules[identity]; ok {
		return r
	}
	if r, ok := q.hooked[identity]; ok {
		return r
	}
	return q.def
}

// SetHookedQuota sets the quota an auth hook's answer gives identity (ok
// false: the answer gave none, the default applies again). A quota
// configured for identity (--quota) wins over it. It applies from the next
// tick (a second), as a reload's.
func (l *Ledger) SetHookedQuota(identity string, quota Quota, ok bool) {
	q := &l.quotas
	q.mu.RLock()
	old, had := q.hooked[identity]
	q.mu.RUnlock()
	if had == ok && old == quota {
		return // the common case: the same answer, from the hook's cache
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !ok {
		delete(q.hooked, identity)
		return
	}
	if q.hooked == nil {
		q.hooked = map[string]Quota{}
	}
	if _, had := q.hooked[identity]; !had && len(q.hooked) >= MaxHooked {
		for id := range q.hooked { // a tenth, arbitrary ones
			if len(q.hooked) <= MaxHooked-MaxHooked/10 {
				break
			}
			delete(q.hooked, id)
		}
	}
	q.hooked[identity] = quota
}

// HookedQuotas returns the number of identities with a quota from a hook.
func (l *Ledger) HookedQuotas() int {
	l.quotas.mu.RLock()
	defer l.quotas.mu.RUnlock()
	return len(l.quotas.hooked)
}

// SetQuotas replaces the quotas (a reload): rules by identity and def for
// the others (a zero Quota: none). An identity whose window changed starts
// counting afresh.
func (l *Ledger) SetQuotas(rules map[string]Quota, def Quota) {
	l.quotas.mu.Lock()
	l.quotas.rules, l.quotas.def = rules, def
	l.quotas.mu.Unlock()
}

// quotaUse is an account's bytes in the buckets of its quota's window.
// Guarded by the Account's mu.
type quotaUse struct {
	gran    time.Duration // the buckets' span; 0: none counted yet
	first   int64         // index (time/gran) of buckets[0]
	buckets [quotaBuckets]int64
}

// add counts n bytes moved by now into the bucket of now and returns the
// bytes in the window ending at now.
func (u *quotaUse) add(q Quota, now time.Time, n int64) int64 {
	gran := q.granularity()
	idx := now.UnixNano() / int64(gran)
	if u.gran != gran {
		*u = quotaUse{gran: gran, first: idx - quotaBuckets + 1}
	}
	if shift := idx - (u.first + quotaBuckets - 1); shift > 0 {
		if shift >= quotaBuckets {
			u.buckets = [quotaBuckets]int64{}
		} else {
			copy(u.buckets[:], u.buckets[shift:])
			clear(u.buckets[quotaBuckets-shift:])
		}
		u.first += shift
	}
	u.buckets[quotaBuckets-1] += n
	var sum int64
	for _, b := range u.buckets {
		sum += b
	}
	return sum
}

// OverQuota reports whether the identity has used its quota (as of the
// last tick): its new tunnels are refused with quota.
func (a *Account) OverQuota() bool { return a.overQuota.Load() }

// quotaTick counts the n bytes a moved since the last tick into its quota
// window (called by tick with mu held); it returns the bytes in the window
// and whether a crossed its quota just now.
func (a *Account) quotaTick(q Quota, now time.Time, n int64) (used int64, crossed bool) {
	if q.Bytes <= 0 || q.Window <= 0 {
		a.overQuota.Store(false)
		return 0, false
	}
	used = a.quota.add(q, now, n)
	over := used >= q.Bytes
	was := a.overQuota.Swap(over)
	return used, over && !was
}

// ParseQuota parses IDENTITY=BYTES/WINDOW, e.g. key=alice=100GiB/30d.
// BYTES has a unit B, kB, MB, GB, TB, KiB, MiB, GiB, TiB; WINDOW is a
// number of days (d) or hours (h), from 1h to 366d.
func ParseQuota(spec string) (string, Quota, error) {
	i := strings.LastIndex(spec, "=")
	if i <= 0 {
		return "", Quota{}, fmt.Errorf("--quota %q: want IDENTITY=BYTES/WINDOW, e.g. key=alice=100GiB/30d", spec)
	}
	q, err := ParseQuotaValue(spec[i+1:])
	if err != nil {
		return "", Quota{}, fmt.Errorf("--quota %q: %w", spec, err)
	}
	return spec[:i], q, nil
}

var byteUnits = []struct {
	suffix string
	n      float64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"kB", 1e3}, {"B", 1},
}

// ParseQuotaValue parses BYTES/WINDOW (see ParseQuota).
func ParseQuotaValue(s string) (Quota, error) {
	size, window, ok := strings.Cut(s, "/")
	if !ok {
		return Quota{}, fmt.Errorf("quota %q: want BYTES/WINDOW, e.g. 100GiB/30d", s)
	}
	var q Quota
	for _, u := range byteUnits {
		if num, ok := strings.CutSuffix(size, u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			if err == nil && v > 0 && v*u.n < 1<<62 {
				q.Bytes = int64(v * u.n)
			}
			break
		}
	}
	if q.Bytes <= 0 {
		return Quota{}, fmt.Errorf("quota %q: the size is a positive number and a unit: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB", s)
	}
	unit := time.Duration(0)
	num := window
	if n, ok := strings.CutSuffix(window, "d"); ok {
		num, unit = n, 24*time.Hour
	} else if n, ok := strings.CutSuffix(window, "h"); ok {
		num, unit = n, time.Hour
	}
	v, err := strconv.Atoi(num)
	if unit == 0 || err != nil || v <= 0 || time.Duration(v)*unit > 366*24*time.Hour {
		return Quota{}, fmt.Errorf("quota %q: the window is whole days (d) or hours (h), from 1h to 366d", s)
	}
	q.Window = time.Duration(v) * unit
	return q, nil
}
