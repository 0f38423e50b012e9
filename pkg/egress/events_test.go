package egress_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/internal/testutil/quictest"
	"github.com/quictun/quictun/pkg/egress"
	"github.com/quictun/quictun/pkg/endpoint"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/token"
	"github.com/quictun/quictun/pkg/tunnel"
)

// recorder is an egress.Events that keeps the events of streams, in order
// (UDP flows and the replay cache's size are left out).
type recorder struct {
	egress.NopEvents

	mu     sync.Mutex
	events []string
}

func (r *recorder) add(event string, args ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event+"("+strings.Join(args, ",")+")")
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func (r *recorder) TunnelOpened() { r.add("TunnelOpened") }
func (r *recorder) TunnelClosed(result string, up, down int64) {
	r.add("TunnelClosed", result, strconv.FormatInt(up, 10), strconv.FormatInt(down, 10))
}
func (r *recorder) StreamFailed(code string)        { r.add("StreamFailed", code) }
func (r *recorder) AuthFailed(reason string)        { r.add("AuthFailed", reason) }
func (r *recorder) DestinationRefused(n, rs string) { r.add("DestinationRefused", n, rs) }
func (r *recorder) ReplayUnrecorded(reason string)  { r.add("ReplayUnrecorded", reason) }
func (r *recorder) Dialed(time.Duration)            { r.add("Dialed") }

// TestEvents: what a Handler reports of a stream, by how it ends: a header
// made with a secret the server does not hold, a destination no rule
// allows, and a tunnel that carries its bytes.
func TestEvents(t *testing.T) {
	t.Parallel()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = echo.Close() })
	var echoes sync.WaitGroup
	t.Cleanup(echoes.Wait)
	echoes.Go(func() {
		c, err := echo.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		_, _ = c.Write(append(b, b...))
	})
	secret := []byte("the server's secret")

	for _, tc := range []struct {
		name, token string
		secret      []byte
		want        []string
	}{
		{"wrong secret", "tcp:" + echo.Addr().String(), []byte("another secret"),
			[]string{"AuthFailed(unknown_key)", "StreamFailed(auth_failed)"}},
		{"destination not allowed", "tcp:127.0.0.1:1", secret,
			[]string{"DestinationRefused(tcp,not_allowed)", "StreamFailed(refused)"}},
		{"tunnel", "tcp:" + echo.Addr().String(), secret,
			[]string{"Dialed()", "TunnelOpened()", "TunnelClosed(ok,4,8)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev := &recorder{}
			e := newHandler(t, secret, "tcp:"+echo.Addr().String(), ev)

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cli, srv := quictest.Pair(t)
			var served sync.WaitGroup
			served.Go(func() {
				s, err := srv.AcceptStream(ctx)
				if err != nil {
					return
				}
				e.Serve(ctx, egress.Stream{Conn: srv, Stream: s, Conn0: e.NewConn()})
			})
			str, err := cli.OpenStreamSync(ctx)
			require.NoError(t, err)
			h, err := proto.NewHeader(tc.token, time.Now())
			require.NoError(t, err)
			b, err := h.Append(nil, tc.secret)
			require.NoError(t, err)
			_, err = str.Write(append(b, "ping"...))
			require.NoError(t, err)
			require.NoError(t, str.Close())
			if err := proto.ReadReply(str); err == nil {
				got, err := io.ReadAll(str)
				require.NoError(t, err)
				assert.Equal(t, "pingping", string(got))
			}
			served.Wait()
			assert.Equal(t, tc.want, ev.got())
		})
	}
}

// newHandler returns a Handler with one shared secret, rules allow (an
// allow-list) and events ev, closed when the test ends.
func newHandler(t *testing.T, secret []byte, allow string, ev egress.Events) *egress.Handler {
	t.Helper()
	parser, err := token.NewParser(token.PluginCleartext, "")
	require.NoError(t, err)
	keys, err := proto.NewKeyring(proto.Key{Secret: secret})
	require.NoError(t, err)
	e, err := egress.New(egress.Config{
		Parser: parser, Keys: keys, Allow: endpoint.MustParseAllowList(allow),
		Events: ev, Registry: tunnel.NewRegistry(),
	})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	return e
}

// TestAuditReverseRequest: a reverse forward request the server refuses
// (here: it serves none, no Binder) is audited as a reverse one with the
// address the client asked for, never the wire token "bind/1/ID/LISTEN"
// nor as a forward tunnel (issue 33).
func TestAuditReverseRequest(t *testing.T) {
	t.Parallel()
	secret := []byte("the server's secret")
	parser, err := token.NewParser(token.PluginCleartext, "")
	require.NoError(t, err)
	keys, err := proto.NewKeyring(proto.Key{Secret: secret})
	require.NoError(t, err)
	e, err := egress.New(egress.Config{Parser: parser, Keys: keys, Allow: endpoint.MustParseAllowList("tcp:127.0.0.1:1"),
		AuditLog: true, Events: egress.NopEvents{}, Registry: tunnel.NewRegistry()})
	require.NoError(t, err)
	t.Cleanup(e.Close)

	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{})
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logger), 20*time.Second)
	defer cancel()
	cli, srv := quictest.Pair(t)
	var served sync.WaitGroup
	served.Go(func() {
		s, err := srv.AcceptStream(ctx)
		if err != nil {
			return
		}
		e.Serve(ctx, egress.Stream{Conn: srv, Stream: s, Conn0: e.NewConn()})
	})
	str, err := cli.OpenStreamSync(ctx)
	require.NoError(t, err)
	h, err := proto.NewBind(proto.Bind{ID: 0, Listen: "tcp:0.0.0.0:8022"}, time.Now())
	require.NoError(t, err)
	b, err := h.Append(nil, secret)
	require.NoError(t, err)
	_, err = str.Write(b)
	require.NoError(t, err)
	code, ok := proto.FromError(proto.ReadReply(str))
	require.True(t, ok)
	require.Equal(t, proto.CodeUnsupported, code)
	served.Wait()

	mu.Lock()
	defer mu.Unlock()
	var audit string
	for _, l := range lines {
		if strings.Contains(l, `"msg"="Closed tunnel"`) {
			audit = l
		}
	}
	require.NotEmpty(t, audit, "no audit line in %q", lines)
	assert.Contains(t, audit, `"direction"="reverse"`)
	assert.Contains(t, audit, `"listen"="tcp:0.0.0.0:8022"`)
	assert.Contains(t, audit, `"result"="unsupported"`)
	assert.NotContains(t, audit, "bind/1/")
}
