package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/socks5"
)

// needTool returns the path of name, or skips the test naming the Debian
// package; with QUICTUN_E2E_REQUIRE_TOOLS set (.ci/run, which installs
// them) a missing tool fails the test instead.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("QUICTUN_E2E_REQUIRE_TOOLS") != "" { // .ci/run installs them
			t.Fatalf("%s not installed (apt-get install %s); QUICTUN_E2E_REQUIRE_TOOLS is set, so this is a failure, not a skip", name, pkg)
		}
		t.Skipf("%s not installed (apt-get install %s)", name, pkg)
	}
	return p
}

// startDNSMasq starts dnsmasq on a free loopback UDP port, answering name
// with the IPv4 address ip (plus whatever extra options say), and returns
// once dig gets that answer from it directly. A port taken by another
// process between testutil.FreePort and dnsmasq's bind (the whole suite runs beside
// this test) makes dnsmasq exit: it is retried on a new port. If dnsmasq
// never answers, the failure carries its log.
func startDNSMasq(t *testing.T, dig, name, ip string, extra ...string) (*proc, netip.AddrPort) {
	t.Helper()
	dnsmasq := needTool(t, "dnsmasq", "dnsmasq-base")
	for attempt := 1; ; attempt++ {
		addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(testutil.FreePort(t, "udp")))
		args := append([]string{"--keep-in-foreground", "--no-daemon", "--no-resolv", "--no-hosts",
			"--bind-interfaces", "--listen-address=127.0.0.1", "--port=" + strconv.Itoa(int(addr.Port())),
			"--user=root", "--pid-file=", "--address=/" + name + "/" + ip}, extra...)
		p := startProc(t, "dnsmasq", nil, dnsmasq, args...)
		deadline := time.Now().Add(15 * time.Second)
		for {
			out, err := exec.Command(dig, "@127.0.0.1", "-p", strconv.Itoa(int(addr.Port())),
				"+time=1", "+tries=1", "+short", name).CombinedOutput()
			if err == nil && strings.TrimSpace(string(out)) == ip {
				return p, addr
			}
			if p.exited() {
				if attempt < 3 {
					t.Logf("dnsmasq exited at start (attempt %d), trying another port:\n%s", attempt, p.log())
					break
				}
				t.Fatalf("dnsmasq exited at start %d times; last log:\n%s", attempt, p.log())
			}
			if time.Now().After(deadline) {
				t.Fatalf("dnsmasq on %s did not answer %s within 15s (last dig: %v %q); its log:\n%s",
					addr, name, err, out, p.log())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestUDPDig (issue 12): dig asks a dnsmasq server through the built binaries'
// udp forward and gets its answers: a short one (QUIC datagrams) and a TXT
// record of ~3 KB (EDNS), larger than a datagram, so carried on the flow's
// stream. A forward to a udp destination the server does not allow gets no
// answer, and the server counts the refusal.
func TestUDPDig(t *testing.T) {
	checkLeaks(t)
	dig := needTool(t, "dig", "bind9-dnsutils")
	big := strings.Repeat("quictun-", 30) // 240 bytes per string, 12 strings
	txt := "--txt-record=big.test"
	for range 12 {
		txt += `,"` + big + `"`
	}
	dns, dnsAddrPort := startDNSMasq(t, dig, "svc.test", "192.0.2.7", "--edns-packet-max=4096", txt)
	dnsAddr := dnsAddrPort.String()

	srv := startServer(t, serverOpts{Allow: []string{"udp:" + dnsAddr}})
	fwd := testutil.FreeAddr(t, "udp")
	refusedFwd := testutil.FreeAddr(t, "udp")
	startClient(t, srv, clientOpts{Args: []string{
		"--forward", "udp:" + fwd + "=udp:" + dnsAddr,
		"--forward", "udp:" + refusedFwd + "=udp:127.0.0.1:9", // not allowed
	}})
	digAt := func(addr string, q ...string) (string, error) {
		host, port, _ := strings.Cut(addr, ":")
		out, err := exec.Command(dig, append([]string{"@" + host, "-p", port, "+time=2", "+tries=3"}, q...)...).CombinedOutput()
		return string(out), err
	}
	out, err := digAt(fwd, "+short", "svc.test")
	require.NoError(t, err, out)
	assert.Equal(t, "192.0.2.7", strings.TrimSpace(out), "an A record through the tunnel")

	out, err = digAt(fwd, "+bufsize=4096", "+ignore", "big.test", "TXT")
	require.NoError(t, err, out)
	assert.Contains(t, out, "MSG SIZE  rcvd: ", "dig got an answer")
	assert.NotContains(t, out, "flags: qr tc", "not truncated: the whole answer came through")
	assert.Equal(t, 12, strings.Count(out, big), "all 12 strings of the TXT record arrived:\n%s", out)
	// Counted once handed to QUIC, so the answer may beat the count: wait.
	waitMetric(t, srv, 5*time.Second, ge(1), "quictun_server_udp_packets_total", "direction", "downstream", "path", "stream")   // the large answer
	waitMetric(t, srv, 5*time.Second, ge(1), "quictun_server_udp_packets_total", "direction", "downstream", "path", "datagram") // short answers

	out, err = digAt(refusedFwd, "+short", "+tries=1", "svc.test")
	assert.Error(t, err, "no answer from a refused destination: %s", out)
	// The client's destination check when it connected, and the flow.
	waitMetric(t, srv, 5*time.Second, eq(2), "quictun_server_refused_destinations_total", "network", "udp", "reason", "not_allowed")
	assert.False(t, dns.exited(), "dnsmasq still runs")
}

// TestProxiesWithCurl (issue 12 item 4): curl reaches an HTTP server through
// the built client's SOCKS5 entry point (--socks5-hostname: the server
// resolves the name) and its HTTP CONNECT entry point (curl -p -x); a
// destination the server's rules refuse is answered as SOCKS "not allowed
// by ruleset" and HTTP 403.
func TestProxiesWithCurl(t *testing.T) {
	checkLeaks(t)
	curl := needTool(t, "curl", "curl")
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello through "+r.Host)
	}))
	defer web.Close()
	_, port, _ := net.SplitHostPort(web.Listener.Addr().String())
	srv := startServer(t, serverOpts{Allow: []string{"tcp:127.0.0.1:" + port}})
	socks := testutil.FreeAddr(t, "tcp")
	httpc := testutil.FreeAddr(t, "tcp")
	startClient(t, srv, clientOpts{Args: []string{"--proxy", "socks5:" + socks, "--proxy", "http-connect:" + httpc}})

	get := func(args ...string) (string, error) {
		out, err := exec.Command(curl, append([]string{"-sS", "--max-time", "10"}, args...)...).CombinedOutput()
		return string(out), err
	}
	out, err := get("--socks5-hostname", socks, "http://localhost:"+port+"/")
	require.NoError(t, err, out)
	assert.Equal(t, "hello through localhost:"+port, out)
	out, err = get("-p", "-x", "http://"+httpc, "http://127.0.0.1:"+port+"/")
	require.NoError(t, err, out)
	assert.Equal(t, "hello through 127.0.0.1:"+port, out)

	out, err = get("--socks5-hostname", socks, "http://127.0.0.1:22/")
	require.Error(t, err)
	assert.Contains(t, out, "connection to 127.0.0.1. (2)", "curl reports SOCKS reply 2, connection not allowed by ruleset: %s", out)
	out, err = get("-p", "-x", "http://"+httpc, "-o", "/dev/null", "-w", "%{http_connect}", "http://127.0.0.1:22/")
	require.Error(t, err)
	assert.Contains(t, out, "403", out)
	waitMetric(t, srv, 5*time.Second, eq(2), "quictun_server_refused_destinations_total", "network", "tcp", "reason", "not_allowed")
}

