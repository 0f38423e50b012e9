package server

import (
	"net"
	"sync"
	"time"

	"github.com/quictun/quictun/pkg/metrics"
)

// sourceLimiter bounds what one source IP may hold: a token bucket of QUIC
// handshakes (rate per second, burst twice that), a cap on open connections,
// and a share of the server's budget of streams awaiting a verified header.
// Safe for concurrent use.
type sourceLimiter struct {
	rate    float64
	burst   float64
	maxOpen int
	// maxUnverified bounds the source's streams awaiting a verified header
	// (0: unbounded).
	maxUnverified int

	mu        sync.Mutex
	sources   map[string]*source
	overflow  source // shared bucket of untracked sources when the table is full
	lastSweep time.Time
}

type source struct {
	tokens float64
	last   time.Time
	open   int
	// unverified counts the source's streams awaiting a verified header;
	// they belong to open connections, so open > 0 while it is.
	unverified int
}

const (
	maxTrackedSources = 1 << 16
	// overflowFactor scales the rate of the bucket shared by untracked sources.
	overflowFactor = 10
)

func newSourceLimiter(handshakesPerSecond float64, maxOpen, maxUnverified int) *sourceLimiter {
	return &sourceLimiter{rate: handshakesPerSecond, burst: 2 * handshakesPerSecond, maxOpen: maxOpen, maxUnverified: maxUnverified,
		sources: map[string]*source{}, overflow: source{tokens: overflowFactor * 2 * handshakesPerSecond}}
}

// sourceIP returns the key a source address is limited by: the IPv4 address,
// or the IPv6 /64 prefix (one subscriber or host typically holds a whole /64,
// so counting single IPv6 addresses would let it multiply every per-source
// limit by 2^64).
func sourceIP(a net.Addr) string {
	var ip net.IP
	if ua, ok := a.(*net.UDPAddr); ok {
		ip = ua.IP
	} else {
		host, _, err := net.SplitHostPort(a.String())
		if err != nil {
			host = a.String()
		}
		if ip = net.ParseIP(host); ip == nil {
			return host
		}
	}
	if ip.To4() == nil && len(ip) == net.IPv6len {
		return ip.Mask(ipv6SourceMask).String() + "/64"
	}
	return ip.String()
}

// ipv6SourceMask groups IPv6 sources for the per-source limits.
var ipv6SourceMask = net.CIDRMask(64, 128)

// getLocked returns ip's state with its bucket refilled to now, creating it
// when insert is set and the table has room; nil otherwise. l.mu must be held.
// The table is bounded: when full, idle entries are swept at most once a
// second, so a flood of (spoofed) new sources costs O(1) per packet.
func (l *sourceLimiter) getLocked(ip string, now time.Time, insert bool) *source {
	s := l.sources[ip]
	if s == nil {
		if !insert {
			return nil
		}
		if len(l.sources) >= maxTrackedSources && now.Sub(l.lastSweep) >= time.Second {
			l.lastSweep = now
			for k, v := range l.sources {
				if v.open == 0 && now.Sub(v.last) > time.Minute {
					delete(l.sources, k)
				}
			}
		}
		if len(l.sources) >= maxTrackedSources {
			return nil
		}
		s = &source{tokens: l.burst, last: now}
		l.sources[ip] = s
	}
	refill(s, now, l.rate, l.burst)
	return s
}

func refill(s *source, now time.Time, rate, burst float64) {
	s.tokens = min(burst, s.tokens+now.Sub(s.last).Seconds()*rate)
	s.last = now
}

// allowHandshake takes a handshake token for ip and reports whether one was left.
func (l *sourceLimiter) allowHandshake(ip string, now time.Time) bool {
	if l.rate <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.getLocked(ip, now, true)
	if s == nil { // table full: untracked sources share one bucket
		s = &l.overflow
		refill(s, now, overflowFactor*l.rate, overflowFactor*l.burst)
	}
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
	s := l.getLocked(ip, now, false)
	if s == nil {
		// Unknown sources are trusted while the table has room; when it is
		// full (a flood of new, possibly spoofed, sources) they must validate.
		return len(l.sources) >= maxTrackedSources
	}
	return s.tokens < l.burst/2
}

// open counts a new connection from ip and reports whether it is within the cap.
func (l *sourceLimiter) open(ip string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.getLocked(ip, now, true)
	if s == nil {
		return true // untracked (table full): its handshake already passed the shared bucket
	}
	if l.maxOpen > 0 && s.open >= l.maxOpen {
		return false
	}
	s.open++
	return true
}

// closed ends a connection counted by open. The source's entry goes with
// its last connection once its bucket is full again (as a new entry's
// would be), so a crowd that left does not stay in the table.
func (l *sourceLimiter) closed(ip string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sources[ip]
	if s == nil || s.open == 0 {
		return
	}
	s.open--
	if s.open == 0 && s.unverified == 0 {
		refill(s, now, l.rate, l.burst)
		if s.tokens >= l.burst {
			delete(l.sources, ip)
		}
	}
}

