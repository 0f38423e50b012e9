package ingress

import (
	"sync"
	"time"
)

// A proxy entry point (SOCKS5, HTTP CONNECT) must answer the application
// before the application sends anything, and the answer should be the
// server's: "not allowed by ruleset" for a destination its rules refuse.
// Waiting for the server's verdict costs a round trip before the
// application's first byte that a forward does not pay. So each session
// remembers the destinations the server accepted on it recently: a proxied
// connection to one of them is answered at once and its first bytes follow
// the header, as a forward's do; any other destination still waits for the
// verdict. If the server refuses a destination it had accepted (its rules
// were reloaded, or the destination stopped answering), the application's
// connection is reset and the destination forgotten, so the next connection
// to it gets the server's answer.
//
// A remembered destination the server no longer accepts costs the
// application one reset, once; so the memory can be long: verdictTTL.
const (
	// verdictTTL is how long an accepted destination is answered at once
	// without asking the server again (each acceptance renews it).
	verdictTTL = 10 * time.Minute
	// maxVerdicts bounds the destinations a session remembers.
	maxVerdicts = 256
)

// verdicts remembers the destinations (tokens) the server accepted recently
// on one session. Safe for concurrent use; the zero value is ready.
type verdicts struct {
	mu sync.Mutex
	m  map[string]time.Time // token -> when the server last accepted it
}

// accepted reports whether the server accepted token within verdictTTL of now.
func (v *verdicts) accepted(token string, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.m[token]
	if ok && now.Sub(t) >= verdictTTL {
		delete(v.m, token)
		ok = false
	}
	return ok
}

// record notes the server's verdict on token: accepted, or forgotten.
func (v *verdicts) record(token string, accepted bool, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !accepted {
		delete(v.m, token)
		return
	}
	if v.m == nil {
		v.m = map[string]time.Time{}
	}
	if _, ok := v.m[token]; !ok && len(v.m) >= maxVerdicts {
		// Full: drop what expired, else the oldest.
		var oldest string
		var ot time.Time
		for k, t := range v.m {
			switch {
			case now.Sub(t) >= verdictTTL:
				delete(v.m, k)
			case ot.IsZero() || t.Before(ot):
				oldest, ot = k, t
			}
		}
		if len(v.m) >= maxVerdicts {
			delete(v.m, oldest)
		}
	}
	v.m[token] = now
}
