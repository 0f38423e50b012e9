package integration

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/transport"
	tunnelpkg "github.com/quictun/quictun/pkg/tunnel"
	"github.com/quictun/quictun/server"
)

// reverseServer starts a server that lets clients listen at the listen
// rules (--allow-remote-listen).
func reverseServer(t *testing.T, listen ...string) *testutil.Server {
	t.Helper()
	return testutil.StartServer(t, testutil.ServerOptions{Mutate: func(c *server.Config) {
		c.AllowRemoteListen = endpoint.MustParseAllowList(listen...)
		c.Reverse.Events = server.NewReverseMetrics(prometheus.NewRegistry())
	}})
}

// reverseClient starts a client of srv with the remote forwards
// LISTEN=DESTINATION.
func reverseClient(t *testing.T, srv *testutil.Server, forwards ...string) *testutil.Client {
	t.Helper()
	return testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:1", WaitReady: true,
		Mutate: func(c *client.Config) { withRemoteForwards(t, c, forwards...) }})
}

// withRemoteForwards gives c the remote forwards LISTEN=DESTINATION.
func withRemoteForwards(t *testing.T, c *client.Config, forwards ...string) {
	t.Helper()
	c.RemoteForwards = nil
	for _, f := range forwards {
		l, d, ok := cut(f)
		require.True(t, ok, f)
		c.RemoteForwards = append(c.RemoteForwards, client.RemoteForward{Listen: mustEndpoint(t, l), Destination: mustEndpoint(t, d)})
	}
	c.Reverse.Events = client.NewReverseMetrics(prometheus.NewRegistry())
}

func cut(f string) (string, string, bool) {
	for i := 0; i < len(f); i++ {
		if f[i] == '=' {
			return f[:i], f[i+1:], true
		}
	}
	return "", "", false
}

func mustEndpoint(t *testing.T, s string) endpoint.Endpoint {
	t.Helper()
	ep, err := endpoint.Parse(s)
	require.NoError(t, err)
	return ep
}

// dialWhenListening dials addr until the server listens there.
func dialWhenListening(t *testing.T, addr string) net.Conn {
	t.Helper()
	var c net.Conn
	require.Eventually(t, func() bool {
		var err error
		c, err = net.DialTimeout("tcp", addr, time.Second)
		return err == nil
	}, 15*time.Second, 20*time.Millisecond, "the server listens at %s", addr)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestReverseForwardTCP (issue 23 item 2): a connection to the listener the
// server opened for the client's --remote-forward reaches the client's
// declared destination, both ways with half-close; /tunnels on both sides
// shows the direction.
func TestReverseForwardTCP(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	listen := testutil.FreeAddr(t, "tcp")
	srv := reverseServer(t, "tcp:"+listen)
	c := reverseClient(t, srv, "tcp:"+listen+"=tcp:"+echo)
	conn := dialWhenListening(t, listen)
	echoCheck(t, conn, 1<<20)
	require.Eventually(t, func() bool { return srv.Server.Registry().Len() == 0 && c.Client.Registry().Len() == 0 }, 10*time.Second, 10*time.Millisecond)

	conn2 := dialWhenListening(t, listen)
	_, err := conn2.Write([]byte("ping"))
	require.NoError(t, err)
	_, err = io.ReadFull(conn2, make([]byte, 4))
	require.NoError(t, err)
	for _, reg := range []*tunnelpkg.Registry{srv.Server.Registry(), c.Client.Registry()} {
		list := reg.List(time.Now())
		require.Len(t, list, 1)
		assert.Equal(t, tunnelpkg.Reverse, list[0].Direction)
	}
}

// TestReverseForwardServerSpeaksFirst: the destination's first bytes (an
// ssh banner) reach the application before it sends anything.
func TestReverseForwardServerSpeaksFirst(t *testing.T) {
	t.Parallel()
	banner := "SSH-2.0-quictun-test\r\n"
	dest := testutil.ServeTCP(t, func(c net.Conn) {
		_, _ = c.Write([]byte(banner))
		_, _ = io.Copy(io.Discard, c)
	})
	listen := testutil.FreeAddr(t, "tcp")
	srv := reverseServer(t, "tcp:"+listen)
	reverseClient(t, srv, "tcp:"+listen+"=tcp:"+dest)
	conn := dialWhenListening(t, listen)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(banner))
	_, err := io.ReadFull(conn, got)
	require.NoError(t, err)
	assert.Equal(t, banner, string(got))
}

