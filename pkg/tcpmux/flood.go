package tcpmux

import (
	"errors"
	"time"

	"golang.org/x/net/http2"
)

// The peer's free work. HTTP/2 lets a peer make its receiver work without
// sending data: open a stream and reset it before it is read (the "rapid
// reset" attack, CVE-2023-44487), open streams over the limit only to have
// them refused, and send frames that change nothing or that must be
// answered (PING, SETTINGS, PRIORITY, empty DATA, window updates of a few
// bytes, unknown extension frames). Resets and window updates for streams
// that have ended are not charged: one that crossed this side's own end is
// common, and each costs a map lookup, no state, no answer, no wake-up.
// Each kind costs the receiver a little and the peer almost nothing, so each
// is charged to a token bucket per connection, and a peer that empties one
// is disconnected with GOAWAY ENHANCE_YOUR_CALM. The sizes follow nghttp2's
// defaults for stream resets (a burst of 1,000, then 33 a second); a
// quictun peer sends a handful of such frames a minute (keep-alive PINGs
// and their acknowledgements, three SETTINGS), so the budgets never touch
// it.
const (
	// maxWastedStreams and wastedStreamsPerSecond bound streams the peer
	// opened and reset before this side read from them, and streams
	// refused over the limit.
	maxWastedStreams       = 1000
	wastedStreamsPerSecond = 33
	// maxIdleFrames and idleFramesPerSecond bound frames that move no data.
	maxIdleFrames       = 1000
	idleFramesPerSecond = 100
	// minUsefulWindowUpdate: a window update below this many bytes counts
	// as an idle frame (quictun's peers give credit back a quarter window
	// at a time).
	minUsefulWindowUpdate = 1024
	// maxSettingsEntries bounds one SETTINGS frame, as net/http2 does
	// (HTTP/2 defines seven settings).
	maxSettingsEntries = 100
)

// budget is a token bucket: take spends one token and reports whether one
// was left. Not safe for concurrent use (the reader goroutine, under c.mu).
type budget struct {
	tokens, max, rate float64
	last              time.Time
}

func newBudget(max, perSecond float64, now time.Time) budget {
	return budget{tokens: max, max: max, rate: perSecond, last: now}
}

func (b *budget) take(now time.Time) bool {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(b.max, b.tokens+d.Seconds()*b.rate)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// FloodError is why a connection was closed when its peer spent a budget of
// free work (see the package doc, "Bounds"); the peer is told with GOAWAY
// ENHANCE_YOUR_CALM.
type FloodError struct {
	// What names the budget: "stream resets" or "idle frames".
	What string
}

func (e *FloodError) Error() string {
	return "tcpmux: peer closed for a flood of " + e.What
}

// errCodeOf is the GOAWAY code for a connection closed with err.
func errCodeOf(err error) http2.ErrCode {
	if fe := (*FloodError)(nil); errors.As(err, &fe) {
		return http2.ErrCodeEnhanceYourCalm
	}
	return http2.ErrCodeProtocol
}
