package server

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/quictun/quictun/pkg/authhook"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/ratecap"
	"github.com/quictun/quictun/pkg/usage"
)

// limitsHook is an auth hook whose answers can carry caps and a quota
// (pkg/authhook's Hook).
type limitsHook interface {
	Answer(ctx context.Context, id proto.KeyID) (proto.Key, authhook.Limits, error)
}

// CertAuthHook is asked about client certificates (Config.CertAuthHook):
// AnswerCertificate's error wraps authhook.ErrRefused when the hook says
// no.
type CertAuthHook interface {
	AnswerCertificate(ctx context.Context, subject string, cert *x509.Certificate) (authhook.Limits, error)
}

// hookLimits wraps the auth hook: each key it answers has the answer's caps
// and quota applied to its identity, key=NAME, as if the server had them
// in --rate-limit and --quota (those the operator configured for that
// identity win; an answer without them leaves the defaults). Every lookup
// applies them, the cached ones too: a later answer (after the hook's TTL)
// that changes them applies at once, to open tunnels too.
//
// The answer's destination rules go to the egress with the key
// (egress.KeyRulesHook), for that stream: they add up with the operator's
// --allow and --allow-for key=NAME (rules only ever grant; the operator
// takes away with --deny, which wins over both). The operator's
// --allow-for does not replace them: the hook picks the name it answers,
// so pinning one name's rules would not bound what the hook can grant.
//
// A client certificate's answer (egress.CertHook) is applied the same way
// to its identity, CN=NAME (nothing for a certificate without a common
// name: it has no identity of its own).
type hookLimits struct {
	hook  limitsHook     // nil: no key lookups (KeyHook not wrapped)
	certs CertAuthHook   // nil: no certificate lookups
	caps  *ratecap.Table // nil: no caps machinery (see New)
	usage *usage.Ledger  // nil: no accounts, the quota is not applied
}

// Lookup implements egress.KeyHook.
func (h hookLimits) Lookup(ctx context.Context, id proto.KeyID) (proto.Key, error) {
	key, _, err := h.LookupRules(ctx, id)
	return key, err
}

// LookupRules implements egress.KeyRulesHook.
func (h hookLimits) LookupRules(ctx context.Context, id proto.KeyID) (proto.Key, *endpoint.AllowList, error) {
	key, l, err := h.hook.Answer(ctx, id)
	if err != nil {
		return key, nil, err
	}
	h.apply("key="+key.Name, l)
	return key, l.Allow, nil
}

// LookupCert implements egress.CertHook: the hook's refusal is
// egress.ErrCertRefused.
func (h hookLimits) LookupCert(ctx context.Context, identity string, cert *x509.Certificate) (*endpoint.AllowList, error) {
	l, err := h.certs.AnswerCertificate(ctx, identity, cert)
	if errors.Is(err, authhook.ErrRefused) {
		return nil, fmt.Errorf("%w: %w", egress.ErrCertRefused, err)
	}
	if err != nil {
		return nil, err
	}
	if identity != "" {
		h.apply(identity, l)
	}
	return l.Allow, nil
}

// apply gives identity the caps and quota of a hook's answer.
func (h hookLimits) apply(identity string, l authhook.Limits) {
	if h.caps != nil {
		h.caps.SetHooked(identity, l.Rate, l.HasRate)
	}
	if h.usage != nil {
		h.usage.SetHookedQuota(identity, l.Quota, l.HasQuota)
	}
}

// withHookLimits makes cfg's auth hooks (KeyHook; CertAuthHook, made the
// egress's CertHook) apply their answers' rules, and their limits when the
// server keeps accounts.
// Without caps configured it adds an empty cap table, so that a hook's cap
// applies without a restart; that needs a congestion controller of ours
// (otherwise the hook's caps are not applied, its quotas are).
func withHookLimits(cfg *Config) {
	lh, keys := cfg.KeyHook.(limitsHook)
	certs := cfg.CertAuthHook != nil
	if !keys && !certs {
		return
	}
	if cfg.Usage != nil && cfg.RateLimits == nil && cfg.QUIC != nil && cfg.QUIC.Congestion != nil {
		cfg.RateLimits = ratecap.NewTable(nil, ratecap.Rate{})
	}
	h := hookLimits{hook: lh, certs: cfg.CertAuthHook, usage: cfg.Usage}
	if cfg.Usage != nil {
		h.caps = cfg.RateLimits
	}
	if keys {
		cfg.KeyHook = h
	}
	if certs {
		cfg.CertHook = h
	}
}
