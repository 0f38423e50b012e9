package authhook

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/ratecap"
	"github.com/quictun/quictun/pkg/usage"
)

// Defaults of Config.
const (
	DefaultTimeout     = 2 * time.Second
	DefaultMaxInFlight = 16
	DefaultTTL         = 5 * time.Minute
	DefaultNegativeTTL = 30 * time.Second
	DefaultMaxEntries  = 100_000
	// failureTTL is how long a failed lookup (hook down) is remembered, so
	// a flood of one ID does not become a flood of calls.
	failureTTL = time.Second
	// minSecret is the shortest secret the hook may answer (as --keys-file).
	minSecret = 16
)

// Bounds of an answer's "allow" rules: more, or a longer one, fails the
// lookup (fail closed). 64 rules of at most 512 bytes fit the 64 KiB an
// answer is read to; a rule names one host of at most 253 bytes.
const (
	MaxAllowRules   = 64
	MaxAllowRuleLen = 512
)

// ErrBusy is returned by Lookup while MaxInFlight lookups are running: the
// stream is refused at once, never queued.
var ErrBusy = errors.New("auth hook: too many lookups in flight")

// Config are a Hook's settings.
type Config struct {
	URL         string
	BearerToken string
	Timeout     time.Duration
	MaxInFlight int
	TTL         time.Duration
	NegativeTTL time.Duration
	MaxEntries  int
	// Client makes the calls (nil: one with Timeout).
	Client *http.Client
	// Calls, if set, is told of each call to the hook by result: ok,
	// unknown, error (for the daemon's metrics).
	Calls func(result string)
	Now   func() time.Time
}

// Hook looks key IDs up. Safe for concurrent use.
type Hook struct {
	cfg   Config
	slots chan struct{}

	mu       sync.Mutex
	cache    map[proto.KeyID]entry
	inFlight map[proto.KeyID]*call
	scans    int // of the whole cache by evict
	// calls are the lookups running (Close waits for them).
	calls sync.WaitGroup
}

// Close waits for the lookups running (each ends within Timeout).
func (h *Hook) Close() { h.calls.Wait() }

// Len returns the number of answers cached (at most Config.MaxEntries) and
// of lookups running (at most Config.MaxInFlight): the state a flood of key
// IDs can make the Hook hold.
func (h *Hook) Len() (cached, running int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.cache), len(h.inFlight)
}

type entry struct {
	key     proto.Key
	limits  Limits
	err     error // proto.ErrUnknownKey, or the failure
	expires time.Time
}

// Limits are the caps, quota and destination rules a hook's answer gives
// its key's identity (key=NAME), each optional: the server applies the caps
// and quota as if configured with --rate-limit and --quota for that
// identity (where the operator configured none of its own; without them
// the defaults apply), the rules as if with --allow-for key=NAME=RULE (added
// to the operator's; --deny wins).
type Limits struct {
	// Rate is the answer's "rateLimit", DOWN[/UP] as --rate-limit's
	// (ratecap.ParseRate); HasRate tells it was given.
	Rate    ratecap.Rate
	HasRate bool
	// Quota is the answer's "quota", BYTES/WINDOW as --quota's
	// (usage.ParseQuotaValue); HasQuota tells it was given.
	Quota    usage.Quota
	HasQuota bool
	// Allow are the answer's "allow" rules, each as one --allow-for RULE
	// (endpoint.ParseAllowList: allow rules only; the server adds its
	// --deny and its own listeners); nil: none given.
	Allow *endpoint.AllowList
}

type call struct {
	done chan struct{}
	e    entry
}

// New returns a Hook for cfg.
func New(cfg Config) (*Hook, error) {
	if cfg.URL == "" {
		return nil, errors.New("auth hook: URL is required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.NegativeTTL <= 0 {
		cfg.NegativeTTL = DefaultNegativeTTL
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Timeout}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Calls == nil {
		cfg.Calls = func(string) {}
	}
	return &Hook{cfg: cfg, slots: make(chan struct{}, cfg.MaxInFlight), cache: map[proto.KeyID]entry{}, inFlight: map[proto.KeyID]*call{}}, nil
}

// Lookup returns the key of id: from the cache, or from the hook within
// Timeout. Errors: one wrapping proto.ErrUnknownKey (the hook has no such
// key), ErrBusy, or the hook's failure (down, slow, a bad answer).
func (h *Hook) Lookup(ctx context.Context, id proto.KeyID) (proto.Key, error) {
	k, _, err := h.Answer(ctx, id)
	return k, err
}

// Answer is Lookup with the limits the hook's answer gave the key.
func (h *Hook) Answer(ctx context.Context, id proto.KeyID) (proto.Key, Limits, error) {
	now := h.cfg.Now()
	h.mu.Lock()
	if e, ok := h.cache[id]; ok && now.Before(e.expires) {
		h.mu.Unlock()
		return e.key, e.limits, e.err
	}
	c, running := h.inFlight[id]
	if !running {
		select {
		case h.slots <- struct{}{}:
		default:
			h.mu.Unlock()
			return proto.Key{}, Limits{}, ErrBusy
		}
		c = &call{done: make(chan struct{})}
		h.inFlight[id] = c
	}
	h.mu.Unlock()
	if !running {
		h.calls.Go(func() { h.run(id, c) }) // bounded by slots; ends within Timeout
	}
	select {
	case <-c.done:
		return c.e.key, c.e.limits, c.e.err
	case <-ctx.Done():
		return proto.Key{}, Limits{}, fmt.Errorf("auth hook: %w", ctx.Err())
	}
}

// run makes one call and caches its answer.
func (h *Hook) run(id proto.KeyID, c *call) {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.Timeout)
	defer cancel()
	key, limits, err := h.call(ctx, id)
	ttl := h.cfg.TTL
	switch {
	case err == nil:
		h.cfg.Calls("ok")
	case errors.Is(err, proto.ErrUnknownKey):
		h.cfg.Calls("unknown")
		ttl = h.cfg.NegativeTTL
	default:
		h.cfg.Calls("error")
		ttl = failureTTL
	}
	c.e = entry{key: key, limits: limits, err: err, expires: h.cfg.Now().Add(ttl)}
	h.mu.Lock()
	h.store(id, c.e)
	delete(h.inFlight, id)
	h.mu.Unlock()
	<-h.slots // before the waiters wake: their next lookup finds it free
	close(c.done)
}

