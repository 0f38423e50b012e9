package integration

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/ingress"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/resume"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/server"
)

// resumeSide is one daemon's resumable tunnels and their metrics.
type resumeSide struct {
	table   *resume.Table
	budget  *resume.Budget
	metrics *metrics.Resume
}

func newResumeSide(newMetrics func(prometheus.Registerer, func() int64) *metrics.Resume) *resumeSide {
	b := resume.NewBudget(64 << 20)
	return &resumeSide{table: resume.NewTable(), budget: b, metrics: newMetrics(prometheus.NewRegistry(), b.Used)}
}

func (r *resumeSide) egress(window time.Duration) *egress.Resume {
	return &egress.Resume{Settings: resume.Settings{Table: r.table, Window: func() time.Duration { return window }, Budget: r.budget, Events: r.metrics}}
}

func (r *resumeSide) ingress(window time.Duration) *ingress.Resume {
	return &ingress.Resume{Table: r.table, Window: func() time.Duration { return window }, Budget: r.budget, Events: r.metrics}
}

// shortIdle makes QUIC connections die after a second without packets.
func shortIdle(q *transport.QUICOptions) {
	q.IdleTimeout = time.Second
	q.KeepAlivePeriod = 300 * time.Millisecond
}

// resumable is a server and a client to it through a proxy whose link goes
// dark with dark (oneWay each way), both with resumable tunnels (a minute's
// window) on connections that die after a second without packets.
type resumable struct {
	srv, cli *resumeSide
	dark     atomic.Bool
	addr     string // the client's listening address, whose tunnels go to dest
}

func startResumable(t testing.TB, dest string, oneWay time.Duration) *resumable {
	t.Helper()
	r := &resumable{srv: newResumeSide(server.NewResumeMetrics), cli: newResumeSide(client.NewResumeMetrics)}
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + dest}, QUIC: shortIdle,
		Mutate: func(c *server.Config) { c.Resume = r.srv.egress(time.Minute) }})
	proxy := lossyProxy(t, srv, oneWay, &r.dark, nil)
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + dest, ServerAddr: proxy, WaitReady: true, QUIC: shortIdle,
		Mutate: func(c *client.Config) { c.Resume = r.cli.ingress(time.Minute) }})
	r.addr = cl.Addr
	return r
}

// gatedPeer writes part random bytes on c, waits for gate, writes part
// more and half-closes, while it reads everything c sends: got counts the
// bytes read; sent and recv are the SHA-256 of each direction once done.
type gatedPeer struct {
	got        atomic.Int64
	sent, recv chan [32]byte
	wg         sync.WaitGroup
}

func runGatedPeer(c net.Conn, part int, gate <-chan struct{}) *gatedPeer {
	p := &gatedPeer{sent: make(chan [32]byte, 1), recv: make(chan [32]byte, 1)}
	p.wg.Go(func() {
		h := sha256.New()
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			h.Write(buf[:n])
			p.got.Add(int64(n))
			if err != nil {
				break
			}
		}
		p.recv <- [32]byte(h.Sum(nil))
	})
	p.wg.Go(func() {
		h := sha256.New()
		chunk := make([]byte, 16<<10)
		write := func() {
			for left := part; left > 0; left -= len(chunk) {
				_, _ = rand.Read(chunk)
				h.Write(chunk)
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		}
		write()
		<-gate
		write()
		_ = c.(interface{ CloseWrite() error }).CloseWrite()
		p.sent <- [32]byte(h.Sum(nil))
	})
	return p
}

