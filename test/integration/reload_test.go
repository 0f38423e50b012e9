package integration

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/server"
)

// echoMsg writes msg on c and reads the echo.
func echoMsg(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	_, err := c.Write([]byte(msg))
	require.NoError(t, err)
	got := make([]byte, len(msg))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, msg, string(got))
}

// TestSetAllowListKeepsOpenTunnels: new rules apply to streams that arrive
// after the change; tunnels already open keep running.
func TestSetAllowListKeepsOpenTunnels(t *testing.T) {
	a, b := testutil.EchoServer(t), testutil.EchoServer(t)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + a}})
	toA := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + a, WaitReady: true})
	live := dial(t, toA.Addr)
	echoMsg(t, live, "before")
	expectRefused(t, srv, "tcp:"+b, endpoint.ReasonNotAllowed)

	srv.SetAllowList(endpoint.MustParseAllowList("tcp:"+b), nil)
	toB := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + b, WaitReady: true})
	echoCheck(t, dial(t, toB.Addr), 1000)
	expectRefused(t, srv, "tcp:"+a, endpoint.ReasonNotAllowed)
	echoMsg(t, live, "after: the open tunnel to a is not dropped")
	require.NoError(t, live.CloseWrite())
	rest, err := io.ReadAll(live)
	require.NoError(t, err)
	assert.Empty(t, rest)
}

// TestSetAllowListKeepsSelfRefused: the server's own listeners stay refused
// under rules that would allow them.
func TestSetAllowListKeepsSelfRefused(t *testing.T) {
	admin, hits := adminListener(t, "127.0.0.1:0")
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:127.0.0.2:1"}, Mutate: func(c *server.Config) {
		c.SelfAddrs = []net.Addr{admin}
	}})
	srv.SetAllowList(endpoint.MustParseAllowList("tcp:127.0.0.0/8:*"), nil)
	expectRefused(t, srv, "tcp:"+admin.String(), endpoint.ReasonSelf)
	assert.Zero(t, hits())
}

// keyring returns a keyring of secrets.
func keyring(t *testing.T, secrets ...[]byte) *proto.Keyring {
	t.Helper()
	keys := make([]proto.Key, len(secrets))
	for i, s := range secrets {
		keys[i] = proto.Key{Secret: s}
	}
	kr, err := proto.NewKeyring(keys...)
	require.NoError(t, err)
	return kr
}

// TestKeyRotation: a server holding two keys serves clients of either; once
// the old key is removed, its clients fail with unknown_key at their next
// stream (closing their connection and its tunnels) while open tunnels of
// the new key's clients keep running. Switching authentication modes is
// refused.
func TestKeyRotation(t *testing.T) {
	echo := testutil.EchoServer(t)
	oldSecret, newSecret := testutil.Secret, []byte("a new secret of 32 bytes, really")
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}})
	old := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: oldSecret, WaitReady: true})
	oldLive := dial(t, old.Addr)
	echoMsg(t, oldLive, "before")

	// Step 1: the server accepts both.
	require.NoError(t, srv.SetKeys(keyring(t, newSecret, oldSecret)))
	echoMsg(t, oldLive, "the open tunnel keeps running")
	echoCheck(t, dial(t, old.Addr), 1000)
	cur := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: newSecret, WaitReady: true})
	curLive := dial(t, cur.Addr)
	echoMsg(t, curLive, "new key")

	// Step 2: the old key is removed.
	require.NoError(t, srv.SetKeys(keyring(t, newSecret)))
	refusedRead(t, old.Addr)
	// At least 1: after the refusal the old client reconnects (at once when
	// its connection was up for a second or more: 1 ms later in a measured
	// run, the hello as 0-RTT data) and every hello it sends
	// with the old key counts too, so on a slow machine the count can pass 1
	// between two polls.
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.AuthFailuresTotal.WithLabelValues(egress.AuthUnknownKey)) >= 1
	}, 5*time.Second, 10*time.Millisecond)
	assert.Zero(t, promtest.ToFloat64(srv.Metrics.AuthFailuresTotal.WithLabelValues(egress.AuthBadMAC)))
	echoMsg(t, curLive, "the new key's tunnel is not affected")
	echoCheck(t, dial(t, cur.Addr), 1000)

	// The old client takes the new secret (its reload) and tunnels again.
	// (Its /readyz stays false from the refusal until a tunnel succeeds.)
	old.SetSecret(newSecret)
	echoCheck(t, dial(t, old.Addr), 1000)
	require.Eventually(t, old.Ready, 5*time.Second, 10*time.Millisecond)

	require.ErrorIs(t, srv.SetKeys(nil), server.ErrAuthModeChange)
	echoCheck(t, dial(t, cur.Addr), 1000) // still the new key
}

// blockingParser is a token parser whose first Parse waits for release:
// it holds a stream between its header's key check and its rules' check.
type blockingParser struct {
	server.TokenParser
	once             sync.Once
	entered, release chan struct{}
}

func (p *blockingParser) Parse(tok string) (endpoint.Endpoint, error) {
	p.once.Do(func() {
		close(p.entered)
		<-p.release
	})
	return p.TokenParser.Parse(tok)
}

