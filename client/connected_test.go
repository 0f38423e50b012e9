package client

import (
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"k8s.io/klog/v2"
)

// lineLog keeps the lines of its loggers.
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

// logger returns a logger at verbosity v into l.
func (l *lineLog) logger(v int) klog.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
	}, funcr.Options{Verbosity: v})
}

// count returns how many lines contain sub.
func (l *lineLog) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, sub) {
			n++
		}
	}
	return n
}

// TestConnectedLineWaitsForHello: with a shared secret the -v 0
// "Connected to server" line of a connection is logged once its handshake
// is done (up) and the server accepted our hello (confirm), whichever
// comes second, once; a hello refused (no confirm) leaves only the -v 2
// handshake line. Without a secret there is no hello: the handshake is
// the line.
func TestConnectedLineWaitsForHello(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		secret              string
		helloFirst, refused bool
		verbosity           int
		connected, hs       int
	}{
		{name: "handshake then hello", secret: "s", connected: 1},
		{name: "hello then handshake", secret: "s", helloFirst: true, connected: 1},
		{name: "hello refused", secret: "s", refused: true},
		{name: "hello refused -v 2", secret: "s", refused: true, verbosity: 2, hs: 1},
		{name: "accepted -v 2", secret: "s", verbosity: 2, connected: 1, hs: 1},
		{name: "no secret", connected: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := fakeClient(t, ModeFailover, 1, "a")
			c.SetSecret([]byte(tc.secret))
			var logs lineLog
			m := c.members[0]
			q := &quicLink{c: c, m: m, logger: logs.logger(tc.verbosity)}
			l := &link{m: m}
			kv := []any{"address", "a", "connID", 1}
			if tc.helloFirst {
				c.confirm(l)
			}
			q.announceConnected(l, kv)
			if !tc.helloFirst && !tc.refused {
				c.confirm(l)
				c.confirm(l) // a tunnel's header accepted later: still one line
			}
			assert.Equal(t, tc.connected, logs.count(`"Connected to server"`), logs.lines)
			assert.Equal(t, tc.hs, logs.count(`"Completed handshake with server`), logs.lines)
		})
	}
}