// serveGated serves the destination of gated transfers (runGatedPeer of
// part bytes, then the rest once gate is closed): it returns its address,
// the gate, and each connection's peer as it is accepted.
func serveGated(t *testing.T, part int) (dest string, gate chan struct{}, dests chan *gatedPeer) {
	t.Helper()
	gate, dests = make(chan struct{}), make(chan *gatedPeer, 1)
	dest = testutil.ServeTCP(t, func(c net.Conn) {
		p := runGatedPeer(c, part, gate)
		dests <- p
		p.wg.Wait()
	})
	t.Cleanup(func() { // a test that failed before opening it: the peers end
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	return dest, gate, dests
}

// startGated starts a gated transfer through the client listening at addr
// to serveGated's destination and waits until each end got its first part;
// it returns the application's peer and the destination's.
func startGated(t *testing.T, addr string, part int, gate chan struct{}, dests chan *gatedPeer) (app, far *gatedPeer) {
	t.Helper()
	app = runGatedPeer(dial(t, addr), part, gate)
	select {
	case far = <-dests:
	case <-time.After(30 * time.Second):
		t.Fatal("no tunnel reached the destination")
	}
	require.Eventually(t, func() bool { return app.got.Load() >= int64(part) && far.got.Load() >= int64(part) }, 60*time.Second, 10*time.Millisecond)
	return app, far
}

func hashOf(t *testing.T, ch chan [32]byte) [32]byte {
	t.Helper()
	select {
	case h := <-ch:
		return h
	case <-time.After(60 * time.Second):
		t.Fatal("transfer did not finish")
		return [32]byte{}
	}
}

// TestResumeAcrossLostConnection (issue 34 part 1): a tunnel moving data
// both ways survives a blackout longer than the idle timeout, which kills
// the QUIC connection on both ends: both park it, the client reconnects
// and re-attaches it, and every byte arrives once and in order (SHA-256
// both ways), including those the applications wrote during the outage.
func TestResumeAcrossLostConnection(t *testing.T) {
	t.Parallel()
	const part = 1 << 20
	dest, gate, dests := serveGated(t, part)
	r := startResumable(t, dest, 2*time.Millisecond)
	srvSide, cliSide := r.srv, r.cli
	app, far := startGated(t, r.addr, part, gate, dests)

	darkUntilParked(t, &r.dark, gate, srvSide, cliSide)
	checkGated(t, app, far, part, srvSide, cliSide)
	t.Logf("resent after the outage: client %.0f bytes, server %.0f bytes",
		promtest.ToFloat64(cliSide.metrics.Resent), promtest.ToFloat64(srvSide.metrics.Resent))
	require.Eventually(t, func() bool { return srvSide.table.Len() == 0 && cliSide.table.Len() == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return srvSide.budget.Used() == 0 && cliSide.budget.Used() == 0 }, 10*time.Second, 10*time.Millisecond,
		"ended tunnels give back their buffers")
}

// TestResumeWithoutWaitingForReply: when the server had confirmed every
// byte the client sent before the connection died, the client sends what
// its application wrote while the tunnel was parked right after its resume
// request, not a round trip later after the server's reply: counted as
// such, and every byte arrives once and in order (SHA-256 both ways).
func TestResumeWithoutWaitingForReply(t *testing.T) {
	t.Parallel()
	const part = 256 << 10
	dest, gate, dests := serveGated(t, part)
	r := startResumable(t, dest, 2*time.Millisecond)
	srvSide, cliSide := r.srv, r.cli
	app, far := startGated(t, r.addr, part, gate, dests)
	require.Eventually(t, func() bool { return cliSide.budget.Used() == 0 }, 30*time.Second, 10*time.Millisecond,
		"the server confirms every byte the client sent")

	// The application writes once the tunnel parked (as after a server's
	// close: bytes written into a link gone dark were sent, and may have
	// arrived, so the reply must tell).
	r.dark.Store(true)
	for _, s := range []*resumeSide{srvSide, cliSide} {
		require.Eventually(t, func() bool { return promtest.ToFloat64(s.metrics.Parked) == 1 }, 30*time.Second, 10*time.Millisecond)
	}
	close(gate)
	require.Eventually(t, func() bool { return cliSide.budget.Used() > 0 }, 30*time.Second, 10*time.Millisecond,
		"the client reads the application while parked")
	r.dark.Store(false)
	checkGated(t, app, far, part, srvSide, cliSide)
	assert.Equal(t, 1.0, promtest.ToFloat64(cliSide.metrics.ResumedNoWait), "the client did not wait for the reply")
	assert.Zero(t, promtest.ToFloat64(srvSide.metrics.ResumedNoWait), "the server answers, it does not request")
}

// TestResumeAheadBounded: at most 64 re-attachments on one connection go
// on without waiting for the server's reply (each starts its attachment
// during the new connection's handshake, whose CPU 1,000 of them took);
// the others wait for it, and every tunnel resumes.
func TestResumeAheadBounded(t *testing.T) {
	t.Parallel()
	const n = 70
	r := startResumable(t, testutil.EchoServer(t), time.Millisecond)
	srvSide, cliSide := r.srv, r.cli
	conns := make([]*net.TCPConn, n)
	for i := range conns {
		conns[i] = dial(t, r.addr)
		echoMsg(t, conns[i], "ping")
	}
	require.Eventually(t, func() bool { return cliSide.budget.Used() == 0 && srvSide.budget.Used() == 0 }, 30*time.Second, 10*time.Millisecond,
		"every byte confirmed")
	r.dark.Store(true)
	for _, s := range []*resumeSide{srvSide, cliSide} {
		require.Eventually(t, func() bool { return promtest.ToFloat64(s.metrics.Parked) == n }, 30*time.Second, 10*time.Millisecond)
	}
	r.dark.Store(false)
	for _, c := range conns {
		echoMsg(t, c, "pong")
	}
	require.Eventually(t, func() bool { return promtest.ToFloat64(cliSide.metrics.Resumed) == n }, 30*time.Second, 10*time.Millisecond)
	ahead := promtest.ToFloat64(cliSide.metrics.ResumedNoWait)
	assert.Positive(t, ahead)
	assert.LessOrEqual(t, ahead, 64.0, "at most 64 on the connection they re-attached on")
	assert.Equal(t, float64(n), promtest.ToFloat64(srvSide.metrics.Resumed))
}

// darkUntilParked darkens the link, opens the gate (the applications
// write on while it is dark), waits until both ends parked the tunnel and
// lights the link again.
func darkUntilParked(t *testing.T, dark *atomic.Bool, gate chan struct{}, sides ...*resumeSide) {
	t.Helper()
	dark.Store(true)
	close(gate)
	for _, s := range sides {
		require.Eventually(t, func() bool { return promtest.ToFloat64(s.metrics.Parked) == 1 }, 30*time.Second, 10*time.Millisecond,
			"both ends park the tunnel once their connection timed out")
	}
	dark.Store(false)
}

// checkGated checks a gated transfer of 2*part bytes each way that went
// through one outage: SHA-256 equal both ways, every byte counted once,
// resumed once on each side and given up by none.
func checkGated(t *testing.T, app, far *gatedPeer, part int, sides ...*resumeSide) {
	t.Helper()
	appSent, appRecv := hashOf(t, app.sent), hashOf(t, app.recv)
	farSent, farRecv := hashOf(t, far.sent), hashOf(t, far.recv)
	assert.Equal(t, appSent, farRecv, "application to destination")
	assert.Equal(t, farSent, appRecv, "destination to application")
	assert.Equal(t, int64(2*part), app.got.Load())
	assert.Equal(t, int64(2*part), far.got.Load())
	for _, s := range sides {
		assert.Equal(t, 1.0, promtest.ToFloat64(s.metrics.Resumed))
		for _, r := range resume.GaveUpReasons() {
			assert.Zero(t, promtest.ToFloat64(s.metrics.GaveUp.WithLabelValues(r)), r)
		}
	}
}

// openResumable opens a resumable tunnel to dest on c with secret (a
// fresh resume ID, returned) and waits for the server's OK.
func openResumable(t *testing.T, c *quic.Conn, dest string, secret []byte) (resume.ID, *quic.Stream) {
	t.Helper()
	id, err := resume.NewID()
	require.NoError(t, err)
	h, err := proto.NewHeader(dest, time.Now())
	require.NoError(t, err)
	h.ResumeID, h.HasResumeID = id, true
	b, err := h.Append(nil, secret)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	str, err := c.OpenStreamSync(ctx)
	require.NoError(t, err)
	_, err = str.Write(b)
	require.NoError(t, err)
	require.NoError(t, proto.ReadReply(str))
	return id, str
}

// resumeHeader encodes a resume request for id (the client received
// offset bytes) with secret.
func resumeHeader(t *testing.T, id resume.ID, offset uint64, secret []byte) []byte {
	t.Helper()
	h, err := proto.NewHeader(resume.Request{ID: id, Offset: offset}.Token(), time.Now())
	require.NoError(t, err)
	h.Kind = proto.KindResume
	b, err := h.Append(nil, secret)
	require.NoError(t, err)
	return b
}

// signedHeaderKind encodes a header of kind with token and secret.
func signedHeaderKind(t *testing.T, token string, kind proto.Kind, secret []byte) []byte {
	t.Helper()
	h, err := proto.NewHeader(token, time.Now())
	require.NoError(t, err)
	h.Kind = kind
	b, err := h.Append(nil, secret)
	require.NoError(t, err)
	return b
}

// sendResume sends a resume request on a new stream of c: the server's
// offset and the stream (to carry the tunnel on), or the code it was
// refused with.
func sendResume(t *testing.T, c *quic.Conn, b []byte) (uint64, *quic.Stream, proto.Code) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	str, err := c.OpenStreamSync(ctx)
	require.NoError(t, err)
	_, err = str.Write(b)
	require.NoError(t, err)
	_ = str.SetReadDeadline(time.Now().Add(10 * time.Second))
	off, err := resume.ReadReply(str)
	_ = str.SetReadDeadline(time.Time{})
	if err == nil {
		return off, str, proto.CodeOK
	}
	str.CancelRead(0)
	str.CancelWrite(0)
	code, ok := proto.FromError(err)
	require.True(t, ok, "want a reply or a reset with a code, got %v", err)
	return 0, nil, code
}

// echoRoundTrip writes msg on str and reads it back.
func echoRoundTrip(t *testing.T, str *quic.Stream, msg string) {
	t.Helper()
	_, err := str.Write([]byte(msg))
	require.NoError(t, err)
	_ = str.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(msg))
	_, err = io.ReadFull(str, got)
	require.NoError(t, err)
	assert.Equal(t, msg, string(got))
}

