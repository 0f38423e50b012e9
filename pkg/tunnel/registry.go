package tunnel

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quictun/quictun/pkg/proto"
)

// Aborter ends a tunnel early; *splice.Pipe implements it.
type Aborter interface{ Abort(code proto.Code) }

// Tunnel is one open tunneled connection.
type Tunnel struct {
	ID uint64
	// UUID names the tunnel on both ends (proto.Header.TunnelID); "" shows
	// ID instead.
	UUID        string
	StreamID    int64
	ConnID      uint64
	Endpoint    string // the local listener (client) or the QUIC listener (server)
	Source      string // the application's address (client) or the client's QUIC address (server)
	Destination string
	// Server is the server a client's tunnel is carried to (its
	// --server-endpoint label; "" on the server, or not known): a
	// resumable tunnel re-attaches only there.
	Server string
	// Identity is who the client is, when known (server: "CN=NAME" of its
	// certificate, "key=NAME" of its shared secret).
	Identity string
	// Transport is what carries the tunnel: "quic", "tcp" (the fallback
	// when UDP is blocked), or "" when not known.
	Transport string
	// Direction is Forward (the client's application reaches a destination
	// beyond the server; "" counts as Forward) or Reverse (a connection to
	// a listener the server opened for a client's --remote-forward reaches
	// a destination beside the client).
	Direction string
	CreatedAt time.Time

	// Datagram marks a UDP flow: it has nothing to finish, so a drain ends
	// it at once (AbortFlows) instead of waiting for it.
	Datagram bool
	// Resumable marks a resumable tunnel (pkg/resume): an upgrade hands it
	// to the new process instead of ending it (AbortWhere).
	Resumable bool

	// Upstream and Downstream count application bytes toward and from the destination.
	Upstream   *atomic.Int64
	Downstream *atomic.Int64

	aborter Aborter
}

// Info is the JSON view of a tunnel, in the shape quic-tun's /tunnels used, plus rates.
type Info struct {
	UUID                  string    `json:"uuid"`
	StreamID              int64     `json:"streamId"`
	ConnID                uint64    `json:"connId"`
	Endpoint              string    `json:"endpoint"`
	ClientAppAddr         string    `json:"clientAppAddr"`
	ServerAppAddr         string    `json:"serverAppAddr"`
	ClientIdentity        string    `json:"clientIdentity,omitempty"`
	Server                string    `json:"server,omitempty"`
	Transport             string    `json:"transport,omitempty"`
	Direction             string    `json:"direction"`
	CreatedAt             time.Time `json:"createdAt"`
	UpstreamBytes         int64     `json:"upstreamBytes"`
	DownstreamBytes       int64     `json:"downstreamBytes"`
	UpstreamBytesPerSec   float64   `json:"upstreamBytesPerSec"`
	DownstreamBytesPerSec float64   `json:"downstreamBytesPerSec"`

	id uint64
}

// Directions of a tunnel (Tunnel.Direction).
const (
	Forward = "forward"
	Reverse = "reverse"
)

// direction is d, Forward for "".
func direction(d string) string {
	if d == "" {
		return Forward
	}
	return d
}

// Registry is safe for concurrent use.
type Registry struct {
	next atomic.Uint64

	mu      sync.Mutex
	tunnels map[uint64]*entry
	empty   chan struct{} // closed while the registry is empty
}

type entry struct {
	t        *Tunnel
	lastAt   time.Time
	lastUp   int64
	lastDown int64
	rateUp   float64
	rateDown float64
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	r := &Registry{tunnels: map[uint64]*entry{}, empty: make(chan struct{})}
	close(r.empty)
	return r
}

// Add registers t, assigns its ID and returns a function that removes it.
func (r *Registry) Add(t *Tunnel, a Aborter) (remove func()) {
	t.ID = r.next.Add(1)
	t.aborter = a
	r.mu.Lock()
	if len(r.tunnels) == 0 {
		r.empty = make(chan struct{})
	}
	r.tunnels[t.ID] = &entry{t: t, lastAt: t.CreatedAt}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if _, ok := r.tunnels[t.ID]; !ok {
			return
		}
		delete(r.tunnels, t.ID)
		if len(r.tunnels) == 0 {
			close(r.empty)
		}
	}
}

// Len returns the number of open tunnels.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.tunnels)
}

// Activity is a mark of the registry's work: it changes when a tunnel is
// added or moves bytes (the sum over open tunnels, which an ending tunnel
// changes too). Comparing two marks tells whether anything happened between.
type Activity struct {
	added uint64
	bytes int64
}

