package usage

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Anonymous is the identity of a client that proved none (a server with
// --insecure-no-auth, or the unnamed --secret-file key's holders when the
// server also has no client certificates: then every client shares it).
const Anonymous = "anonymous"

// Other is the metrics label of every identity without series of its own
// (Config.Labeled), so that the label set stays bounded.
const Other = "other"

// Defaults of Config.
const (
	// DefaultSaveInterval is how often the totals are written: at most this
	// much accounting (plus one tick) is lost when the process is killed
	// without a chance to save (SIGKILL, a crash, power loss).
	DefaultSaveInterval = 5 * time.Second
	// DefaultMaxIdentities bounds the identities the ledger keeps apart;
	// more (possible only with client certificates from a CA that issues
	// them freely) are counted under Other.
	DefaultMaxIdentities = 100_000
	// tick is how often live tunnels are folded into totals and rates.
	tick = time.Second
	// DefaultDeferredLoadAfter is how long a Deferred ledger waits for
	// LoadDeferred before it loads the state file itself.
	DefaultDeferredLoadAfter = time.Minute
)

// Config are the settings of a Ledger.
type Config struct {
	// Path is the state file the totals are kept in ("": not kept).
	Path string
	// SaveInterval is how often they are written (0: DefaultSaveInterval).
	SaveInterval time.Duration
	// MaxIdentities bounds the accounts (0: DefaultMaxIdentities).
	MaxIdentities int
	// Labeled are the identities with metrics series of their own; the
	// others share Other's.
	Labeled []string
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Deferred: the state file is loaded by LoadDeferred (a new process in
	// an upgrade, once its predecessor has saved its last totals), or
	// after DeferredLoadAfter (0: DefaultDeferredLoadAfter) at the latest;
	// nothing is saved before. What is counted meanwhile adds up with the
	// file's totals.
	Deferred          bool
	DeferredLoadAfter time.Duration
}

// Ledger holds the accounts of every identity. Safe for concurrent use.
type Ledger struct {
	cfg     Config
	labeled map[string]bool

	mu       sync.RWMutex
	accounts map[string]*Account
	// other holds what identities past MaxIdentities use.
	other *Account

	saveMu sync.Mutex // one writer of the state file at a time
	// loaded: the state file was read (at New, or by LoadDeferred); saves
	// wait for it. frozen: SaveFinal wrote the last totals of this
	// process (an upgrade's new one owns the file now).
	loaded, frozen atomic.Bool
	loadOnce       sync.Once
	loadErr        error
	started        time.Time

	quotas quotas
}

// New returns a Ledger for cfg, with the totals of cfg.Path if it exists.
// A state file that cannot be read or parsed is an error (the operator
// decides whether to move it away), not silently reset.
func New(cfg Config) (*Ledger, error) {
	if cfg.SaveInterval <= 0 {
		cfg.SaveInterval = DefaultSaveInterval
	}
	if cfg.MaxIdentities <= 0 {
		cfg.MaxIdentities = DefaultMaxIdentities
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.DeferredLoadAfter <= 0 {
		cfg.DeferredLoadAfter = DefaultDeferredLoadAfter
	}
	l := &Ledger{cfg: cfg, labeled: map[string]bool{}, accounts: map[string]*Account{}, started: cfg.Now()}
	for _, id := range cfg.Labeled {
		l.labeled[id] = true
	}
	l.other = newAccount(Other)
	if !cfg.Deferred {
		if err := l.LoadDeferred(); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// LoadDeferred reads the state file's totals into the accounts, adding up
// with what was counted before, once (later calls return the first's
// error); saves start then. New calls it unless Config.Deferred.
func (l *Ledger) LoadDeferred() error {
	l.loadOnce.Do(func() {
		if l.cfg.Path != "" {
			l.loadErr = l.load(l.cfg.Path)
		}
		l.loaded.Store(true)
	})
	return l.loadErr
}

// Account is the usage of one identity. Its methods are safe for
// concurrent use.
type Account struct {
	name string

	mu sync.Mutex
	// live are the counters of its open tunnels.
	live map[*liveTunnel]struct{}
	// up and down are the bytes of its closed tunnels (and those loaded
	// from the state file).
	up, down int64
	// upLive, downLive are its live tunnels' bytes at the last tick.
	upLive, downLive int64
	// rateUp, rateDown are the bytes per second over the last tick.
	rateUp, rateDown float64
	lastTick         time.Time
	// ticked is up+down as of the last tick (the loaded totals at start):
	// what moved since goes into the quota window.
	ticked int64

	tunnels, conns, refused atomic.Int64
	activeConns             atomic.Int64
	activeTunnels           atomic.Int64
	// suspendedUntil is when a kick's suspension ends (unix ns; 0: none).
	suspendedUntil atomic.Int64
	// quota counts its bytes in its quota's window (guarded by mu);
	// overQuota is set while they reach the quota.
	quota     quotaUse
	overQuota atomic.Bool
}

// liveTunnel is an open tunnel's counters; base are the bytes they held
// when the tunnel came from a previous process (TrackFrom), counted there.
type liveTunnel struct {
	up, down         *atomic.Int64
	baseUp, baseDown int64
}

// bytes are the tunnel's bytes each way counted here.
func (t *liveTunnel) bytes() (up, down int64) {
	return t.up.Load() - t.baseUp, t.down.Load() - t.baseDown
}

func newAccount(name string) *Account {
	return &Account{name: name, live: map[*liveTunnel]struct{}{}}
}

// Name is the account's identity.
func (a *Account) Name() string { return a.name }

// Track counts an open tunnel's bytes: up and down are its relay's
// counters (toward the destination and toward the client), which the data
// path keeps anyway; the ledger reads them once a tick. The returned func,
// called once when the tunnel ends, adds their final values to the totals.
func (a *Account) Track(up, down *atomic.Int64) (done func()) {
	a.tunnels.Add(1)
	return a.track(&liveTunnel{up: up, down: down})
}

// TrackFrom is Track for a tunnel a previous process handed over (an
// upgrade): its counters start at baseUp and baseDown, which that process
// counted, and it is not counted as a new tunnel.
func (a *Account) TrackFrom(up, down *atomic.Int64, baseUp, baseDown int64) (done func()) {
	return a.track(&liveTunnel{up: up, down: down, baseUp: baseUp, baseDown: baseDown})
}

func (a *Account) track(t *liveTunnel) (done func()) {
	a.activeTunnels.Add(1)
	a.mu.Lock()
	a.live[t] = struct{}{}
	a.mu.Unlock()
	return sync.OnceFunc(func() {
		up, down := t.bytes()
		a.mu.Lock()
		delete(a.live, t)
		a.up += up
		a.down += down
		a.mu.Unlock()
		a.activeTunnels.Add(-1)
	})
}

// Refused counts a destination refused for the identity.
func (a *Account) Refused() { a.refused.Add(1) }

// ConnOpened counts a connection that proved the identity; the returned
// func, called once at its end, stops counting it as active.
func (a *Account) ConnOpened() (closed func()) {
	a.conns.Add(1)
	a.activeConns.Add(1)
	return sync.OnceFunc(func() { a.activeConns.Add(-1) })
}

// SuspendedUntil is when the identity's suspension ends (zero: not
// suspended at now).
func (a *Account) SuspendedUntil(now time.Time) time.Time {
	ns := a.suspendedUntil.Load()
	if ns == 0 || now.UnixNano() >= ns {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

// Get returns the account of identity ("" is Anonymous), creating it; past
// MaxIdentities, the shared account of Other.
func (l *Ledger) Get(identity string) *Account {
	if identity == "" {
		identity = Anonymous
	}
	l.mu.RLock()
	a := l.accounts[identity]
	l.mu.RUnlock()
	if a != nil {
		return a
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if a = l.accounts[identity]; a != nil {
		return a
	}
	if len(l.accounts) >= l.cfg.MaxIdentities {
		return l.other
	}
	a = newAccount(identity)
	l.accounts[identity] = a
	return a
}

// lookup returns the account of identity if it exists.
func (l *Ledger) lookup(identity string) *Account {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.accounts[identity]
}

// Active reports whether identity (an account's name, Other too) has a
// connection or a tunnel open. Safe for concurrent use; it takes only the
// ledger's read lock.
func (l *Ledger) Active(identity string) bool {
	a := l.lookup(identity)
	if a == nil && identity == Other {
		a = l.other
	}
	return a != nil && (a.activeConns.Load() > 0 || a.activeTunnels.Load() > 0)
}

// Suspend refuses identity until now+d (a kick; d <= 0 lifts a
// suspension). It returns when the suspension ends.
func (l *Ledger) Suspend(identity string, d time.Duration) time.Time {
	a := l.Get(identity)
	if d <= 0 {
		a.suspendedUntil.Store(0)
		return time.Time{}
	}
	until := l.cfg.Now().Add(d).UTC()
	a.suspendedUntil.Store(until.UnixNano())
	return until
}

// Suspended reports until when identity is suspended (zero: it is not).
func (l *Ledger) Suspended(identity string) time.Time {
	if identity == "" {
		identity = Anonymous
	}
	a := l.lookup(identity)
	if a == nil {
		return time.Time{}
	}
	return a.SuspendedUntil(l.cfg.Now())
}

// Usage is one identity's figures (Snapshot, the admin API's
// /identities and the state file).
type Usage struct {
	Identity            string    `json:"identity"`
	BytesUpstream       int64     `json:"bytesUpstream"`
	BytesDownstream     int64     `json:"bytesDownstream"`
	UpstreamBytesPerSec float64   `json:"upstreamBytesPerSec"`
	DownBytesPerSec     float64   `json:"downstreamBytesPerSec"`
	Tunnels             int64     `json:"tunnels"`
	ActiveTunnels       int64     `json:"activeTunnels"`
	Connections         int64     `json:"connections"`
	ActiveConnections   int64     `json:"activeConnections"`
	RefusedDestinations int64     `json:"refusedDestinations"`
	SuspendedUntil      time.Time `json:"suspendedUntil,omitzero"`
	// QuotaUsedBytes are the bytes (up and down) in its quota's current
	// window, as of the last tick; OverQuota is set while they reach it.
	QuotaUsedBytes int64 `json:"quotaUsedBytes,omitempty"`
	OverQuota      bool  `json:"overQuota,omitempty"`
}

// usage returns a's figures: its totals include its live tunnels' bytes
// as they are now.
func (a *Account) usage(now time.Time) Usage {
	a.mu.Lock()
	up, down := a.up, a.down
	for t := range a.live {
		u, d := t.bytes()
		up += u
		down += d
	}
	ru, rd := a.rateUp, a.rateDown
	var quotaUsed int64
	for _, b := range a.quota.buckets {
		quotaUsed += b
	}
	a.mu.Unlock()
	return Usage{
		Identity: a.name, BytesUpstream: up, BytesDownstream: down, UpstreamBytesPerSec: ru, DownBytesPerSec: rd,
		Tunnels: a.tunnels.Load(), ActiveTunnels: a.activeTunnels.Load(),
		Connections: a.conns.Load(), ActiveConnections: a.activeConns.Load(),
		RefusedDestinations: a.refused.Load(), SuspendedUntil: a.SuspendedUntil(now),
		QuotaUsedBytes: quotaUsed, OverQuota: a.OverQuota(),
	}
}

// tick folds a's live tunnels into its rates and its quota window (q);
// crossed reports that it reached its quota just now.
func (a *Account) tick(now time.Time, q Quota) (used int64, crossed bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	up, down := a.up, a.down
	for t := range a.live {
		u, d := t.bytes()
		up += u
		down += d
	}
	if !a.lastTick.IsZero() {
		if dt := now.Sub(a.lastTick).Seconds(); dt > 0 {
			a.rateUp = float64(up-a.upLive) / dt
			a.rateDown = float64(down-a.downLive) / dt
		}
	}
	a.upLive, a.downLive, a.lastTick = up, down, now
	moved := up + down - a.ticked
	a.ticked = up + down
	return a.quotaTick(q, now, moved)
}

// all returns every account, Other's last if it was used.
func (l *Ledger) all() []*Account {
	l.mu.RLock()
	out := make([]*Account, 0, len(l.accounts)+1)
	for _, a := range l.accounts {
		out = append(out, a)
	}
	l.mu.RUnlock()
	slices.SortFunc(out, func(a, b *Account) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	if l.other.tunnels.Load() > 0 || l.other.conns.Load() > 0 || l.other.refused.Load() > 0 {
		out = append(out, l.other)
	}
	return out
}

// Snapshot returns every identity's figures, sorted by identity (Other's,
// if used, last).
func (l *Ledger) Snapshot() []Usage {
	now := l.cfg.Now()
	accts := l.all()
	out := make([]Usage, 0, len(accts))
	for _, a := range accts {
		out = append(out, a.usage(now))
	}
	return out
}

// Series returns the figures by metrics label: one per identity of
// Config.Labeled that has an account, the rest summed under Other.
func (l *Ledger) Series() []Usage {
	var other Usage
	other.Identity = Other
	var out []Usage
	for _, u := range l.Snapshot() {
		if l.labeled[u.Identity] {
			out = append(out, u)
			continue
		}
		other.BytesUpstream += u.BytesUpstream
		other.BytesDownstream += u.BytesDownstream
		other.UpstreamBytesPerSec += u.UpstreamBytesPerSec
		other.DownBytesPerSec += u.DownBytesPerSec
		other.Tunnels += u.Tunnels
		other.ActiveTunnels += u.ActiveTunnels
		other.Connections += u.Connections
		other.ActiveConnections += u.ActiveConnections
		other.RefusedDestinations += u.RefusedDestinations
	}
	return append(out, other)
}

// Identity returns identity's figures (false: no such account).
func (l *Ledger) Identity(identity string) (Usage, bool) {
	a := l.lookup(identity)
	if a == nil {
		return Usage{}, false
	}
	return a.usage(l.cfg.Now()), true
}

// Hooks are told what Run notices.
type Hooks struct {
	// SaveFailed is told of a periodic save that failed.
	SaveFailed func(error)
	// OverQuota is told, once per crossing, of an identity that reached
	// its quota (its new tunnels are refused from now on).
	OverQuota func(identity string, used int64, q Quota)
}

// Run folds live tunnels into the rates and the quota windows every second
// and saves the totals every SaveInterval until ctx is done; then it saves
// once more. It returns the last save's error, if any.
func (l *Ledger) Run(ctx context.Context, h Hooks) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	lastSave := l.cfg.Now()
	for {
		select {
		case <-ctx.Done():
			return l.Save()
		case <-t.C:
		}
		now := l.cfg.Now()
		if !l.loaded.Load() && now.Sub(l.started) >= l.cfg.DeferredLoadAfter {
			// No LoadDeferred came (the handover failed): the file as it is.
			if err := l.LoadDeferred(); err != nil && h.SaveFailed != nil {
				h.SaveFailed(err)
			}
		}
		l.tickAll(now, h)
		if l.cfg.Path != "" && now.Sub(lastSave) >= l.cfg.SaveInterval {
			lastSave = now
			if err := l.Save(); err != nil && h.SaveFailed != nil {
				h.SaveFailed(err)
			}
		}
	}
}

// Save writes the totals to the state file atomically (a temporary file,
// fsync, rename, fsync of the directory): a crash leaves the previous or
// the new file, never half of one.
// Before the file was loaded (Config.Deferred) and after SaveFinal it
// writes nothing.
func (l *Ledger) Save() error {
	if l.cfg.Path == "" || !l.loaded.Load() {
		return nil
	}
	l.saveMu.Lock()
	defer l.saveMu.Unlock()
	if l.frozen.Load() {
		return nil
	}
	if err := writeState(l.cfg.Path, l.cfg.Now(), l.Snapshot(), quotaState(l.all())); err != nil {
		return fmt.Errorf("usage: save %s: %w", l.cfg.Path, err)
	}
	return nil
}

// SaveFinal writes this process's last totals (an upgrade: its tunnels
// ended or were handed over, it counts nothing more) and saves nothing
// after them: the new process, which loads them (LoadDeferred), owns the
// file from now on.
func (l *Ledger) SaveFinal() error {
	err := l.Save()
	l.saveMu.Lock()
	l.frozen.Store(true)
	l.saveMu.Unlock()
	return err
}

// tickAll ticks every account at now (in no order: no sort each second).
func (l *Ledger) tickAll(now time.Time, h Hooks) {
	l.mu.RLock()
	accts := make([]*Account, 0, len(l.accounts)+1)
	for _, a := range l.accounts {
		accts = append(accts, a)
	}
	l.mu.RUnlock()
	for _, a := range append(accts, l.other) {
		q := l.quotas.of(a.name)
		if used, crossed := a.tick(now, q); crossed && h.OverQuota != nil {
			h.OverQuota(a.name, used, q)
		}
	}
}