// TestResumeRefused (issue 34 part 1): re-attaching is bound to the
// identity that opened the tunnel. A resume request made with another
// key, for an ID the server does not hold, or replayed, is refused with
// resume_refused (replay: replay), counted by reason, and holds nothing
// (the server keeps only the real tunnel, which still works); the owner's
// request continues the tunnel on its new stream with the right offset.
func TestResumeRefused(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	alice, bob := testutil.Secret, []byte("bob-secret-0123456789abcdef01234")
	side := newResumeSide(server.NewResumeMetrics)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		keys, err := proto.NewKeyring(proto.Key{Name: "alice", Secret: alice}, proto.Key{Name: "bob", Secret: bob})
		require.NoError(t, err)
		c.Keys = keys
		c.Resume = side.egress(time.Minute)
	}})
	id, first := openResumable(t, attackerConn(t, srv), "tcp:"+echo, alice)
	echoRoundTrip(t, first, "ping")
	require.Equal(t, 1, side.table.Len())

	other := attackerConn(t, srv)
	unknown, err := resume.NewID()
	require.NoError(t, err)
	replayed := resumeHeader(t, unknown, 0, alice)
	for _, tc := range []struct {
		name   string
		header []byte
		code   proto.Code
		reason string
	}{
		{"another identity's key", resumeHeader(t, id, 4, bob), proto.CodeResumeRefused, resume.RefusedIdentity},
		{"an ID not held", replayed, proto.CodeResumeRefused, resume.RefusedUnknown},
		{"a request replayed", replayed, proto.CodeReplay, ""},
		{"a malformed request", signedHeaderKind(t, "resume/1/"+id.String(), proto.KindResume, alice), proto.CodeResumeRefused, resume.RefusedBadRequest},
	} {
		_, _, code := sendResume(t, other, tc.header)
		assert.Equal(t, tc.code, code, tc.name)
		if tc.reason != "" {
			assert.Equal(t, 1.0, promtest.ToFloat64(side.metrics.Refused.WithLabelValues(tc.reason)), tc.name)
		}
	}
	assert.Equal(t, 1, side.table.Len(), "refused requests hold nothing")
	echoRoundTrip(t, first, "still mine")

	// The owner re-attaches from another connection while the first still
	// runs (a client that moved): the server received 4+10 bytes, and the
	// tunnel goes on on the new stream; the old one is reset.
	third := attackerConn(t, srv)
	off, str, code := sendResume(t, third, resumeHeader(t, id, 14, alice))
	require.Equal(t, proto.CodeOK, code)
	assert.Equal(t, uint64(14), off)
	echoRoundTrip(t, str, "pong")
	_ = first.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = first.Read(make([]byte, 1))
	require.Error(t, err, "the old stream no longer carries the tunnel")
	assert.Equal(t, 1.0, promtest.ToFloat64(side.metrics.Resumed))
	require.NoError(t, str.Close())
	_, err = io.ReadAll(str)
	require.NoError(t, err, "the echo's FIN ends both directions")
	assert.Equal(t, 1, side.table.Len(), "the server keeps the tunnel until we confirm its last bytes")
	ack, _ := resume.AppendAcks(nil, []resume.Ack{{ID: id, Offset: 4 + 10 + 4}})
	require.NoError(t, third.SendDatagram(ack))
	require.Eventually(t, func() bool { return side.table.Len() == 0 }, 10*time.Second, 10*time.Millisecond)
}

