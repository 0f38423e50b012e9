package client

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/backoff"
)

// TestExpandServers: a name resolving to several addresses of one family is
// one server per address (IPv4 first), labelled ENDPOINT/i; an address, a
// name with one address of each family, or a name that does not resolve
// stays one server; duplicates are dropped.
func TestExpandServers(t *testing.T) {
	t.Parallel()
	dns := map[string][]string{
		"replicas.example": {"10.0.0.2", "2001:db8::1", "10.0.0.1", "10.0.0.2"},
		"v6.example":       {"2001:db8::2", "2001:db8::1"},
		"localhost":        {"127.0.0.1", "::1"},
	}
	lookup := func(_ context.Context, host string) ([]string, error) {
		if a, ok := dns[host]; ok {
			return a, nil
		}
		return nil, errors.New("no such host")
	}
	servers := expandServers(context.Background(),
		[]string{"replicas.example:7500", "192.0.2.1:7500", "localhost:7500", "v6.example:7500", "nowhere.example:7500", "192.0.2.1:7500"}, lookup)
	var labels []string
	for _, s := range servers {
		labels = append(labels, s.label)
	}
	assert.Equal(t, []string{"replicas.example:7500/0", "replicas.example:7500/1", "192.0.2.1:7500", "localhost:7500",
		"v6.example:7500/0", "v6.example:7500/1", "nowhere.example:7500"}, labels)

	ua, err := servers[1].resolve(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2:7500", ua.String(), "the second address in sorted order")
	assert.Equal(t, "replicas.example", servers[1].host, "verified against the name")

	// The replicas moved: each dial resolves again.
	dns["replicas.example"] = []string{"10.0.1.7"}
	ua, err = servers[1].resolve(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "10.0.1.7:7500", ua.String(), "fewer addresses than at start are shared")

	members := newMembers(servers[:2], 2, &backoff.Backoff{Initial: time.Millisecond})
	require.Len(t, members, 4)
	assert.Equal(t, "replicas.example:7500/1#1", members[3].label)
	assert.NotSame(t, members[0].bo, members[1].bo, "each connection backs off on its own")

	one := newMembers(servers[:1], 1, &backoff.Backoff{})
	assert.Equal(t, "0", one[0].label, "one server: the label of before")
}

func TestParseMode(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Mode{"": ModeFailover, "failover": ModeFailover, "spread": ModeSpread} {
		got, err := ParseMode(in)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	_, err := ParseMode("round-robin")
	require.ErrorContains(t, err, "want failover or spread")
}

// TestPrefixedCache: with several servers, each keeps its own tickets in
// the shared cache.
func TestPrefixedCache(t *testing.T) {
	t.Parallel()
	inner := tls.NewLRUClientSessionCache(4)
	a, b := prefixedCache{inner, "a|"}, prefixedCache{inner, "b|"}
	a.Put("quictun-server", &tls.ClientSessionState{})
	_, ok := a.Get("quictun-server")
	assert.True(t, ok)
	_, ok = b.Get("quictun-server")
	assert.False(t, ok, "b does not see a's ticket")
}

// TestTicketsPerConnection: each connection to a server resumes with
// tickets of its own (two handshakes resuming one ticket at once race in
// quic-go, and a reused ticket's 0-RTT may be refused as a replay), each
// server with its own; one server with one connection keeps the
// configuration as given (the keys of a --session-file from before).
func TestTicketsPerConnection(t *testing.T) {
	t.Parallel()
	conf := &tls.Config{ClientSessionCache: tls.NewLRUClientSessionCache(8)}
	one := &Client{servers: []*server{{addr: "a:7500", host: "a", label: "a:7500"}}}
	m1 := newMembers(one.servers, 2, &backoff.Backoff{})
	assert.Same(t, conf, one.tlsFor(m1[0], conf), "one server, first connection: as given")
	got := func(c *Client, m *member) bool {
		_, ok := c.tlsFor(m, conf).ClientSessionCache.Get("quictun")
		return ok
	}
	one.tlsFor(m1[1], conf).ClientSessionCache.Put("quictun", &tls.ClientSessionState{})
	assert.True(t, got(one, m1[1]))
	assert.False(t, got(one, m1[0]), "the second connection's ticket is its own")

	two := &Client{servers: []*server{{addr: "a:7500", host: "a", label: "a:7500"}, {addr: "b:7500", host: "b", label: "b:7500"}}}
	m2 := newMembers(two.servers, 2, &backoff.Backoff{})
	two.tlsFor(m2[0], conf).ClientSessionCache.Put("quictun", &tls.ClientSessionState{})
	assert.True(t, got(two, m2[0]))
	for _, m := range m2[1:] {
		assert.False(t, got(two, m), "%s has none", m.label)
	}
	assert.Equal(t, "b", two.tlsFor(m2[3], conf).ServerName, "verified against its own host")
}