// TestReverseForwardRefused: an address no --allow-remote-listen rule
// admits is not bound, refused with its code (counted on the server), and a
// server that allows none answers unsupported.
func TestReverseForwardRefused(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	allowed, other := testutil.FreeAddr(t, "tcp"), testutil.FreeAddr(t, "tcp")
	srv := reverseServer(t, "tcp:"+allowed)
	reverseClient(t, srv, "tcp:"+other+"=tcp:"+echo)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues(proto.CodeRefused.String())) >= 1
	}, 10*time.Second, 10*time.Millisecond)
	_, err := net.DialTimeout("tcp", other, time.Second)
	require.Error(t, err, "nothing listens at a refused address")

	plain := testutil.StartServer(t, testutil.ServerOptions{})
	reverseClient(t, plain, "tcp:"+other+"=tcp:"+echo)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(plain.Metrics.StreamsTotal.WithLabelValues(proto.CodeUnsupported.String())) >= 1
	}, 10*time.Second, 10*time.Millisecond)
}

// TestReverseForwardAddrInUse: a second client asking for an address
// another client holds is refused with addr_in_use, and gets it once the
// first one is gone (it asks again).
func TestReverseForwardAddrInUse(t *testing.T) {
	t.Parallel()
	banner := func(s string) string {
		return testutil.ServeTCP(t, func(c net.Conn) { _, _ = c.Write([]byte(s)); _, _ = io.Copy(io.Discard, c) })
	}
	one, two := banner("1"), banner("2")
	listen := testutil.FreeAddr(t, "tcp")
	srv := reverseServer(t, "tcp:"+listen)
	first := reverseClient(t, srv, "tcp:"+listen+"=tcp:"+one)
	readOne := func() string {
		c := dialWhenListening(t, listen)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil {
			return err.Error()
		}
		_ = c.Close()
		return string(b)
	}
	require.Equal(t, "1", readOne())
	reverseClient(t, srv, "tcp:"+listen+"=tcp:"+two)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues(proto.CodeAddrInUse.String())) >= 1
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, "1", readOne(), "the first client keeps its address")
	first.Stop(t)
	require.Eventually(t, func() bool { return readOne() == "2" }, 20*time.Second, 100*time.Millisecond,
		"the second client binds the address once the first is gone")
}

// TestReverseForwardServerCannotChooseDestination (issue 23: "the server
// cannot make the client dial anything but its declared destinations"): a
// server that opens streams toward the client naming a destination, an
// undeclared binding, a binding with the wrong kind, or a hello is refused
// with a code, and nothing is dialed; the declared binding works.
func TestReverseForwardServerCannotChooseDestination(t *testing.T) {
	t.Parallel()
	var dialed atomic.Int64
	bait := testutil.ServeTCP(t, func(c net.Conn) { dialed.Add(1) })
	echo := testutil.EchoServer(t)

	st, err := transport.LoadOrCreateState(t.TempDir(), "", "")
	require.NoError(t, err)
	pc, err := transport.ListenUDP("127.0.0.1:0")
	require.NoError(t, err)
	tr := &quic.Transport{Conn: pc}
	t.Cleanup(func() { _ = tr.Close(); _ = pc.Close() })
	ln, err := tr.Listen(transport.ServerTLSConfig(st, nil), transport.QUICConfig(transport.DefaultQUICOptions()))
	require.NoError(t, err)
	fake := &testutil.Server{Addr: pc.LocalAddr().String(), State: st}
	conns := make(chan *quic.Conn, 1)
	go func() {
		c, err := ln.Accept(context.Background())
		if err != nil {
			return
		}
		conns <- c
		// Answer the client's hello and binds: OK, kept open.
		for {
			str, err := c.AcceptStream(context.Background())
			if err != nil {
				return
			}
			if _, err := proto.Decode(str); err == nil {
				_ = proto.WriteReply(str, proto.CodeOK)
			}
		}
	}()
	reverseClientNoWait(t, fake, "tcp:127.0.0.1:1="+"tcp:"+echo)
	var conn *quic.Conn
	select {
	case conn = <-conns:
	case <-time.After(15 * time.Second):
		t.Fatal("the client did not connect")
	}
	open := func(token string, kind proto.Kind) (*quic.Stream, proto.Code) {
		h, err := proto.NewHeader(token, time.Now())
		require.NoError(t, err)
		h.Kind = kind
		b, err := h.Append(nil, nil)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		str, err := conn.OpenStreamSync(ctx)
		require.NoError(t, err)
		_, err = str.Write(b)
		require.NoError(t, err)
		_ = str.SetReadDeadline(time.Now().Add(10 * time.Second))
		if err := proto.ReadReply(str); err != nil {
			code, ok := proto.FromError(err)
			require.True(t, ok, "want a reset with a code, got %v", err)
			return str, code
		}
		return str, proto.CodeOK
	}
	for _, tc := range []struct {
		token string
		kind  proto.Kind
		want  proto.Code
	}{
		{"tcp:" + bait, proto.KindTCP, proto.CodeBadToken},
		{"unix:/run/docker.sock", proto.KindTCP, proto.CodeBadToken},
		{proto.BoundToken(1), proto.KindTCP, proto.CodeBadToken},
		{proto.BoundToken(0), proto.KindUDP, proto.CodeBadToken},
		{"bound/1/0/tcp:" + bait, proto.KindTCP, proto.CodeBadToken},
		{proto.HelloToken, proto.KindHello, proto.CodeUnsupported},
		{proto.Bind{ID: 0, Listen: "tcp:" + bait}.Token(), proto.KindReverse, proto.CodeUnsupported},
	} {
		_, code := open(tc.token, tc.kind)
		assert.Equal(t, tc.want, code, "token %q kind %s", tc.token, tc.kind)
	}
	str, code := open(proto.BoundToken(0), proto.KindTCP)
	require.Equal(t, proto.CodeOK, code, "the declared binding is served")
	_, err = str.Write([]byte("ok"))
	require.NoError(t, err)
	got := make([]byte, 2)
	_, err = io.ReadFull(str, got)
	require.NoError(t, err)
	assert.Equal(t, "ok", string(got))
	str.CancelRead(0)
	str.CancelWrite(0)
	assert.Zero(t, dialed.Load(), "the client dialed nothing the server named")
	_ = conn.CloseWithError(0, "")
	_ = ln.Close()
}

