package cli

import (
	"sync/atomic"
	"time"

	"github.com/quictun/quictun/pkg/resume"
)

// Resume is a daemon's resumable tunnels (--resume-window,
// --resume-buffer-mib): made at start whatever the window (off costs one
// idle goroutine), the window changed by a reload for the tunnels opened
// afterwards.
type Resume struct {
	Table  *resume.Table
	Budget *resume.Budget
	window atomic.Int64
}

// NewResume returns the daemon's resumable tunnels per the flags.
func (d *DaemonFlags) NewResume() *Resume {
	r := &Resume{Table: resume.NewTable(), Budget: resume.NewBudget(d.ResumeBufferMiB << 20)}
	r.SetWindow(d.ResumeWindow)
	return r
}

// Window is the window of a tunnel opened now (0: not resumable).
func (r *Resume) Window() time.Duration { return time.Duration(r.window.Load()) }

// SetWindow changes it (a reload).
func (r *Resume) SetWindow(w time.Duration) { r.window.Store(int64(w)) }

// Reload sets the window a reload read and returns it for the reload's
// log line, nil when unchanged (or r is nil).
func (r *Resume) Reload(w time.Duration) any {
	if r == nil || w == r.Window() {
		return nil
	}
	r.SetWindow(w)
	return w
}