// TestResumeRefusedAfterServerGaveUp: when the server no longer holds the
// tunnel (its shorter window passed during the outage; after a restart
// too), the client's re-attachment is refused: the client gives up at once
// (refused) and resets the application's connection, as without
// resumption, and both ends give their buffers back.
func TestResumeRefusedAfterServerGaveUp(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	srvSide := newResumeSide(server.NewResumeMetrics)
	cliSide := newResumeSide(client.NewResumeMetrics)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, QUIC: shortIdle,
		Mutate: func(c *server.Config) { c.Resume = srvSide.egress(200 * time.Millisecond) }})
	var dark atomic.Bool
	proxy := lossyProxy(t, srv, time.Millisecond, &dark, nil)
	cl := testutil.StartClient(t, srv, testutil.ClientOptions{Token: "tcp:" + echo, ServerAddr: proxy, WaitReady: true, QUIC: shortIdle,
		Mutate: func(c *client.Config) { c.Resume = cliSide.ingress(time.Minute) }})
	c := dial(t, cl.Addr)
	_, err := c.Write([]byte("ping"))
	require.NoError(t, err)
	_, err = io.ReadFull(c, make([]byte, 4))
	require.NoError(t, err)

	dark.Store(true)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(srvSide.metrics.GaveUp.WithLabelValues(resume.GaveUpWindow)) == 1
	},
		30*time.Second, 10*time.Millisecond, "the server gives up after its window")
	require.Eventually(t, func() bool { return promtest.ToFloat64(cliSide.metrics.Parked) == 1 }, 30*time.Second, 10*time.Millisecond)
	dark.Store(false)
	require.Eventually(t, func() bool {
		return promtest.ToFloat64(cliSide.metrics.GaveUp.WithLabelValues(resume.GaveUpRefused)) == 1
	},
		30*time.Second, 10*time.Millisecond, "the client learns it at its re-attachment")
	assert.Equal(t, 1.0, promtest.ToFloat64(srvSide.metrics.Refused.WithLabelValues(resume.RefusedUnknown)))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, syscall.ECONNRESET)
	require.Eventually(t, func() bool { return srvSide.budget.Used() == 0 && cliSide.budget.Used() == 0 }, 10*time.Second, 10*time.Millisecond)
	// The client's tunnel leaves its table once its handler returns, after
	// the buffer and the metrics: a moment after what the test saw above.
	require.Eventually(t, func() bool { return srvSide.table.Len()+cliSide.table.Len() == 0 }, 10*time.Second, 10*time.Millisecond,
		"neither end holds the tunnel")
}

