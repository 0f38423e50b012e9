// Package testutil starts in-process quictun servers and clients, echo and
// other destination servers on loopback, for tests only.
package testutil

import (
	"cmp"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/server"
)

// Secret is the shared secret used by default.
var Secret = []byte("0123456789abcdef0123456789abcdef")

// ServerOptions tune StartServer.
type ServerOptions struct {
	StateDir string // default: a new temp dir
	Allow    []string
	Deny     []string // deny rules (endpoint.ParseRules)
	Secret   []byte   // nil: Secret; use NoAuth for none
	NoAuth   bool
	Addr     string // default 127.0.0.1:0
	Mutate   func(*server.Config)
	QUIC     func(*transport.QUICOptions)
	// WrapConn wraps the server's UDP socket (e.g. with forward error correction).
	WrapConn func(net.PacketConn) net.PacketConn
	// TCP also listens on TCP (Server.TCPAddr): the fallback for clients
	// whose UDP is blocked; on TCPAddr if set (a restarted server's).
	TCP     bool
	TCPAddr string
	// Logger, when set, is the server's logger (klog.NewContext); default klog's.
	Logger *klog.Logger
	// PacketConn, if set, is the UDP socket to serve on instead of
	// listening on Addr (an upgrade's successor takes its predecessor's).
	PacketConn *net.UDPConn
	// BeforeRun, if set, is called with the server before Run (an
	// upgrade's successor imports the tunnels handed over).
	BeforeRun func(*server.Server)
}

// Server is a running in-process server.
type Server struct {
	*server.Server
	Addr string
	// TCPAddr is the TCP listener's address (ServerOptions.TCP), else "".
	TCPAddr     string
	State       *transport.State
	StateDir    string
	Registry    *prometheus.Registry
	Metrics     *metrics.Server
	stop        context.CancelFunc
	done        chan error
	pc          net.PacketConn
	stoppedOnce sync.Once
}

// Stop cancels the server and waits for Run to return and the socket to close.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.stoppedOnce.Do(func() {
		s.stop()
		select {
		case err := <-s.done:
			require.NoError(t, err)
		case <-time.After(60 * time.Second):
			t.Fatal("server did not stop")
		}
		_ = s.pc.Close()
	})
}

// StartServer runs a server until the test ends.
func StartServer(t testing.TB, o ServerOptions) *Server {
	t.Helper()
	if o.StateDir == "" {
		o.StateDir = t.TempDir()
	}
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	st, err := transport.LoadOrCreateState(o.StateDir, "", "")
	require.NoError(t, err)
	allow := endpoint.DefaultAllowList()
	if o.Allow != nil || o.Deny != nil {
		rules := o.Allow
		if rules == nil {
			rules = allow.Rules()
		}
		allow, err = endpoint.ParseRules(rules, o.Deny)
		require.NoError(t, err)
	}
	parser, err := token.NewParser(token.PluginCleartext, "")
	require.NoError(t, err)
	secret := o.Secret
	if secret == nil && !o.NoAuth {
		secret = Secret
	}
	qo := transport.DefaultQUICOptions()
	if o.QUIC != nil {
		o.QUIC(&qo)
	}
	reg := prometheus.NewRegistry()
	m := server.NewMetrics(reg)
	pc := o.PacketConn
	if pc == nil {
		require.Eventually(t, func() bool { // a restarted server may wait for its port
			pc, err = transport.ListenUDP(o.Addr)
			return err == nil
		}, 5*time.Second, 50*time.Millisecond, "listen %s", o.Addr)
	}
	var keys *proto.Keyring
	if len(secret) > 0 {
		keys, err = proto.NewKeyring(proto.Key{Secret: secret})
		require.NoError(t, err)
	}
	cfg := server.Config{
		Config: egress.Config{Keys: keys, Parser: parser, Allow: allow}, Metrics: m,
		TLS: transport.ServerTLSConfig(st, nil), QUIC: transport.QUICConfig(qo),
		ResetKey: &st.ResetKey, TokenKey: &st.TokenKey,
		DrainTimeout: 5 * time.Second,
	}
	if o.TCP {
		ln, err := net.Listen("tcp", cmp.Or(o.TCPAddr, "127.0.0.1:0"))
		require.NoError(t, err)
		cfg.TCP = ln
	}
	if o.Mutate != nil {
		o.Mutate(&cfg)
	}
	var spc net.PacketConn = pc
	if o.WrapConn != nil {
		spc = o.WrapConn(pc)
	}
	srv, err := server.New(cfg, spc)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	if o.Logger != nil {
		ctx = klog.NewContext(ctx, *o.Logger)
	}
	s := &Server{Server: srv, Addr: pc.LocalAddr().String(), State: st, StateDir: o.StateDir, Registry: reg, Metrics: m,
		stop: cancel, done: make(chan error, 1), pc: pc}
	if cfg.TCP != nil {
		s.TCPAddr = cfg.TCP.Addr().String()
	}
	if o.BeforeRun != nil {
		o.BeforeRun(srv)
	}
	go func() { s.done <- srv.Run(ctx) }()
	t.Cleanup(func() { s.Stop(t) })
	require.Eventually(t, srv.Ready, 5*time.Second, 5*time.Millisecond)
	return s
}

