package authhook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
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

// ErrRefused is wrapped by the error of AnswerCertificate when the hook
// answered 403 or 404: the certificate may not authenticate.
var ErrRefused = errors.New("the auth hook refused the certificate")

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
	// unknown (a key ID's 404), refused (a certificate's 403 or 404), error
	// (for the daemon's metrics).
	Calls func(result string)
	Now   func() time.Time
}

// Hook looks key IDs and client certificates up. Safe for concurrent use.
type Hook struct {
	cfg   Config
	slots chan struct{}

	mu sync.Mutex
	// cache and inFlight hold key IDs' and certificates' answers and
	// calls alike: one bound (MaxEntries, MaxInFlight) for both.
	cache    map[query]entry
	inFlight map[query]*call
	scans    int // of the whole cache by evict
	// calls are the lookups running (Close waits for them).
	calls sync.WaitGroup
}

// Close waits for the lookups running (each ends within Timeout).
func (h *Hook) Close() { h.calls.Wait() }

// Len returns the number of answers cached (at most Config.MaxEntries) and
// of lookups running (at most Config.MaxInFlight): the state a flood of key
// IDs (or certificates) can make the Hook hold.
func (h *Hook) Len() (cached, running int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.cache), len(h.inFlight)
}

// query is what a lookup asks about, the key of its answer in the cache: a
// key ID, or a client certificate by its SHA-256 (isCert).
type query struct {
	keyID  proto.KeyID
	cert   [sha256.Size]byte
	isCert bool
}

// request is a query with what the call sends besides: a certificate's
// subject (its identity) and serial number, in hex.
type request struct {
	q               query
	subject, serial string
}

type entry struct {
	key     proto.Key
	limits  Limits
	err     error // proto.ErrUnknownKey, ErrRefused, or the failure
	expires time.Time
}

// Limits are the caps, quota and destination rules a hook's answer gives
// its key's identity (key=NAME) or its certificate's (CN=NAME), each
// optional: the server applies the caps
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
	return &Hook{cfg: cfg, slots: make(chan struct{}, cfg.MaxInFlight), cache: map[query]entry{}, inFlight: map[query]*call{}}, nil
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
	e := h.lookup(ctx, request{q: query{keyID: id}})
	return e.key, e.limits, e.err
}

// AnswerCertificate asks whether the client certificate cert, which the
// server names subject ("CN=NAME"; "" for one without a common name), may
// authenticate, and the limits of its identity: from the cache (by the
// certificate's SHA-256), or from the hook within Timeout. Errors: one
// wrapping ErrRefused (the hook said no: 403 or 404), ErrBusy, or the
// hook's failure (down, slow, a bad answer). Key IDs and certificates share
// the cache and the lookups in flight.
func (h *Hook) AnswerCertificate(ctx context.Context, subject string, cert *x509.Certificate) (Limits, error) {
	r := request{q: query{cert: sha256.Sum256(cert.Raw), isCert: true}, subject: subject}
	if cert.SerialNumber != nil {
		r.serial = cert.SerialNumber.Text(16)
	}
	e := h.lookup(ctx, r)
	return e.limits, e.err
}

// lookup returns r's answer: from the cache, or from a call (one per query
// in flight, within MaxInFlight: past it ErrBusy at once).
func (h *Hook) lookup(ctx context.Context, r request) entry {
	now := h.cfg.Now()
	h.mu.Lock()
	if e, ok := h.cache[r.q]; ok && now.Before(e.expires) {
		h.mu.Unlock()
		return e
	}
	c, running := h.inFlight[r.q]
	if !running {
		select {
		case h.slots <- struct{}{}:
		default:
			h.mu.Unlock()
			return entry{err: ErrBusy}
		}
		c = &call{done: make(chan struct{})}
		h.inFlight[r.q] = c
	}
	h.mu.Unlock()
	if !running {
		h.calls.Go(func() { h.run(r, c) }) // bounded by slots; ends within Timeout
	}
	select {
	case <-c.done:
		return c.e
	case <-ctx.Done():
		return entry{err: fmt.Errorf("auth hook: %w", ctx.Err())}
	}
}