// reverseClientNoWait is reverseClient without waiting for readiness (a
// fake server answers no hello the client counts).
func reverseClientNoWait(t *testing.T, srv *testutil.Server, forwards ...string) *testutil.Client {
	t.Helper()
	return testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:1",
		Mutate: func(c *client.Config) { withRemoteForwards(t, c, forwards...) }})
}

// TestReverseForwardUDP: the flows of a UDP reverse forward reach the
// client's declared udp: destination and its answers come back.
func TestReverseForwardUDP(t *testing.T) {
	t.Parallel()
	echo := testutil.UDPEchoServer(t)
	listen := testutil.FreeAddr(t, "udp")
	srv := reverseServer(t, "udp:"+listen)
	reverseClient(t, srv, "udp:"+listen+"=udp:"+echo)
	app := udpSocket(t)
	dst, err := net.ResolveUDPAddr("udp", listen)
	require.NoError(t, err)
	for seq := uint32(1); seq <= 3; seq++ {
		got := false
		for try := 0; try < 50 && !got; try++ { // until the server listens
			_, err := app.WriteToUDP(packet(seq, 1000), dst)
			require.NoError(t, err)
			_ = app.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			buf := make([]byte, 2048)
			n, err := app.Read(buf)
			got = err == nil && checkPacket(t, buf[:n]) == seq
		}
		require.True(t, got, "packet %d answered through the reverse forward", seq)
	}
}

// TestReverseForwardAfterServerRestart: the bindings come back on the
// client's next connection.
func TestReverseForwardAfterServerRestart(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	listen := testutil.FreeAddr(t, "tcp")
	state := t.TempDir()
	opts := testutil.ServerOptions{StateDir: state, Mutate: func(c *server.Config) {
		c.AllowRemoteListen = endpoint.MustParseAllowList("tcp:" + listen)
		c.Reverse.Events = server.NewReverseMetrics(prometheus.NewRegistry())
		c.DrainTimeout = 0
	}}
	srv := testutil.StartServer(t, opts)
	reverseClient(t, srv, "tcp:"+listen+"=tcp:"+echo)
	echoCheck(t, dialWhenListening(t, listen), 64<<10)
	srv.Stop(t)
	opts.Addr = srv.Addr
	testutil.StartServer(t, opts)
	echoCheck(t, dialWhenListening(t, listen), 64<<10)
}