// TestReloadSwapsKeysAndRulesAtOnce (issue 21 item 7): a stream is checked
// against one configuration, the keys and rules of the same reload. Here a
// reload renames key a to b (same secret) and moves its --allow-for rule
// along, while a stream of key a is between its key check and its rules:
// it keeps the configuration of its header (key=a, with a's rule) and is
// served; with keys and rules read at different times it was refused (its
// identity key=a under the rules for key=b).
func TestReloadSwapsKeysAndRulesAtOnce(t *testing.T) {
	echo := testutil.EchoServer(t)
	secret := []byte("a secret shared by a, later by b")
	named := func(name string) *proto.Keyring {
		kr, err := proto.NewKeyring(proto.Key{Name: name, Secret: secret})
		require.NoError(t, err)
		return kr
	}
	rulesFor := func(id string) map[string]*endpoint.AllowList {
		return map[string]*endpoint.AllowList{id: endpoint.MustParseAllowList("tcp:" + echo)}
	}
	none := endpoint.MustParseAllowList("tcp:127.0.0.2:1")
	parser, err := token.NewParser(token.PluginCleartext, "")
	require.NoError(t, err)
	bp := &blockingParser{TokenParser: parser, entered: make(chan struct{}), release: make(chan struct{})}
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: none.Rules(), Mutate: func(c *server.Config) {
		c.Keys, c.Parser, c.AllowFor = named("a"), bp, rulesFor("key=a")
	}})
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: secret, WaitReady: true})
	c := dial(t, cl.Addr)
	_, err = c.Write([]byte("hello"))
	require.NoError(t, err)
	select {
	case <-bp.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not reach the token parser")
	}
	require.ErrorContains(t, srv.Reconfigure(server.Policy{Keys: named("b")}), "allow-list is required",
		"a policy without rules is refused, as New refuses it (it used to panic in egress)")
	require.NoError(t, srv.Reconfigure(server.Policy{Keys: named("b"), Allow: none, AllowFor: rulesFor("key=b")}))
	close(bp.release)
	got := make([]byte, 5)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err, "the stream is checked against the configuration of its header")
	assert.Equal(t, "hello", string(got))
	assert.Zero(t, promtest.ToFloat64(srv.Metrics.RefusedTotal.WithLabelValues("tcp", endpoint.ReasonNotAllowed)))
}

// TestReconfigureCutsRemovedKeys (issue 21 item 7): with CutRemovedKeys a
// reload that removes key a resets a's open tunnel and UDP flow with
// auth_failed, while key b's tunnel keeps running; without it they all run
// on (new streams of a are refused either way).
func TestReconfigureCutsRemovedKeys(t *testing.T) {
	t.Parallel()
	for _, cut := range []bool{true, false} {
		t.Run(map[bool]string{true: "cut", false: "kept"}[cut], func(t *testing.T) {
			t.Parallel()
			echo, udpEcho := testutil.EchoServer(t), testutil.UDPEchoServer(t)
			secretA, secretB := []byte("the secret of group a, 32 bytes!"), []byte("the secret of group b, 32 bytes!")
			both, err := proto.NewKeyring(proto.Key{Name: "a", Secret: secretA}, proto.Key{Name: "b", Secret: secretB})
			require.NoError(t, err)
			onlyB, err := proto.NewKeyring(proto.Key{Name: "b", Secret: secretB})
			require.NoError(t, err)
			allow := endpoint.MustParseAllowList("tcp:"+echo, "udp:"+udpEcho)
			srv := testutil.StartServer(t, testutil.ServerOptions{Allow: allow.Rules(), Mutate: func(c *server.Config) { c.Keys = both }})
			a := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: secretA, WaitReady: true})
			b := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, Secret: secretB, WaitReady: true})
			aLive, bLive := dial(t, a.Addr), dial(t, b.Addr)
			echoMsg(t, aLive, "a")
			echoMsg(t, bLive, "b")
			aFlow, _ := udpForward(t, srv, "udp:"+udpEcho, func(c *client.Config) { c.Secret, c.UDPIdleTimeout = secretA, time.Hour })
			flow := exchange(t, aFlow, 10) // its socket keeps the flow
			require.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.UDP.FlowsActive))

			require.NoError(t, srv.Reconfigure(server.Policy{Keys: onlyB, Allow: allow, CutRemovedKeys: cut}))
			echoMsg(t, bLive, "b keeps running")
			if !cut {
				echoMsg(t, aLive, "a keeps running")
				buf := make([]byte, 100)
				var n int
				for try := 0; try < 5; try++ { // datagrams may be lost
					_, err = flow.Write(packet(9, 10))
					require.NoError(t, err)
					_ = flow.SetReadDeadline(time.Now().Add(2 * time.Second))
					if n, err = flow.Read(buf); err == nil {
						break
					}
				}
				require.NoError(t, err, "a's flow keeps running")
				assert.Equal(t, uint32(9), checkPacket(t, buf[:n]))
				assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.UDP.FlowsActive))
				return
			}
			_ = aLive.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = aLive.Read(make([]byte, 1))
			require.True(t, isReset(err), "a's tunnel must be reset, got %v", err)
			require.Eventually(t, func() bool {
				return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues("auth_failed")) == 1 &&
					promtest.ToFloat64(srv.Metrics.UDP.FlowsTotal.WithLabelValues("auth_failed")) == 1 &&
					promtest.ToFloat64(srv.Metrics.UDP.FlowsActive) == 0
			}, 10*time.Second, 10*time.Millisecond, "a's tunnel and flow end with auth_failed")
			assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.ActiveStreams), "b's tunnel is open")
		})
	}
}
