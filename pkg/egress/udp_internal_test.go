package egress

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/proto"
)

// TestFlowAccount: a UDP flow counts against the client's own identity
// (certificate CN, named key), else its source, else its connection; the
// unnamed key names no one (every client of a one-secret deployment holds it).
func TestFlowAccount(t *testing.T) {
	t.Parallel()
	named := proto.Key{Name: "team-a", Secret: []byte("s")}
	unnamed := proto.Key{Secret: []byte("s"), ID: proto.KeyIDOf([]byte("s"))}
	for _, tc := range []struct {
		name string
		peer peer
		key  proto.Key
		st   Stream
		want string
	}{
		{"named key", peer{}, named, Stream{Source: "192.0.2.1", ConnID: 7}, "key=team-a"},
		{"certificate", peer{cn: "runner"}, proto.Key{}, Stream{Source: "192.0.2.1"}, "CN=runner"},
		{"certificate and named key", peer{cn: "runner"}, named, Stream{}, "CN=runner,key=team-a"},
		{"certificate and unnamed key", peer{cn: "runner"}, unnamed, Stream{}, "CN=runner"},
		{"unnamed key: the source", peer{}, unnamed, Stream{Source: "2001:db8::/64", ConnID: 7}, "source=2001:db8::/64"},
		{"no authentication: the source", peer{}, proto.Key{}, Stream{Source: "192.0.2.1"}, "source=192.0.2.1"},
		{"nothing: the connection", peer{}, proto.Key{}, Stream{ConnID: 7}, "conn=7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, flowAccount(tc.peer, tc.key, tc.st))
		})
	}
}

func TestShares(t *testing.T) {
	t.Parallel()
	s := shares{open: map[string]int{}}
	for i := range 2 {
		n, ok := s.take("a", 2)
		require.True(t, ok)
		assert.Equal(t, i, n)
	}
	n, ok := s.take("a", 2)
	assert.False(t, ok)
	assert.Equal(t, 2, n)
	_, ok = s.take("b", 2)
	assert.True(t, ok, "another account has its own share")
	s.release("a")
	_, ok = s.take("a", 2)
	assert.True(t, ok, "a released flow frees its place")
	s.release("a")
	s.release("a")
	s.release("b")
	assert.Empty(t, s.open, "accounts without flows are forgotten")
}
