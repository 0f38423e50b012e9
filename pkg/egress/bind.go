package egress

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/proto"
)

// Binder listens for the reverse forwards of verified clients
// (proto.KindReverse): the server implements it. Config.Binder nil: reverse
// forwards are refused as unsupported.
type Binder interface {
	// Bind checks req against the rules for its client's identities and
	// listens at req.Bind.Listen, serving each connection (or UDP flow)
	// accepted there as a stream toward the client, until unbind is
	// called; unbind returns when the listener and what it started have
	// ended. A refusal is a *BindError (it has been logged).
	Bind(ctx context.Context, req BindRequest) (unbind func(), err error)
}

// BindRequest is a verified reverse forward request.
type BindRequest struct {
	Stream Stream
	Bind   proto.Bind
	// Identities are who the client proved to be (see Config.AllowFor).
	Identities []string
	// Account is whom the binding counts against for a per-identity share
	// of the listeners, as a UDP flow counts for MaxUDPFlowsPerIdentity:
	// the client certificate's CN and the named key, or, for a client with
	// neither, its source (see flowAccount).
	Account string
	Logger  klog.Logger
}

// BindError is a reverse forward refused by a Binder, with the code the
// client is told.
type BindError struct {
	Code proto.Code
	Err  error
}

func (e *BindError) Error() string { return e.Code.String() + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *BindError) Unwrap() error { return e.Err }

// bind serves a reverse forward request (a KindReverse stream whose MAC
// was verified and which is fresh): the bind token, the replay check, then
// the Binder; CodeOK once it listens, and the binding lasts until the
// client ends the stream or the connection ends. A bind is no tunnel: it
// is not counted in streams_total (but for its refusal), audited or
// registered; the connections accepted for it are.
func (s *stream) bind(ctx context.Context) *failure {
	b, err := proto.ParseBind(s.h.Token)
	if err != nil {
		return failed(proto.CodeBadToken, "Rejected reverse forward: bad bind token", "err", err)
	}
	s.audited = false // the bound streams are the tunnels
	if f := s.admit(); f != nil {
		return f
	}
	logger := klog.LoggerWithValues(s.log(), "listen", b.Listen, "bindID", b.ID, "identity", strings.Join(s.identities, ","))
	unbind, err := s.e.cfg.Binder.Bind(ctx, BindRequest{Stream: s.st, Bind: b, Identities: s.identities,
		Account: flowAccount(s.peer, s.key, s.st), Logger: logger})
	if err != nil {
		code := proto.CodeInternal
		if be := (*BindError)(nil); errors.As(err, &be) {
			code = be.Code
		}
		return &failure{code: code, lvl: 4, msg: "Refused reverse forward", kv: []any{"listen", b.Listen, "err", err}}
	}
	defer unbind()
	_ = s.str.SetWriteDeadline(time.Now().Add(s.e.cfg.HeaderTimeout))
	if err := proto.WriteReply(s.str, proto.CodeOK); err != nil {
		Reset(s.str, proto.CodeConnReset)
		return nil
	}
	_ = s.str.SetWriteDeadline(time.Time{})
	// The binding lasts as long as the stream: nothing more comes on it,
	// its end (the client's FIN or reset, the connection's end, or the
	// key's removal) ends the binding.
	stop := context.AfterFunc(s.keyLife, func() { Reset(s.str, proto.CodeAuthFailed) })
	defer stop()
	_, err = io.Copy(io.Discard, io.LimitReader(s.str, 1<<10))
	Reset(s.str, proto.CodeOK)
	logger.V(2).Info("Reverse forward ended", "err", err)
	return nil
}
