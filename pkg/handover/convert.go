package handover

import (
	"errors"
	"fmt"

	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/tunnel"
)

// SendStates gives the states a daemon exported (resume.Table.Export) to
// send, each with what its *tunnel.Tunnel (State.Meta) shows (Meta is not
// handed over), then closes their application sockets (the new process
// holds its own). It returns how many it sent.
func SendStates(states []*resume.State, send SendFunc) (int, error) {
	tunnels := make([]Tunnel, 0, len(states))
	for _, st := range states {
		tunnels = append(tunnels, tunnelOf(st))
	}
	err := send(tunnels)
	for _, st := range states {
		_ = st.Conn.Close()
	}
	if err != nil {
		return len(tunnels), fmt.Errorf("hand over %d tunnels: %w", len(tunnels), err)
	}
	return len(tunnels), nil
}

// tunnelOf is st with what its *tunnel.Tunnel (State.Meta) shows; Meta is
// not handed over.
func tunnelOf(st *resume.State) Tunnel {
	ht := Tunnel{State: *st}
	if t, ok := st.Meta.(*tunnel.Tunnel); ok {
		ht.UUID, ht.Destination, ht.Source, ht.Endpoint, ht.Server, ht.CreatedAt = t.UUID, t.Destination, t.Source, t.Endpoint, t.Server, t.CreatedAt
	}
	ht.Meta = nil
	return ht
}

// Sender sends an upgrade's tunnels one at a time, each as soon as it is
// exported, so that the new process takes the first ones while the rest
// are exported (the messages are those of SendFunc's Conn.SendTunnels).
type Sender struct {
	// Tunnel sends one (Conn.SendTunnel); its file stays the caller's.
	Tunnel func(t *Tunnel) error
	// End sends the count (Conn.SendEnd) and waits for the new process's
	// answer.
	End func(n int) error
}

// SendEach sends each state export gives (resume.Table.ExportEach) with s
// as soon as it is given, closing its application socket after (the new
// process holds its own), then s.End. After an error it sends nothing
// more but still closes what it is given. It returns how many it sent.
func SendEach(export func(each func(*resume.State)), s Sender) (int, error) {
	n := 0
	var err error
	export(func(st *resume.State) {
		if err == nil {
			ht := tunnelOf(st)
			if err = s.Tunnel(&ht); err == nil {
				n++
			}
		}
		_ = st.Conn.Close()
	})
	if err == nil {
		err = s.End(n)
	}
	if err != nil {
		return n, fmt.Errorf("hand over the tunnels (%d sent): %w", n, err)
	}
	return n, nil
}

// ImportAll continues each tunnel with imp (ImportOne) and returns how
// many it took; the errors of the others (imp reset them) are joined.
func ImportAll(tunnels []Tunnel, imp func(st *resume.State, t *tunnel.Tunnel) error) (int, error) {
	var errs []error
	n := 0
	for i := range tunnels {
		if err := ImportOne(&tunnels[i], imp); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// ImportOne continues ht with imp (its state, and a *tunnel.Tunnel with
// what the registry shows, for imp to complete); imp resets it on error.
func ImportOne(ht *Tunnel, imp func(st *resume.State, t *tunnel.Tunnel) error) error {
	t := &tunnel.Tunnel{UUID: ht.UUID, Destination: ht.Destination, Source: ht.Source, Endpoint: ht.Endpoint, Server: ht.Server,
		CreatedAt: ht.CreatedAt, Transport: "quic"}
	st := ht.State
	if err := imp(&st, t); err != nil {
		return fmt.Errorf("tunnel %s: %w", ht.UUID, err)
	}
	return nil
}

// LimitsOf are the bounds of what a daemon with resumable tunnels s takes
// from its predecessor: at most maxTunnels, each within the resume cap
// (plus one read), all within the resume budget; nothing without
// resumable tunnels (s nil, or its window 0).
func LimitsOf(s *resume.Settings, maxTunnels int) Limits {
	if s.WindowNow() <= 0 {
		return Limits{}
	}
	capBytes := s.Cap
	if capBytes <= 0 {
		capBytes = resume.DefaultCap
	}
	lim := Limits{MaxTunnels: maxTunnels, MaxTunnelBytes: capBytes + resume.ChunkSize + resume.ExtraBytes}
	lim.MaxTotalBytes = int64(lim.MaxTunnels) * int64(lim.MaxTunnelBytes)
	if s.Budget != nil && s.Budget.Max() > 0 {
		lim.MaxTotalBytes = min(lim.MaxTotalBytes, s.Budget.Max())
	}
	return lim
}