// PacketConn is the server's UDP socket.
func (s *Server) PacketConn() net.PacketConn { return s.pc }

// ClientOptions tune StartClient.
type ClientOptions struct {
	Token       string // Fixed token
	Secret      []byte // nil: Secret
	NoAuth      bool
	Fingerprint string // default: the server's
	TLS         func(*transport.ClientTLSOptions)
	Listeners   []net.Listener // default: one TCP listener on 127.0.0.1:0
	Mutate      func(*client.Config)
	QUIC        func(*transport.QUICOptions)
	WaitReady   bool
	// Logger, when set, is the client's logger (klog.NewContext); default klog's.
	Logger *klog.Logger
	// ServerAddr overrides the address dialed (e.g. a proxy in front of the server).
	ServerAddr string
	// WrapConn wraps the client's UDP sockets (e.g. with forward error correction).
	WrapConn func(net.PacketConn) net.PacketConn
}

// Client is a running in-process client.
type Client struct {
	*client.Client
	Addr     string // the first listener's address
	Registry *prometheus.Registry
	Metrics  *metrics.Client
	stop     context.CancelFunc
	done     chan error
	pc       net.PacketConn
	once     sync.Once
}

// Stop cancels the client and waits for Run to return.
func (c *Client) Stop(t testing.TB) {
	t.Helper()
	c.once.Do(func() {
		c.stop()
		select {
		case err := <-c.done:
			require.NoError(t, err)
		case <-time.After(60 * time.Second):
			t.Fatal("client did not stop")
		}
		_ = c.pc.Close()
	})
}

// StartClient runs a client against srv until the test ends.
func StartClient(t testing.TB, srv *Server, o ClientOptions) *Client {
	t.Helper()
	fp := o.Fingerprint
	if fp == "" {
		fp = srv.State.Fingerprint()
	}
	pin, err := transport.ParseFingerprint(fp)
	require.NoError(t, err)
	topts := transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}, SessionCache: transport.NewStickySessionCache(4)}
	if o.TLS != nil {
		o.TLS(&topts)
	}
	tlsConf, err := transport.ClientTLSConfig(topts)
	require.NoError(t, err)
	tokens, err := token.NewSource(token.PluginFixed, o.Token, nil)
	require.NoError(t, err)
	secret := o.Secret
	if secret == nil && !o.NoAuth {
		secret = Secret
	}
	if o.Listeners == nil {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		o.Listeners = []net.Listener{ln}
	}
	qo := transport.DefaultQUICOptions()
	if o.QUIC != nil {
		o.QUIC(&qo)
	}
	reg := prometheus.NewRegistry()
	m := client.NewMetrics(reg)
	pc, err := transport.ListenUDP("127.0.0.1:0")
	require.NoError(t, err)
	bo := client.DefaultBackoff()
	bo.Max = 500 * time.Millisecond
	serverAddr := srv.Addr
	if o.ServerAddr != "" {
		serverAddr = o.ServerAddr
	}
	cfg := client.Config{
		Metrics:    m,
		ServerAddr: serverAddr, TLS: tlsConf, QUIC: transport.QUICConfig(qo), Secret: secret, Tokens: tokens,
		Listeners: o.Listeners, SessionWait: 5 * time.Second, DrainTimeout: 5 * time.Second, Backoff: bo,
		HeartbeatInterval: 200 * time.Millisecond, TailProbes: 1,
	}
	if o.Mutate != nil {
		o.Mutate(&cfg)
	}
	cfg.WrapConn = o.WrapConn
	var cpc net.PacketConn = pc
	if o.WrapConn != nil {
		cpc = o.WrapConn(pc)
	}
	cl, err := client.New(cfg, cpc)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	if o.Logger != nil {
		ctx = klog.NewContext(ctx, *o.Logger)
	}
	c := &Client{Client: cl, Addr: o.Listeners[0].Addr().String(), Registry: reg, Metrics: m, stop: cancel, done: make(chan error, 1), pc: pc}
	go func() { c.done <- cl.Run(ctx) }()
	t.Cleanup(func() { c.Stop(t) })
	if o.WaitReady {
		require.Eventually(t, cl.Ready, 10*time.Second, 5*time.Millisecond, "client never connected")
	}
	return c
}

// EchoServer echoes every connection until EOF, then half-closes. It stops when the test ends.
func EchoServer(t testing.TB) string {
	t.Helper()
	return ServeTCP(t, func(c net.Conn) {
		_, _ = io.Copy(c, c)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	})
}

// UDPEchoServer answers every UDP packet with itself, on loopback, until the
// test ends, and returns its address.
func UDPEchoServer(t testing.TB) string {
	t.Helper()
	uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1<<16)
		for {
			n, addr, err := uc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = uc.WriteToUDPAddrPort(buf[:n], addr)
		}
	}()
	t.Cleanup(func() { _ = uc.Close(); <-done })
	return uc.LocalAddr().String()
}

// ServeTCP runs handle for every connection to a new loopback listener until the test ends.
func ServeTCP(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ServeListener(t, ln, handle)
	return ln.Addr().String()
}

// ServeListener runs handle for every connection on ln until the test ends.
func ServeListener(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				defer func() {
					_ = c.Close()
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
				}()
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}
