package resume

import "time"

// Settings are a daemon's resumable tunnels (--resume-window), as both
// ends' tunnel layers (pkg/ingress, pkg/egress) take them.
type Settings struct {
	// Table holds the resumable tunnels by ID (and routes their acks).
	Table *Table
	// Window returns the window of a tunnel opened now (a reload changes
	// it for new tunnels); 0: tunnels are not kept resumable (and the
	// server refuses resume requests).
	Window func() time.Duration
	// Cap bounds the bytes one direction holds for resending (0:
	// DefaultCap); Budget all tunnels' bytes.
	Cap    int
	Budget *Budget
	Events Events
}

// WindowNow is the window of a tunnel opened now: 0 without settings or
// without a window.
func (s *Settings) WindowNow() time.Duration {
	if s == nil || s.Window == nil {
		return 0
	}
	return s.Window()
}
