package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/tools/linkem/netns"
)

// Addresses of the two-namespace topology of the migration tests: the client
// host starts on clientOldIP and is renumbered to clientNewIP.
const (
	clientOldIP = "10.77.0.1"
	clientNewIP = "10.77.0.11"
	serverNSIP  = "10.77.0.2"
)

// requireNetns skips unless this process may create network namespaces.
func requireNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: the ip command (iproute2) is missing")
	}
}

var nsSeq atomic.Int32

// nsPair is a client and a server namespace joined by a veth pair (eth0 in
// each). The client has clientOldIP/32 and a host route to the server with
// that source; the server has serverNSIP/24, so it reaches any client address
// in 10.77.0.0/24 on the link.
type nsPair struct {
	client, server string
	serverIP       string // the server's address the client dials
}

// ipCmd runs ip with args (bounded) and fails the test on error.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
}

// newNSPair creates the namespaces joined by one veth pair (newNamespaces).
func newNSPair(t *testing.T) *nsPair {
	t.Helper()
	p := newNamespaces(t, serverNSIP)
	ipCmd(t, "-n", p.client, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", p.server)
	for _, ns := range []string{p.client, p.server} {
		ipCmd(t, "-n", ns, "link", "set", "eth0", "up")
	}
	ipCmd(t, "-n", p.client, "addr", "add", clientOldIP+"/32", "dev", "eth0")
	ipCmd(t, "-n", p.client, "route", "add", serverNSIP+"/32", "dev", "eth0", "src", clientOldIP)
	ipCmd(t, "-n", p.server, "addr", "add", serverNSIP+"/24", "dev", "eth0")
	return p
}

// newNamespaces creates a client and a server namespace (prefix mg) with
// loopback up and no links between them, and deletes them when the test ends,
// after the processes in them were killed: call it before starting any.
func newNamespaces(t *testing.T, serverIP string) *nsPair {
	t.Helper()
	prefix := fmt.Sprintf("mg%dn%d", os.Getpid(), nsSeq.Add(1))
	p := &nsPair{client: prefix + "-c", server: prefix + "-s", serverIP: serverIP}
	t.Cleanup(func() {
		for _, ns := range []string{p.client, p.server} {
			if netns.Exists(ns) {
				if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
					t.Errorf("ip netns del %s: %v: %s", ns, err, out)
				}
			}
		}
	})
	ipCmd(t, "netns", "add", p.client)
	ipCmd(t, "netns", "add", p.server)
	for _, ns := range []string{p.client, p.server} {
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	return p
}

// dialIn connects to addr from inside namespace ns.
func dialIn(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := netns.Do(ns, func() error {
		var err error
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// nsHTTP is an HTTP client whose connections are made inside ns.
func nsHTTP(ns string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialIn(ctx, ns, network, addr)
		},
	}}
}

// nsScrape fetches and parses /metrics at url from inside ns.
func nsScrape(t *testing.T, ns, url string) metrics {
	t.Helper()
	resp, err := nsHTTP(ns).Get(url + "/metrics")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET /metrics: %s", body)
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err, "parse /metrics")
	return metrics{raw: string(body), families: fams}
}

// startInNS starts bin inside ns through `ip netns exec`, which execs it, so
// the process is the daemon itself and the harness's cleanup kills it.
func startInNS(t *testing.T, ns, name, bin string, args ...string) *proc {
	t.Helper()
	return startProc(t, name, nil, "ip", append([]string{"netns", "exec", ns, bin}, args...)...)
}

