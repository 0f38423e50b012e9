package server

import (
	"net"
	"sync"
	"time"
)

// sourceLimiter bounds QUIC connections per source IP: a token bucket of
// handshakes (rate per second, burst twice that) and a cap on open
// connections. Safe for concurrent use.
type sourceLimiter struct {
	rate    float64
	burst   float64
	maxOpen int

	mu      sync.Mutex
	sources map[string]*source
}

type source struct {
	tokens float64
	last   time.Time
	open   int
}

const maxTrackedSources = 1 << 16

func newSourceLimiter(handshakesPerSecond float64, maxOpen int) *sourceLimiter {
	return &sourceLimiter{rate: handshakesPerSecond, burst: 2 * handshakesPerSecond, maxOpen: maxOpen, sources: map[string]*source{}}
}

func sourceIP(a net.Addr) string {
	if ua, ok := a.(*net.UDPAddr); ok {
		return ua.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// getLocked returns ip's state with its bucket refilled to now; l.mu must be held.
func (l *sourceLimiter) getLocked(ip string, now time.Time) *source {
	s := l.sources[ip]
	if s == nil {
		if len(l.sources) >= maxTrackedSources {
			for k, v := range l.sources {
				if v.open == 0 && now.Sub(v.last) > time.Minute {
					delete(l.sources, k)
				}
			}
		}
		s = &source{tokens: l.burst, last: now}
		l.sources[ip] = s
	}
	s.tokens = min(l.burst, s.tokens+now.Sub(s.last).Seconds()*l.rate)
	s.last = now
	return s
}

// allowHandshake takes a handshake token for ip and reports whether one was left.
func (l *sourceLimiter) allowHandshake(ip string, now time.Time) bool {
	if l.rate <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.getLocked(ip, now)
	if s.tokens < 1 {
		return false
	}
	s.tokens--
	return true
}

// suspicious reports whether ip used more than half its handshake burst, so
// its address should be verified (a Retry round trip) before more handshakes.
func (l *sourceLimiter) suspicious(ip string, now time.Time) bool {
	if l.rate <= 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.getLocked(ip, now).tokens < l.burst/2
}

// open counts a new connection from ip and reports whether it is within the cap.
func (l *sourceLimiter) open(ip string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.getLocked(ip, now)
	if l.maxOpen > 0 && s.open >= l.maxOpen {
		return false
	}
	s.open++
	return true
}

// closed ends a connection counted by open.
func (l *sourceLimiter) closed(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.sources[ip]; s != nil && s.open > 0 {
		s.open--
	}
}