// holdUnverified takes one of ip's places for a stream awaiting a verified
// header and reports whether one was left; release frees it (call it once).
// Sources the table could not track (it was full when they connected) share
// one set of places, as they share one handshake bucket.
func (l *sourceLimiter) holdUnverified(ip string) (release func(), ok bool) {
	if l.maxUnverified <= 0 {
		return func() {}, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sources[ip]
	if s == nil {
		s = &l.overflow
	}
	if s.unverified >= l.maxUnverified {
		return nil, false
	}
	s.unverified++
	// The entry stays in the table while the place is held: it has an open
	// connection, which the sweep keeps.
	return func() {
		l.mu.Lock()
		s.unverified--
		l.mu.Unlock()
	}, true
}

// tcpSlots bounds the TCP connections between accept and the end of their
// TLS handshake, in two phases, each in total and per source (an IPv4
// address or an IPv6 /64, sourceIP): waiting for their ClientHello (cheap: a
// goroutine, a socket and at most one TLS record's buffer; a connection that
// sends nothing stays here until tcpClientHelloTimeout) and in their TLS
// handshake (the CPU-costly phase). A source's share keeps a few sources
// from taking every place, so that silent or stalled connections from them
// cannot starve the handshakes of clients elsewhere. Safe for concurrent use.
type tcpSlots struct {
	maxWaiting, maxWaitingPerSource       int
	maxHandshakes, maxHandshakesPerSource int

	mu                   sync.Mutex
	waiting, handshaking int
	// sources holds the sources with a connection in either phase; an
	// entry goes with its last one, so the map has at most
	// maxWaiting+maxHandshakes entries.
	sources map[string]*tcpShare
}

type tcpShare struct{ waiting, handshaking int }

// newTCPSlots returns the slots for maxHandshakes TCP handshakes at once:
// four times as many connections may wait for their ClientHello, and a
// source holds at most a sixteenth of either (at least 8).
func newTCPSlots(maxHandshakes int) *tcpSlots {
	share := func(n int) int { return min(n, max(8, n/16)) }
	w := tcpWaitingPerHandshake * maxHandshakes
	return &tcpSlots{maxWaiting: w, maxWaitingPerSource: share(w), maxHandshakes: maxHandshakes,
		maxHandshakesPerSource: share(maxHandshakes), sources: map[string]*tcpShare{}}
}

// tcpWaitingPerHandshake is how many connections may wait for their
// ClientHello per TCP handshake slot.
const tcpWaitingPerHandshake = 4

// wait takes a place for a connection from src waiting for its
// ClientHello; it returns "" or the reason it was refused (a
// refused_connections_total reason).
func (t *tcpSlots) wait(src string) (refused string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sh := t.sources[src]
	switch {
	case sh != nil && sh.waiting >= t.maxWaitingPerSource:
		return metrics.RefusedTCPWaitingPerSource
	case t.waiting >= t.maxWaiting:
		return metrics.RefusedTCPWaiting
	}
	if sh == nil {
		sh = &tcpShare{}
		t.sources[src] = sh
	}
	sh.waiting++
	t.waiting++
	return ""
}

// handshake moves a connection from src that holds a waiting place (wait)
// to a handshake slot; it returns "" or the reason it was refused, and
// the connection holds no place then.
func (t *tcpSlots) handshake(src string) (refused string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sh := t.sources[src]
	if sh == nil { // not from wait: a bug, but no reason to refuse
		sh = &tcpShare{}
		t.sources[src] = sh
	}
	if sh.waiting > 0 {
		sh.waiting--
		t.waiting--
	}
	switch {
	case sh.handshaking >= t.maxHandshakesPerSource:
		refused = metrics.RefusedTCPHandshakesPerSource
	case t.handshaking >= t.maxHandshakes:
		refused = metrics.RefusedTCPHandshakes
	default:
		sh.handshaking++
		t.handshaking++
	}
	t.forgetLocked(src, sh)
	return refused
}

// doneWaiting gives back a waiting place (a connection that sent no
// ClientHello in time, or the server stopping).
func (t *tcpSlots) doneWaiting(src string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if sh := t.sources[src]; sh != nil && sh.waiting > 0 {
		sh.waiting--
		t.waiting--
		t.forgetLocked(src, sh)
	}
}

// doneHandshake gives back a handshake slot (the handshake ended).
func (t *tcpSlots) doneHandshake(src string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if sh := t.sources[src]; sh != nil && sh.handshaking > 0 {
		sh.handshaking--
		t.handshaking--
		t.forgetLocked(src, sh)
	}
}

func (t *tcpSlots) forgetLocked(src string, sh *tcpShare) {
	if sh.waiting == 0 && sh.handshaking == 0 {
		delete(t.sources, src)
	}
}
