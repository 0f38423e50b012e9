package testutil

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Execute runs cmd with args (bounded by 10 s) and returns what it printed.
func Execute(t testing.TB, cmd *cobra.Command, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// ClearEnv unsets every environment variable starting with prefix+"_" for
// the test (restored afterwards). Not for parallel tests (t.Setenv).
func ClearEnv(t *testing.T, prefix string) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, prefix+"_") {
			t.Setenv(k, "")
			require.NoError(t, os.Unsetenv(k))
		}
	}
}

// WriteFile writes content (mode 0600) to a new file name in a temp dir of
// the test and returns its path.
func WriteFile(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// FreeAddr returns a loopback address, "127.0.0.1:PORT", that was free on
// network ("tcp" or "udp") a moment ago: the caller binds it (or hands it to
// a daemon) itself. The port is drawn below Linux's ephemeral range
// (32768-60999), which the kernel never hands to a bind of port 0 or to an
// outgoing connection, so that no other test's listener or dial takes it in
// between (as one did under make test's load, and a reverse forward's test
// then dialed another test's listener), and no port is handed out twice on
// the machine while the test binary that drew it runs (reservePort: go test
// runs several packages' binaries at once).
func FreeAddr(t testing.TB, network string) string {
	t.Helper()
	freeMu.Lock()
	defer freeMu.Unlock()
	for range 200 {
		port := freeLow + rand.IntN(freeHigh-freeLow)
		if freeGiven[port] {
			continue
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		if bindable(network, addr) && reservePort(port) {
			freeGiven[port] = true
			return addr
		}
	}
	return anyFreeAddr(t, network) // a crowded range: the kernel's choice
}

// The range FreeAddr draws from, and the ports it handed out.
const freeLow, freeHigh = 20000, 32768

var (
	freeMu    sync.Mutex
	freeGiven = map[int]bool{}
)

// bindable reports whether addr can be bound on network now.
func bindable(network, addr string) bool {
	if network == "udp" {
		c, err := net.ListenPacket("udp", addr)
		if err != nil {
			return false
		}
		return c.Close() == nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	return l.Close() == nil
}

// anyFreeAddr is a port the kernel picks (from the ephemeral range).
func anyFreeAddr(t testing.TB, network string) string {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		require.NoError(t, err)
		defer func() { _ = c.Close() }()
		return c.LocalAddr().String()
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// FreePort is the port of FreeAddr.
func FreePort(t testing.TB, network string) int {
	t.Helper()
	ap, err := netip.ParseAddrPort(FreeAddr(t, network))
	require.NoError(t, err)
	return int(ap.Port())
}

// RequireFree fails the test unless every address can be bound again on
// network ("tcp" or "udp"): nothing leaked a listener on it.
func RequireFree(t testing.TB, network string, addrs ...string) {
	t.Helper()
	for _, addr := range addrs {
		if network == "udp" {
			pc, err := net.ListenPacket("udp", addr)
			require.NoError(t, err, "udp %s leaked", addr)
			require.NoError(t, pc.Close())
			continue
		}
		ln, err := net.Listen("tcp", addr)
		require.NoError(t, err, "%s leaked", addr)
		require.NoError(t, ln.Close())
	}
}

// RequireErrorContains checks a table case's error: none when want is
// empty, else an error containing every string of want.
func RequireErrorContains(t testing.TB, err error, want []string) {
	t.Helper()
	if len(want) == 0 {
		require.NoError(t, err)
		return
	}
	require.Error(t, err)
	for _, s := range want {
		assert.Contains(t, err.Error(), s)
	}
}

// Command is a daemon's root command running in-process (StartCommand),
// with a client for its admin server.
type Command struct {
	admin  string
	cancel context.CancelFunc
	done   chan error
	tr     *http.Transport
	hc     *http.Client
}

// StartCommand runs cmd with args in the background until Stop; admin is
// the address its --httpd-listen-on names.
func StartCommand(t testing.TB, cmd *cobra.Command, admin string, args ...string) *Command {
	t.Helper()
	cmd.SetOut(io.Discard)
	cmd.SetArgs(args)
	ctx, cancel := context.WithCancel(context.Background())
	tr := &http.Transport{}
	c := &Command{admin: admin, cancel: cancel, done: make(chan error, 1), tr: tr, hc: &http.Client{Transport: tr, Timeout: 5 * time.Second}}
	go func() { c.done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		tr.CloseIdleConnections()
	})
	return c
}

// Get fetches path from the admin server: the status code (0 when the
// request failed) and the body (or the error).
func (c *Command) Get(path string) (int, string) {
	resp, err := c.hc.Get("http://" + c.admin + path)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// WaitStatus waits until path answers code, failing the test if the command
// ended first or 15 s passed.
func (c *Command) WaitStatus(t testing.TB, path string, code int) {
	t.Helper()
	var ended bool
	var runErr error
	require.Eventually(t, func() bool {
		select {
		case runErr = <-c.done:
			ended = true
			return true
		default:
		}
		got, _ := c.Get(path)
		return got == code
	}, 15*time.Second, 20*time.Millisecond, "%s never answered %d", path, code)
	if ended {
		t.Fatalf("the command ended early: %v", runErr)
	}
}

// RequireMetrics fetches /metrics and checks that it holds every name and
// passes promlint.
func (c *Command) RequireMetrics(t testing.TB, names ...string) {
	t.Helper()
	code, body := c.Get("/metrics")
	require.Equal(t, http.StatusOK, code, body)
	for _, name := range names {
		assert.Contains(t, body, name)
	}
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// Stop cancels the command's context and requires it to return nil within 15 s.
func (c *Command) Stop(t testing.TB) {
	t.Helper()
	c.cancel()
	select {
	case err := <-c.done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("the command did not return after its context was cancelled")
	}
}