// TestResumeMaxTunnels: past Resume.Max the server opens plain tunnels (not
// held when their connection dies) instead of refusing them.
func TestResumeMaxTunnels(t *testing.T) {
	t.Parallel()
	echo := testutil.EchoServer(t)
	side := newResumeSide(server.NewResumeMetrics)
	srv := testutil.StartServer(t, testutil.ServerOptions{Allow: []string{"tcp:" + echo}, Mutate: func(c *server.Config) {
		c.Resume = side.egress(time.Minute)
		c.Resume.Max = 1
	}})
	c := attackerConn(t, srv)
	for i := range 2 {
		id, err := resume.NewID()
		require.NoError(t, err)
		h, err := proto.NewHeader("tcp:"+echo, time.Now())
		require.NoError(t, err)
		h.ResumeID, h.HasResumeID = id, true
		b, err := h.Append(nil, testutil.Secret)
		require.NoError(t, err)
		str, err := c.OpenStream()
		require.NoError(t, err)
		_, err = str.Write(b)
		require.NoError(t, err)
		require.NoError(t, proto.ReadReply(str))
		echoRoundTrip(t, str, "tunnel")
		assert.Equal(t, 1, side.table.Len(), "tunnel %d", i)
	}
	assert.Equal(t, 2, srv.Server.Registry().Len(), "both tunnels run")
}