// TestReverseForwardLimits: past its share of listeners a connection's
// binds are refused with overloaded; a server that drains closes its
// listeners at once.
func TestReverseForwardLimits(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	a, b := testutil.FreeAddr(t, "tcp"), testutil.FreeAddr(t, "tcp")
	srv := testutil.StartServer(t, testutil.ServerOptions{Mutate: func(c *server.Config) {
		c.AllowRemoteListen = endpoint.MustParseAllowList("tcp:"+a, "tcp:"+b)
		c.Reverse.Events = server.NewReverseMetrics(prometheus.NewRegistry())
		c.MaxRemoteListensPerConn = 1
		c.DrainTimeout = 0
	}})
	reverseClient(t, srv, "tcp:"+a+"=tcp:"+echo, "tcp:"+b+"=tcp:"+echo)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues(proto.CodeOverloaded.String())) >= 1
	}, 10*time.Second, 10*time.Millisecond, "the second bind is over the connection's share")
	listening := func(addr string) bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}
	require.Eventually(t, func() bool { return listening(a) != listening(b) }, 10*time.Second, 20*time.Millisecond,
		"exactly one of the two addresses is bound")
	srv.Stop(t)
	assert.False(t, listening(a) || listening(b), "the drain closed the listener")
}

// TestReverseForwardUnix: a unix: listen address gives the server host a
// socket file, removed when the binding ends.
func TestReverseForwardUnix(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	dir := t.TempDir()
	sock := dir + "/rev.sock"
	srv := testutil.StartServer(t, testutil.ServerOptions{Mutate: func(c *server.Config) {
		c.AllowRemoteListen = endpoint.MustParseAllowList("unix:" + dir + "/*")
		c.Reverse.Events = server.NewReverseMetrics(prometheus.NewRegistry())
		c.DrainTimeout = 0
	}})
	reverseClient(t, srv, "unix:"+sock+"=tcp:"+echo)
	var c net.Conn
	require.Eventually(t, func() bool {
		var err error
		c, err = net.DialTimeout("unix", sock, time.Second)
		return err == nil
	}, 15*time.Second, 20*time.Millisecond)
	echoCheck(t, c, 64<<10)
	srv.Stop(t)
	_, err := net.DialTimeout("unix", sock, time.Second)
	assert.Error(t, err, "the socket is gone with the binding")
}

// listening tells whether something accepts TCP connections at addr.
func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		_ = c.Close()
	}
	return err == nil
}

// TestReverseForwardReloadRules (issue 23): a reload of the
// --allow-remote-listen rules (Server.SetRemoteListen) closes the listeners
// of the bindings the new rules no longer admit, keeps the others, and
// checks binds from then on against the new rules; a server started
// without reverse forwards refuses to enable them without a restart.
func TestReverseForwardReloadRules(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	a, b := testutil.FreeAddr(t, "tcp"), testutil.FreeAddr(t, "tcp")
	srv := reverseServer(t, "tcp:"+a, "tcp:"+b)
	reverseClient(t, srv, "tcp:"+a+"=tcp:"+echo, "tcp:"+b+"=tcp:"+echo)
	echoCheck(t, dialWhenListening(t, a), 64<<10)
	echoCheck(t, dialWhenListening(t, b), 64<<10)
	open := dialWhenListening(t, b)

	n, err := srv.Server.SetRemoteListen(endpoint.MustParseAllowList("tcp:"+b), nil)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "one binding is no longer admitted")
	require.Eventually(t, func() bool { return !listening(a) }, 10*time.Second, 20*time.Millisecond, "the listener at %s is closed", a)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues(proto.CodeRefused.String())) >= 1
	}, 10*time.Second, 10*time.Millisecond, "the client asks again and is refused under the new rules")
	echoCheck(t, open, 64<<10) // a connection open on the kept binding runs on
	echoCheck(t, dialWhenListening(t, b), 64<<10)
	assert.False(t, listening(a), "the refused bind did not listen again")

	// New binds are checked against the rules in force: allowed again, a
	// client asking for it gets it.
	n, err = srv.Server.SetRemoteListen(endpoint.MustParseAllowList("tcp:"+a, "tcp:"+b), nil)
	require.NoError(t, err)
	assert.Zero(t, n)
	reverseClient(t, srv, "tcp:"+a+"=tcp:"+echo)
	echoCheck(t, dialWhenListening(t, a), 64<<10)

	// By identity, then none at all: every binding closes.
	n, err = srv.Server.SetRemoteListen(nil, map[string]*endpoint.AllowList{"key=nobody": endpoint.MustParseAllowList("tcp:" + a)})
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	require.Eventually(t, func() bool { return !listening(a) && !listening(b) }, 10*time.Second, 20*time.Millisecond)

	plain := testutil.StartServer(t, testutil.ServerOptions{})
	_, err = plain.Server.SetRemoteListen(endpoint.MustParseAllowList("tcp:"+a), nil)
	require.ErrorIs(t, err, server.ErrReverseOff)
	_, err = plain.Server.SetRemoteListen(nil, nil)
	require.NoError(t, err)
}