// run makes one call and caches its answer.
func (h *Hook) run(r request, c *call) {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.Timeout)
	defer cancel()
	key, limits, err := h.call(ctx, r)
	ttl := h.cfg.TTL
	switch {
	case err == nil:
		h.cfg.Calls("ok")
	case errors.Is(err, proto.ErrUnknownKey):
		h.cfg.Calls("unknown")
		ttl = h.cfg.NegativeTTL
	case errors.Is(err, ErrRefused):
		h.cfg.Calls("refused")
		ttl = h.cfg.NegativeTTL
	default:
		h.cfg.Calls("error")
		ttl = failureTTL
	}
	c.e = entry{key: key, limits: limits, err: err, expires: h.cfg.Now().Add(ttl)}
	h.mu.Lock()
	h.store(r.q, c.e)
	delete(h.inFlight, r.q)
	h.mu.Unlock()
	<-h.slots // before the waiters wake: their next lookup finds it free
	close(c.done)
}

// store caches e for q, evicting first when the cache is full. Call with mu.
func (h *Hook) store(q query, e entry) {
	if len(h.cache) >= h.cfg.MaxEntries {
		h.evict()
	}
	h.cache[q] = e
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
	for q, e := range h.cache {
		if !now.Before(e.expires) {
			delete(h.cache, q)
		}
	}
	for q := range h.cache {
		if len(h.cache) <= low {
			break
		}
		delete(h.cache, q)
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

// call asks the hook about r: a key ID's secret, or a certificate's yes or
// no.
func (h *Hook) call(ctx context.Context, r request) (proto.Key, Limits, error) {
	if r.q.isCert {
		status, b, err := h.post(ctx, map[string]string{"subject": r.subject, "sha256": hex.EncodeToString(r.q.cert[:]), "serial": r.serial})
		if err != nil {
			return proto.Key{}, Limits{}, err
		}
		l, err := certAnswer(status, b)
		return proto.Key{}, l, err
	}
	status, b, err := h.post(ctx, map[string]string{"keyId": r.q.keyID.String()})
	if err != nil {
		return proto.Key{}, Limits{}, err
	}
	return keyAnswer(status, b, r.q.keyID)
}

// post sends body to the hook and returns its answer's status and body
// (at most 64 KiB).
func (h *Hook) post(ctx context.Context, body map[string]string) (int, []byte, error) {
	js, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.cfg.URL, bytes.NewReader(js))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if h.cfg.BearerToken != "" {
		req.Header.Set("Authorization", "Bearer "+h.cfg.BearerToken)
	}
	resp, err := h.cfg.Client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("auth hook: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return 0, nil, fmt.Errorf("auth hook: %w", err)
	}
	return resp.StatusCode, b, nil
}

// keyAnswer reads the hook's answer about key ID id.
func keyAnswer(status int, b []byte, id proto.KeyID) (proto.Key, Limits, error) {
	switch status {
	case http.StatusOK:
	case http.StatusNotFound:
		return proto.Key{}, Limits{}, fmt.Errorf("auth hook: %w", proto.ErrUnknownKey)
	default:
		return proto.Key{}, Limits{}, fmt.Errorf("auth hook: status %d", status)
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

// certAnswer reads the hook's answer about a certificate: 200 with its
// optional limits is a yes, 403 or 404 a no (ErrRefused). A yes carrying a
// name or a secret fails: a certificate's identity is its own, and the
// hook that sends one mistook the question.
func certAnswer(status int, b []byte) (Limits, error) {
	switch status {
	case http.StatusOK:
	case http.StatusForbidden, http.StatusNotFound:
		return Limits{}, fmt.Errorf("auth hook: status %d: %w", status, ErrRefused)
	default:
		return Limits{}, fmt.Errorf("auth hook: status %d", status)
	}
	var a answer
	if err := json.Unmarshal(b, &a); err != nil {
		return Limits{}, fmt.Errorf("auth hook: answer: %w", err)
	}
	if a.Name != "" || a.Secret != "" {
		return Limits{}, errors.New("auth hook: answer: a certificate's answer carries no name or secret")
	}
	limits, err := a.limits()
	if err != nil {
		return Limits{}, fmt.Errorf("auth hook: answer: %w", err)
	}
	return limits, nil
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
