package server

import (
	"context"

	"github.com/quictun/quictun/pkg/authhook"
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
type hookLimits struct {
	hook  limitsHook
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
	identity := "key=" + key.Name
	if h.caps != nil {
		h.caps.SetHooked(identity, l.Rate, l.HasRate)
	}
	if h.usage != nil {
		h.usage.SetHookedQuota(identity, l.Quota, l.HasQuota)
	}
	return key, l.Allow, nil
}

// withHookLimits makes cfg's auth hook apply its answers' rules, and their
// limits when the server keeps accounts. Without caps configured it adds
// an empty cap table, so that a hook's cap applies without a restart; that
// needs a congestion controller of ours (otherwise the hook's caps are not
// applied, its quotas are).
func withHookLimits(cfg *Config) {
	lh, ok := cfg.KeyHook.(limitsHook)
	if !ok {
		return
	}
	if cfg.Usage != nil && cfg.RateLimits == nil && cfg.QUIC != nil && cfg.QUIC.Congestion != nil {
		cfg.RateLimits = ratecap.NewTable(nil, ratecap.Rate{})
	}
	h := hookLimits{hook: lh, usage: cfg.Usage}
	if cfg.Usage != nil {
		h.caps = cfg.RateLimits
	}
	cfg.KeyHook = h
}