// Activity returns the registry's mark now.
func (r *Registry) Activity() Activity {
	a := Activity{added: r.next.Load()}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.tunnels {
		a.bytes += e.t.Upstream.Load() + e.t.Downstream.Load()
	}
	return a
}

// Abort aborts the tunnel with id and reports whether it existed.
func (r *Registry) Abort(id uint64, code proto.Code) bool {
	r.mu.Lock()
	e, ok := r.tunnels[id]
	r.mu.Unlock()
	if ok && e.t.aborter != nil {
		e.t.aborter.Abort(code)
	}
	return ok
}

// ErrBadID is returned by Lookup for a string that is neither a UUID nor a
// decimal tunnel ID.
var ErrBadID = errors.New("bad tunnel id: want its uuid from GET /tunnels")

// Lookup returns the ID of the tunnel that s names: its UUID as GET /tunnels
// shows it, or its ID in decimal. found is false when no open tunnel has that
// UUID; a decimal ID is returned as is (Abort tells whether it is open).
func (r *Registry) Lookup(s string) (id uint64, found bool, err error) {
	if id, err := strconv.ParseUint(s, 10, 64); err == nil {
		return id, true, nil
	}
	if !isUUID(s) {
		return 0, false, ErrBadID
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, e := range r.tunnels {
		if e.t.UUID == s {
			return id, true, nil
		}
	}
	return 0, false, nil
}

// isUUID reports whether s has the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
// (lower-case hex).
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range []byte(s) {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// AbortAll aborts every open tunnel.
func (r *Registry) AbortAll(code proto.Code) { r.abortWhere(code, func(*Tunnel) bool { return true }) }

// AbortFlows aborts the open UDP flows (Tunnel.Datagram), e.g. when a
// drain starts: UDP has no end to wait for.
func (r *Registry) AbortFlows(code proto.Code) {
	r.abortWhere(code, func(t *Tunnel) bool { return t.Datagram })
}

// AbortWhere aborts the open tunnels match selects (e.g. those an upgrade
// cannot hand over).
func (r *Registry) AbortWhere(code proto.Code, match func(*Tunnel) bool) { r.abortWhere(code, match) }

func (r *Registry) abortWhere(code proto.Code, match func(*Tunnel) bool) {
	r.mu.Lock()
	as := make([]Aborter, 0, len(r.tunnels))
	for _, e := range r.tunnels {
		if e.t.aborter != nil && match(e.t) {
			as = append(as, e.t.aborter)
		}
	}
	r.mu.Unlock()
	for _, a := range as {
		a.Abort(code)
	}
}

// WaitEmpty blocks until no tunnel is open or ctx is done.
func (r *Registry) WaitEmpty(ctx context.Context) error {
	r.mu.Lock()
	ch := r.empty
	r.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// List returns a snapshot sorted by ID. Rates are computed over the time since
// the previous List call that saw the tunnel (or since it was created).
func (r *Registry) List(now time.Time) []Info {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Info, 0, len(r.tunnels))
	for _, e := range r.tunnels {
		t := e.t
		up, down := t.Upstream.Load(), t.Downstream.Load()
		if dt := now.Sub(e.lastAt).Seconds(); dt >= 0.5 {
			e.rateUp = float64(up-e.lastUp) / dt
			e.rateDown = float64(down-e.lastDown) / dt
			e.lastAt, e.lastUp, e.lastDown = now, up, down
		}
		uuid := t.UUID
		if uuid == "" {
			uuid = strconv.FormatUint(t.ID, 10)
		}
		out = append(out, Info{
			UUID:                  uuid,
			StreamID:              t.StreamID,
			ConnID:                t.ConnID,
			Endpoint:              t.Endpoint,
			ClientAppAddr:         t.Source,
			ServerAppAddr:         t.Destination,
			ClientIdentity:        t.Identity,
			Server:                t.Server,
			Transport:             t.Transport,
			Direction:             direction(t.Direction),
			CreatedAt:             t.CreatedAt,
			UpstreamBytes:         up,
			DownstreamBytes:       down,
			UpstreamBytesPerSec:   e.rateUp,
			DownstreamBytesPerSec: e.rateDown,
			id:                    t.ID,
		})
	}
	slices.SortFunc(out, func(a, b Info) int { return cmp.Compare(a.id, b.id) })
	return out
}