// TestProxyCredentialsWithCurl: with --proxy-credentials-file, curl gets
// through the built client's SOCKS5 entry point with the right user and
// password (RFC 1929) and is turned away with a wrong password or none.
func TestProxyCredentialsWithCurl(t *testing.T) {
	checkLeaks(t)
	curl := needTool(t, "curl", "curl")
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello")
	}))
	defer web.Close()
	_, port, _ := net.SplitHostPort(web.Listener.Addr().String())
	srv := startServer(t, serverOpts{Allow: []string{"tcp:127.0.0.1:" + port}})
	socks := testutil.FreeAddr(t, "tcp")
	creds := writeFile(t, "proxy-credentials", "app:s3cret\n")
	startClient(t, srv, clientOpts{Args: []string{"--proxy", "socks5:" + socks, "--proxy-credentials-file", creds}})

	get := func(proxy string) (string, error) {
		out, err := exec.Command(curl, "-sS", "--max-time", "10", "--proxy", proxy, "http://127.0.0.1:"+port+"/").CombinedOutput()
		return string(out), err
	}
	out, err := get("socks5h://app:s3cret@" + socks)
	require.NoError(t, err, out)
	assert.Equal(t, "hello", out)
	out, err = get("socks5h://app:wrong@" + socks)
	require.Error(t, err, out)
	assert.Contains(t, out, "User was rejected by the SOCKS5 server (1 1)", "a wrong password is rejected (RFC 1929 status 1): %s", out)
	out, err = get("socks5h://" + socks)
	require.Error(t, err, out)
	assert.Contains(t, out, "No authentication method was acceptable", "no credentials: no acceptable method: %s", out)
	assert.Equal(t, 1.0, scrape(t, srv).val("quictun_server_streams_total", "result", "ok"), "only the authenticated request reached the server")
}