// store caches e for id, evicting first when the cache is full. Call with mu.
func (h *Hook) store(id proto.KeyID, e entry) {
	if len(h.cache) >= h.cfg.MaxEntries {
		h.evict()
	}
	h.cache[id] = e
}

// evict drops the expired entries, then arbitrary ones, until the cache is
// at most nine tenths full: a scan of the whole cache (under mu) is then
// followed by at least a tenth of MaxEntries answers before the next.
// (It used to stop as soon as the cache was under MaxEntries: one entry
// freed, so once full, every answer, say to a flood of unknown key IDs,
// scanned the whole cache under mu.) Call with mu.
func (h *Hook) evict() {
	h.scans++
	now := h.cfg.Now()
	low := h.cfg.MaxEntries - max(h.cfg.MaxEntries/10, 1)
	for id, e := range h.cache {
		if !now.Before(e.expires) {
			delete(h.cache, id)
		}
	}
	for id := range h.cache {
		if len(h.cache) <= low {
			break
		}
		delete(h.cache, id)
	}
}

// answer is the hook's 200 body.
type answer struct {
	Name   string `json:"name"`
	Secret string `json:"secret"`
	// RateLimit and Quota are optional (see Limits).
	RateLimit string `json:"rateLimit"`
	Quota     string `json:"quota"`
	// Allow is optional: destination rules for the key's identity.
	Allow []string `json:"allow"`
}

// limits parses the answer's optional caps and quota, with the bounds of
// --rate-limit and --quota.
func (a answer) limits() (Limits, error) {
	var l Limits
	var err error
	if a.RateLimit != "" {
		if l.Rate, err = ratecap.ParseRate(a.RateLimit); err != nil {
			return Limits{}, fmt.Errorf("rateLimit: %w", err)
		}
		l.HasRate = true
	}
	if a.Quota != "" {
		if l.Quota, err = usage.ParseQuotaValue(a.Quota); err != nil {
			return Limits{}, fmt.Errorf("quota: %w", err)
		}
		l.HasQuota = true
	}
	if l.Allow, err = parseAllow(a.Allow); err != nil {
		return Limits{}, fmt.Errorf("allow: %w", err)
	}
	return l, nil
}

// parseAllow parses an answer's allow rules within MaxAllowRules and
// MaxAllowRuleLen (none: nil).
func parseAllow(rules []string) (*endpoint.AllowList, error) {
	if len(rules) == 0 {
		return nil, nil
	}
	if len(rules) > MaxAllowRules {
		return nil, fmt.Errorf("%d rules, at most %d", len(rules), MaxAllowRules)
	}
	for i, r := range rules {
		if len(r) > MaxAllowRuleLen {
			return nil, fmt.Errorf("rule %d: %d bytes, at most %d", i, len(r), MaxAllowRuleLen)
		}
	}
	return endpoint.ParseAllowList(rules)
}

// call asks the hook about id.
func (h *Hook) call(ctx context.Context, id proto.KeyID) (proto.Key, Limits, error) {
	body, _ := json.Marshal(map[string]string{"keyId": id.String()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return proto.Key{}, Limits{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if h.cfg.BearerToken != "" {
		req.Header.Set("Authorization", "Bearer "+h.cfg.BearerToken)
	}
	resp, err := h.cfg.Client.Do(req)
	if err != nil {
		return proto.Key{}, Limits{}, fmt.Errorf("auth hook: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return proto.Key{}, Limits{}, fmt.Errorf("auth hook: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return proto.Key{}, Limits{}, fmt.Errorf("auth hook: %w", proto.ErrUnknownKey)
	default:
		return proto.Key{}, Limits{}, fmt.Errorf("auth hook: status %d", resp.StatusCode)
	}
	var a answer
	if err := json.Unmarshal(b, &a); err != nil {
		return proto.Key{}, Limits{}, fmt.Errorf("auth hook: answer: %w", err)
	}
	secret, err := base64.StdEncoding.DecodeString(a.Secret)
	switch {
	case err != nil || len(secret) < minSecret:
		return proto.Key{}, Limits{}, fmt.Errorf("auth hook: answer: the secret is not base64 of at least %d bytes", minSecret)
	case !validName(a.Name):
		return proto.Key{}, Limits{}, fmt.Errorf("auth hook: answer: name %q: use letters, digits, '.', '_' and '-'", a.Name)
	case proto.KeyIDOf(secret) != id:
		return proto.Key{}, Limits{}, errors.New("auth hook: answer: the secret's key ID is not the one asked about")
	}
	limits, err := a.limits()
	if err != nil {
		return proto.Key{}, Limits{}, fmt.Errorf("auth hook: answer: %w", err)
	}
	kr, err := proto.NewKeyring(proto.Key{Name: a.Name, Secret: secret})
	if err != nil {
		return proto.Key{}, Limits{}, fmt.Errorf("auth hook: answer: %w", err)
	}
	return kr.Keys()[0], limits, nil
}

func validName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}