// TestResumeAttemptsHoldNothing: resume requests for tunnels the server
// does not hold, authenticated or not, leave no state behind: 1,000 with
// the secret on one connection (each refused as unknown), and 20 without
// it (each closes its connection, auth_failed, as any header would).
func TestResumeAttemptsHoldNothing(t *testing.T) {
	t.Parallel()
	side := newResumeSide(server.NewResumeMetrics)
	srv := testutil.StartServer(t, testutil.ServerOptions{Mutate: func(c *server.Config) {
		c.Resume = side.egress(time.Minute)
		c.MaxReplayEntriesPerConn = 1 << 16
	}})
	n := 1000
	if testing.Short() {
		n = 100
	}
	c := attackerConn(t, srv)
	for i := range n {
		id, err := resume.NewID()
		require.NoError(t, err)
		_, _, code := sendResume(t, c, resumeHeader(t, id, uint64(i), testutil.Secret))
		require.Equal(t, proto.CodeResumeRefused, code)
	}
	assert.Equal(t, float64(n), promtest.ToFloat64(side.metrics.Refused.WithLabelValues(resume.RefusedUnknown)))
	for range 20 {
		id, err := resume.NewID()
		require.NoError(t, err)
		_, _, code := sendResume(t, attackerConn(t, srv), resumeHeader(t, id, 0, []byte("not-the-secret-0123456789abcdef0")))
		require.Equal(t, proto.CodeAuthFailed, code)
	}
	assert.Zero(t, side.table.Len())
	assert.Zero(t, side.budget.Used())
	assert.Zero(t, srv.Server.Registry().Len())
}

// TestResumeReattachesToItsServer (issue 34, several servers): a resumable
// tunnel re-attaches only to the server it was opened on, which holds its
// far end. Failover mode over two servers: the active one goes dark with
// a tunnel moving data both ways; the client fails over (new tunnels go to
// the standby) while the tunnel waits for its server instead of asking the
// standby, which would refuse it and reset it; the first server comes
// back, the tunnel resumes there, every byte arrives once and in order
// (SHA-256 both ways) and the standby was never asked.
func TestResumeReattachesToItsServer(t *testing.T) {
	t.Parallel()
	const part = 256 << 10
	dest, gate, dests := serveGated(t, part)
	echo := testutil.EchoServer(t)
	state := t.TempDir()
	var sides [2]*resumeSide
	var addrs []string
	var dark [2]atomic.Bool
	var first *testutil.Server // both share the state dir: one certificate
	for i := range sides {
		sides[i] = newResumeSide(server.NewResumeMetrics)
		srv := testutil.StartServer(t, testutil.ServerOptions{StateDir: state, Allow: []string{"tcp:" + dest, "tcp:" + echo}, QUIC: shortIdle,
			Mutate: func(c *server.Config) { c.Resume = sides[i].egress(time.Minute) }})
		addrs = append(addrs, lossyProxy(t, srv, time.Millisecond, &dark[i], nil))
		if first == nil {
			first = srv
		}
	}
	cliSide := newResumeSide(client.NewResumeMetrics)
	cl := testutil.StartClient(t, first, testutil.ClientOptions{Token: "tcp:" + dest, ServerAddr: addrs[0], WaitReady: true, QUIC: shortIdle,
		Mutate: func(c *client.Config) {
			c.Servers, c.Mode, c.Resume = addrs, client.ModeFailover, cliSide.ingress(time.Minute)
			c.Backoff.Max = 300 * time.Millisecond
		}})
	require.Eventually(t, func() bool { return healthy(cl) == 2 }, 20*time.Second, 10*time.Millisecond, "both servers connected")
	app, far := startGated(t, cl.Addr, part, gate, dests)
	require.Equal(t, 1, sides[0].table.Len(), "the tunnel is on the first server")

	dark[0].Store(true)
	close(gate) // the applications write on while their server is dark
	require.Eventually(t, func() bool { return promtest.ToFloat64(cliSide.metrics.Parked) == 1 }, 30*time.Second, 10*time.Millisecond,
		"the client parks the tunnel once its connection is lost")
	require.Eventually(t, func() bool { return cl.Switches() == 1 }, 30*time.Second, 10*time.Millisecond, "the client failed over")
	time.Sleep(2 * time.Second) // the tunnel's re-attach attempts run meanwhile: none may reach the standby
	dark[0].Store(false)

	appSent, appRecv := hashOf(t, app.sent), hashOf(t, app.recv)
	farSent, farRecv := hashOf(t, far.sent), hashOf(t, far.recv)
	assert.Equal(t, appSent, farRecv, "application to destination")
	assert.Equal(t, farSent, appRecv, "destination to application")
	assert.Equal(t, 1.0, promtest.ToFloat64(sides[0].metrics.Resumed), "resumed on its server")
	for _, r := range resume.RefusedReasons() {
		assert.Zero(t, promtest.ToFloat64(sides[1].metrics.Refused.WithLabelValues(r)), "the standby was never asked (%s)", r)
	}
	for _, r := range resume.GaveUpReasons() {
		assert.Zero(t, promtest.ToFloat64(cliSide.metrics.GaveUp.WithLabelValues(r)), r)
	}
}