// TestUDPIdleTimeoutAndFlowLimit: --udp-idle-timeout ends a quiet flow on
// both daemons, and the server's --max-udp-flows-per-conn refuses a flow
// beyond it; udp_flows_total counts each by result.
func TestUDPIdleTimeoutAndFlowLimit(t *testing.T) {
	checkLeaks(t)
	echo := testutil.UDPEchoServer(t)
	srv := startServer(t, serverOpts{Allow: []string{"udp:" + echo}, Args: []string{"--max-udp-flows-per-conn", "1", "--udp-idle-timeout", "1s"}})
	fwd := testutil.FreeAddr(t, "udp")
	cl := startClient(t, srv, clientOpts{Token: "tcp:127.0.0.1:1", Args: []string{"--forward", "udp:" + fwd + "=udp:" + echo, "--udp-idle-timeout", "1s"}})

	a, b := dialUDP(t, fwd), dialUDP(t, fwd) // two application sockets: two flows
	require.NoError(t, udpRoundTrip(a, "first flow"))
	_, err := b.Write([]byte("second flow"))
	require.NoError(t, err)
	waitMetric(t, cl, 10*time.Second, eq(1), "quictun_client_udp_flows_total", "result", "overloaded")
	waitMetric(t, srv, 5*time.Second, eq(1), "quictun_server_udp_drops_total", "reason", "flow_limit")

	// Quiet for the idle timeout: the first flow ends on both sides; then
	// the second application socket gets a flow of its own.
	waitMetric(t, cl, 10*time.Second, eq(1), "quictun_client_udp_flows_total", "result", "ok")
	waitMetric(t, srv, 10*time.Second, eq(1), "quictun_server_udp_flows_total", "result", "ok")
	waitMetric(t, srv, 5*time.Second, eq(0), "quictun_server_udp_flows_active")
	require.NoError(t, udpRoundTrip(b, "after the first flow ended"))
}

// dialUDP is an application's connected UDP socket to addr.
func dialUDP(t *testing.T, addr string) *net.UDPConn {
	t.Helper()
	ua, err := net.ResolveUDPAddr("udp", addr)
	require.NoError(t, err)
	c, err := net.DialUDP("udp", nil, ua)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// udpRoundTrip sends msg and waits for its echo, sending again (UDP may be
// lost, and a flow's first packets wait for its stream) up to 10 times.
func udpRoundTrip(c *net.UDPConn, msg string) error {
	buf := make([]byte, 2048)
	var err error
	for range 10 {
		if _, err = c.Write([]byte(msg)); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		var n int
		if n, err = c.Read(buf); err == nil {
			if string(buf[:n]) != msg {
				return fmt.Errorf("echo %q, want %q", buf[:n], msg)
			}
			return nil
		}
	}
	return fmt.Errorf("no echo of %q: %w", msg, err)
}

// TestSOCKS5UDPAssociateDig: dig's UDP queries relayed through the built
// client's SOCKS5 UDP ASSOCIATE reach dnsmasq on the server host (dig has
// no SOCKS support, so a small relay in the test wraps its packets in the
// SOCKS5 UDP header; that is what a SOCKS-aware application does).
func TestSOCKS5UDPAssociateDig(t *testing.T) {
	checkLeaks(t)
	dig := needTool(t, "dig", "bind9-dnsutils")
	_, dnsAddr := startDNSMasq(t, dig, "svc.test", "192.0.2.9")
	srv := startServer(t, serverOpts{Allow: []string{"udp:" + dnsAddr.String()}})
	socks := testutil.FreeAddr(t, "tcp")
	startClient(t, srv, clientOpts{Args: []string{"--proxy", "socks5:" + socks}})

	ctrl, err := net.Dial("tcp", socks)
	require.NoError(t, err)
	defer ctrl.Close()
	_ = ctrl.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = ctrl.Write([]byte{5, 1, 0, 5, 3, 0, 1, 0, 0, 0, 0, 0, 0})
	require.NoError(t, err)
	resp := make([]byte, 12)
	_, err = io.ReadFull(ctrl, resp)
	require.NoError(t, err)
	require.Equal(t, []byte{5, 0, 5, 0, 0, 1}, resp[:6])
	relay := &net.UDPAddr{IP: net.IP(resp[6:10]), Port: int(resp[10])<<8 | int(resp[11])}

	// The shim: dig -> shim (plain UDP) -> SOCKS5 relay (with the header) -> tunnel -> dnsmasq.
	shim, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer shim.Close()
	hdr := socks5.AppendUDPHeader(nil, socks5.Addr{IP: dnsAddr.Addr(), Port: dnsAddr.Port()})
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		var digAddr *net.UDPAddr
		for {
			n, from, err := shim.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if from.Port == relay.Port {
				if _, p, err := socks5.ParseUDP(buf[:n]); err == nil && digAddr != nil {
					_, _ = shim.WriteToUDP(p, digAddr)
				}
				continue
			}
			digAddr = from
			_, _ = shim.WriteToUDP(append(append([]byte(nil), hdr...), buf[:n]...), relay)
		}
	}()
	port := strconv.Itoa(shim.LocalAddr().(*net.UDPAddr).Port)
	out, err := exec.Command(dig, "@127.0.0.1", "-p", port, "+time=2", "+tries=3", "+short", "svc.test").CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Equal(t, "192.0.2.9", strings.TrimSpace(string(out)), "an A record through SOCKS5 UDP ASSOCIATE")
	_ = shim.Close()
	<-done
}