// waitNSReady polls GET url/readyz from inside ns until it answers 200.
func waitNSReady(t *testing.T, p *proc, ns, url string) {
	t.Helper()
	waitFor(t, startTimeout, p.name+" ready", func() bool {
		if p.exited() {
			t.Fatalf("%s exited before becoming ready:\n%s", p.name, p.log())
		}
		resp, err := nsHTTP(ns).Get(url + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// nsTunnel is quictun-server in the server namespace in front of an echo
// server, and quictun-client in the client namespace, connected.
type nsTunnel struct {
	ns                    *nsPair
	server, client        *proc
	serverURL, clientURL  string
	clientListen          string // the client's local listener, inside the client namespace
	serverUDP, echoServer string
}

func startNSTunnel(t *testing.T, ns *nsPair, clientArgs ...string) *nsTunnel {
	t.Helper()
	return startNSTunnelTo(t, ns, echoConn, clientArgs...)
}

// serveInNS listens on a loopback TCP port inside network namespace ns and
// serves each connection with handle until the test ends; it returns the
// listener's address.
func serveInNS(t *testing.T, ns string, handle func(net.Conn)) string {
	t.Helper()
	var ln net.Listener
	require.NoError(t, netns.Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}))
	testutil.ServeListener(t, ln, handle)
	return ln.Addr().String()
}

// echoConn echoes what c sends, then half-closes it.
func echoConn(c net.Conn) {
	_, _ = io.Copy(c, c)
	_ = c.(*net.TCPConn).CloseWrite()
}

// startNSTunnelTo is startNSTunnel with handle serving the destination's
// connections instead of an echo.
func startNSTunnelTo(t *testing.T, ns *nsPair, handle func(net.Conn), clientArgs ...string) *nsTunnel {
	t.Helper()
	tn := &nsTunnel{ns: ns, serverURL: "http://127.0.0.1:8086", clientURL: "http://127.0.0.1:8087",
		clientListen: "127.0.0.1:6500", serverUDP: ns.serverIP + ":7500", echoServer: serveInNS(t, ns.server, handle)}
	state, secret := filepath.Join(t.TempDir(), "state"), newSecretFile(t)
	fp := strings.TrimSpace(run(t, nil, bins.server, "fingerprint", "--state-dir", state).stdout)
	tn.server = startInNS(t, ns.server, "quictun-server", bins.server, "--listen-on", tn.serverUDP,
		"--state-dir", state, "--secret-file", secret, "--httpd-listen-on", "127.0.0.1:8086",
		"--allow", "tcp:"+tn.echoServer, "-v", "2")
	waitNSReady(t, tn.server, ns.server, tn.serverURL)
	tn.client = startInNS(t, ns.client, "quictun-client", bins.client, append([]string{
		"--listen-on", "tcp:" + tn.clientListen, "--server-endpoint", tn.serverUDP, "--server-fingerprint", fp,
		"--token-source", "tcp:" + tn.echoServer, "--secret-file", secret, "--httpd-listen-on", "127.0.0.1:8087", "-v", "2",
	}, clientArgs...)...)
	waitNSReady(t, tn.client, ns.client, tn.clientURL)
	return tn
}

// startNSWorkload runs testutil.Workload from the client namespace through
// the tunnel: pingPongs ping-pong connections and a bulk transfer that runs
// until Finish, and waits for it to get going.
func startNSWorkload(t *testing.T, tn *nsTunnel, pingPongs int) *testutil.Workload {
	t.Helper()
	w := testutil.StartWorkload(t, func() testutil.HalfCloser {
		c, err := dialIn(context.Background(), tn.ns.client, "tcp", tn.clientListen)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		require.NoError(t, c.SetDeadline(time.Now().Add(45*time.Second)))
		return c.(*net.TCPConn)
	}, pingPongs, -1)
	w.Warm(t, 4<<20, 20*time.Second)
	return w
}

// TestRenumberClient: the client host's address changes while tunneled
// connections run (ping-pong and a bulk transfer); they must carry on with
// verified data, with no reconnect of the client's QUIC connection. The
// server sees the client's packets come from the new address and migrates
// the connection (path validation). The stall is measured and logged. The
// last case keeps the address: for 300 ms the route to the server is a
// blackhole route (a VPN's kill switch, a routing daemon between two routes),
// where sendmsg fails with EINVAL, which the client counts as loss
// (client/senderr_other.go) rather than ending the connection.
func TestRenumberClient(t *testing.T) {
	requireNetns(t)
	for _, tc := range []struct {
		name string
		// renumber changes the client namespace's address and returns when
		// packets could leave from the new one.
		renumber func(t *testing.T, ns string) (up time.Time)
	}{
		{"make-before-break", func(t *testing.T, ns string) time.Time {
			// Add the new address, move the route's source to it, delete the old one.
			ipCmd(t, "-n", ns, "addr", "add", clientNewIP+"/32", "dev", "eth0")
			ipCmd(t, "-n", ns, "route", "replace", serverNSIP+"/32", "dev", "eth0", "src", clientNewIP)
			up := time.Now()
			ipCmd(t, "-n", ns, "addr", "del", clientOldIP+"/32", "dev", "eth0")
			return up
		}},
		{"break-before-make", func(t *testing.T, ns string) time.Time {
			// Delete the old address (the kernel drops the route with it), then
			// 300 ms later add the new one and the route: a DHCP-style change of
			// the interface's address. Meanwhile sends fail (network unreachable).
			ipCmd(t, "-n", ns, "addr", "del", clientOldIP+"/32", "dev", "eth0")
			time.Sleep(300 * time.Millisecond)
			ipCmd(t, "-n", ns, "addr", "add", clientNewIP+"/32", "dev", "eth0")
			ipCmd(t, "-n", ns, "route", "add", serverNSIP+"/32", "dev", "eth0", "src", clientNewIP)
			return time.Now()
		}},
		{"blackhole-route", func(t *testing.T, ns string) time.Time {
			ipCmd(t, "-n", ns, "route", "replace", "blackhole", serverNSIP+"/32")
			time.Sleep(300 * time.Millisecond)
			ipCmd(t, "-n", ns, "route", "replace", serverNSIP+"/32", "dev", "eth0", "src", clientOldIP)
			return time.Now()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkLeaks(t)
			ns := newNSPair(t)
			tn := startNSTunnel(t, ns)
			w := startNSWorkload(t, tn, 4)
			at := time.Now()
			up := tc.renumber(t, ns.client)
			time.Sleep(3 * time.Second) // let the workload run on the new address
			w.Finish(t, 20*time.Second)
			stall, fresh := w.Report(t, "renumbering", at, 10*time.Second)
			cm := nsScrape(t, ns.client, tn.clientURL)
			sm := nsScrape(t, ns.server, tn.serverURL)
			t.Logf("renumbering (%s, new address usable %v after the start): stall %v, first round trip begun after the start done %v after it; client: reconnects %v, dials ok %v, rescues switched %v recovered %v error %v, path switches route_changed %v address_removed %v; server: active connections %v",
				tc.name, up.Sub(at).Round(time.Millisecond), stall.Round(100*time.Microsecond), fresh.Round(100*time.Microsecond),
				cm.val("quictun_client_reconnects_total"), cm.val("quictun_client_dials_total", "result", "ok"),
				cm.val("quictun_client_path_rescues_total", "result", "switched"), cm.val("quictun_client_path_rescues_total", "result", "recovered"),
				cm.val("quictun_client_path_rescues_total", "result", "error"),
				cm.val("quictun_client_path_switches_total", "reason", "route_changed"), cm.val("quictun_client_path_switches_total", "reason", "address_removed"),
				sm.val("quictun_server_active_connections"))
			assert.Zero(t, cm.val("quictun_client_reconnects_total"), "client reconnects")
			assert.Equal(t, 1.0, cm.val("quictun_client_dials_total", "result", "ok")+cm.val("quictun_client_dials_total", "result", "ok_0rtt"), "client dials")
			assert.Equal(t, 1.0, sm.val("quictun_server_active_connections"), "server's live QUIC connections")
			for _, r := range []string{"closed", "idle_timeout", "auth_failed", "shutdown", "error"} {
				assert.Zero(t, sm.val("quictun_server_connections_total", "result", r), "server connections ended (%s)", r)
			}
			assert.Less(t, stall, 5*time.Second, "stall after the renumbering")
		})
	}
}