// TestReverseForwardCutOnKeyRemoval (issue 23): a reload that removes a
// key with CutRemovedKeys closes that key's reverse forward listeners;
// another key's binding keeps running.
func TestReverseForwardCutOnKeyRemoval(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	la, lb := testutil.FreeAddr(t, "tcp"), testutil.FreeAddr(t, "tcp")
	secretA, secretB := []byte("the secret of group a, 32 bytes!"), []byte("the secret of group b, 32 bytes!")
	both, err := proto.NewKeyring(proto.Key{Name: "a", Secret: secretA}, proto.Key{Name: "b", Secret: secretB})
	require.NoError(t, err)
	onlyB, err := proto.NewKeyring(proto.Key{Name: "b", Secret: secretB})
	require.NoError(t, err)
	srv := testutil.StartServer(t, testutil.ServerOptions{Mutate: func(c *server.Config) {
		c.Keys = both
		c.AllowRemoteListen = endpoint.MustParseAllowList("tcp:"+la, "tcp:"+lb)
		c.Reverse.Events = server.NewReverseMetrics(prometheus.NewRegistry())
	}})
	for _, k := range []struct {
		secret []byte
		listen string
	}{{secretA, la}, {secretB, lb}} {
		testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:1", Secret: k.secret, WaitReady: true, Mutate: func(c *client.Config) {
			c.RemoteForwards = []client.RemoteForward{{Listen: mustEndpoint(t, "tcp:"+k.listen), Destination: mustEndpoint(t, "tcp:"+echo)}}
			c.Reverse.Events = client.NewReverseMetrics(prometheus.NewRegistry())
		}})
	}
	echoCheck(t, dialWhenListening(t, la), 64<<10)
	echoCheck(t, dialWhenListening(t, lb), 64<<10)

	require.NoError(t, srv.Server.Reconfigure(server.Policy{Keys: onlyB, Allow: endpoint.MustParseAllowList("tcp:" + echo), CutRemovedKeys: true}))
	require.Eventually(t, func() bool { return !listening(la) }, 10*time.Second, 20*time.Millisecond,
		"the removed key's listener at %s is closed", la)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srv.Metrics.StreamsTotal.WithLabelValues(proto.CodeAuthFailed.String())) >= 1
	}, 10*time.Second, 10*time.Millisecond, "its client's new bind is refused (auth_failed)")
	echoCheck(t, dialWhenListening(t, lb), 64<<10)
	assert.False(t, listening(la))
}

// TestReverseForwardOverTCP (issue 33): with --transport tcp the reverse
// forward is bound over the TCP connection and its connections ping-pong
// through it; the server opened the listener for a client that came over
// TCP (it refused that with needs_quic before).
func TestReverseForwardOverTCP(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	listen := testutil.FreeAddr(t, "tcp")
	srv := testutil.StartServer(t, testutil.ServerOptions{TCP: true, Mutate: func(c *server.Config) {
		c.AllowRemoteListen = endpoint.MustParseAllowList("tcp:" + listen)
		c.Reverse.Events = server.NewReverseMetrics(prometheus.NewRegistry())
	}})
	c := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:127.0.0.1:1", WaitReady: true,
		Mutate: func(c *client.Config) {
			c.Transport, c.TCPServerAddr = client.TransportTCP, srv.TCPAddr
			withRemoteForwards(t, c, "tcp:"+listen+"=tcp:"+echo)
		}})
	for i := range 3 {
		conn := dialWhenListening(t, listen)
		msg := []byte("ping " + string(rune('0'+i)))
		_, err := conn.Write(msg)
		require.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = io.ReadFull(conn, got)
		require.NoError(t, err)
		assert.Equal(t, msg, got)
		list := c.Client.Registry().List(time.Now())
		require.NotEmpty(t, list)
		assert.Equal(t, "tcp", list[0].Transport, "the reverse tunnel runs over TCP")
		_ = conn.Close()
	}
	assert.Equal(t, 1.0, promtest.ToFloat64(srv.Metrics.ActiveTCPConnections))
}
