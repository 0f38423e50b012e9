package server

import (
	"context"

	"github.com/quictun/quictun/pkg/authhook"
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
type hookLimits struct {
	hook  limitsHook
	caps  *ratecap.Table // nil: no caps machinery (see New)
	usage *usage.Ledger
}

// Lookup implements egress.KeyHook.
func (h hookLimits) Lookup(ctx context.Context, id proto.KeyID) (proto.Key, error) {
	key, l, err := h.hook.Answer(ctx, id)
	if err != nil {
		return key, err
	}
	identity := "key=" + key.Name
	if h.caps != nil {
		h.caps.SetHooked(identity, l.Rate, l.HasRate)
	}
	h.usage.SetHookedQuota(identity, l.Quota, l.HasQuota)
	return key, nil
}

// withHookLimits makes cfg's auth hook apply its answers' limits, when it
// can carry them and the server keeps accounts. Without caps configured
// it adds an empty cap table, so that a hook's cap applies without a
// restart; that needs a congestion controller of ours (otherwise the
// hook's caps are not applied, its quotas are).
func withHookLimits(cfg *Config) {
	lh, ok := cfg.KeyHook.(limitsHook)
	if !ok || cfg.Usage == nil {
		return
	}
	if cfg.RateLimits == nil && cfg.QUIC != nil && cfg.QUIC.Congestion != nil {
		cfg.RateLimits = ratecap.NewTable(nil, ratecap.Rate{})
	}
	cfg.KeyHook = hookLimits{hook: lh, caps: cfg.RateLimits, usage: cfg.Usage}
}
