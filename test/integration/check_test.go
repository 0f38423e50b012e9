package integration

import (
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/server"
)

// signedCheck encodes a destination check (proto.KindCheck) for token made
// at at, with secret.
func signedCheck(t *testing.T, token string, at time.Time, secret []byte) []byte {
	t.Helper()
	h, err := proto.NewCheck(token, at)
	require.NoError(t, err)
	b, err := h.Append(nil, secret)
	require.NoError(t, err)
	return b
}

// TestCheckFollowsReconfigure: a destination check is answered from the keys
// and rules in force (one policy, as a tunnel's header), after the freshness
// check, the rules, then the replay check, without opening a tunnel: a
// reload that adds a rule makes it allowed, one that removes its key
// (--cut-removed-keys) refuses it with auth_failed; a check counts in no
// streams_total, a refused one in refused_destinations_total and takes no
// place in the replay cache, as a tunnel's header (issue 30 I2; a stale one
// is rejected as a stale tunnel header is, before its kind is looked at).
func TestCheckFollowsReconfigure(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	const other = "tcp:127.0.0.1:1"
	secretA, secretB := []byte("the secret of group a, 32 bytes!"), []byte("the secret of group b, 32 bytes!")
	both, err := proto.NewKeyring(proto.Key{Name: "a", Secret: secretA}, proto.Key{Name: "b", Secret: secretB})
	require.NoError(t, err)
	onlyB, err := proto.NewKeyring(proto.Key{Name: "b", Secret: secretB})
	require.NoError(t, err)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) { c.Keys = both }})

	c := attackerConn(t, srv)
	assert.Equal(t, proto.CodeOK, streamResult(t, c, signedCheck(t, "tcp:"+echo, time.Now(), secretA)))
	refused := signedCheck(t, other, time.Now(), secretB)
	assert.Equal(t, proto.CodeRefused, streamResult(t, c, refused))
	assert.Equal(t, proto.CodeRefused, streamResult(t, c, refused), "a refused check's header takes no place in the replay cache")
	assert.Equal(t, 2.0, promtest.ToFloat64(srv.Metrics.RefusedTotal.WithLabelValues("tcp", endpoint.ReasonNotAllowed)),
		"a refused check counts as a refused destination")
	assert.Equal(t, proto.CodeReplay, streamResult(t, c, signedCheck(t, "tcp:"+echo, time.Now().Add(-time.Hour), secretA)))
	replayed := signedCheck(t, "tcp:"+echo, time.Now(), secretB)
	assert.Equal(t, proto.CodeOK, streamResult(t, c, replayed))
	assert.Equal(t, proto.CodeReplay, streamResult(t, c, replayed), "a check's header is recorded like a tunnel's")

	require.NoError(t, srv.Reconfigure(server.Policy{Keys: onlyB, Allow: endpoint.MustParseAllowList("tcp:"+echo, other), CutRemovedKeys: true}))
	assert.Equal(t, proto.CodeOK, streamResult(t, c, refused), "the new rules answer (the header refused before was not recorded)")
	assert.Equal(t, proto.CodeAuthFailed, streamResult(t, attackerConn(t, srv), signedCheck(t, "tcp:"+echo, time.Now(), secretA)),
		"the removed key is refused")

	for _, result := range []string{"ok", "refused"} {
		assert.Zero(t, promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues(result)), result)
	}
	assert.Equal(t, 2.0, promtest.ToFloat64(srv.Metrics.RefusedTotal.WithLabelValues("tcp", endpoint.ReasonNotAllowed)))
}
