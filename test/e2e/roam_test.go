package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/tools/linkem/netns"
)

// Addresses of the roaming topology: two links between the client and the
// server namespaces, each its own subnet; the server's address is on its
// loopback, reached by the client's default route over either link.
const (
	roamServerIP = "10.78.9.1"
	roamLink1    = "10.78.1." // .1 client, .2 server
	roamLink2    = "10.78.2."
)

// newRoamNS creates the namespaces joined by two veth pairs (eth1: link 1,
// eth2: link 2), with the client's default route over link 1.
func newRoamNS(t *testing.T) *nsPair {
	t.Helper()
	p := newNamespaces(t, roamServerIP)
	for i, net := range []string{roamLink1, roamLink2} {
		dev := []string{"eth1", "eth2"}[i]
		ipCmd(t, "-n", p.client, "link", "add", dev, "type", "veth", "peer", "name", dev, "netns", p.server)
		ipCmd(t, "-n", p.client, "addr", "add", net+"1/24", "dev", dev)
		ipCmd(t, "-n", p.server, "addr", "add", net+"2/24", "dev", dev)
		for _, ns := range []string{p.client, p.server} {
			ipCmd(t, "-n", ns, "link", "set", dev, "up")
		}
	}
	ipCmd(t, "-n", p.server, "addr", "add", roamServerIP+"/32", "dev", "lo")
	ipCmd(t, "-n", p.client, "route", "add", "default", "via", roamLink1+"2", "dev", "eth1")
	// Loose reverse-path filtering, systemd's default (50-default.conf): the
	// server's packets to the old address still arrive over link 1 after the
	// default route moved to link 2.
	require.NoError(t, netns.Do(p.client, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/conf/all/rp_filter", []byte("2"), 0o644)
	}))
	return p
}

// switchLine matches the client's log line of a path switch after a route change.
var switchLine = regexp.MustCompile(`"Switched to a new path after a route change".* probing="([^"]+)" sinceChange="([^"]+)"`)

// TestRoam: the client's default route moves from link 1 to link 2 during
// ping-pongs through the tunnel, then, with a bulk transfer (hash checked)
// running beside them, back to link 1, and a second later link 2 goes down.
// The tunneled connections survive with verified data and no reconnect. With
// the route watch on, the client switches its connection to a path the new
// way at each route change (path_switches_total{reason="route_changed"}, the
// second time back to its main socket) and logs it at -v 0; with it off
// (--route-watch=false) it does not, and the server follows the client's
// packets to the new address by itself (or the blackout rescue does). The
// stalls around each event, and in a second without one, are logged for
// both; they are not asserted (timing on a loaded machine).
func TestRoam(t *testing.T) {
	requireNetns(t)
	for _, watch := range []bool{true, false} {
		t.Run(fmt.Sprintf("route-watch=%v", watch), func(t *testing.T) {
			checkLeaks(t)
			ns := newRoamNS(t)
			tn := startNSTunnel(t, ns, "-v", "0", fmt.Sprintf("--route-watch=%v", watch))
			dial := func() testutil.HalfCloser {
				c, err := dialIn(context.Background(), ns.client, "tcp", tn.clientListen)
				require.NoError(t, err)
				t.Cleanup(func() { _ = c.Close() })
				require.NoError(t, c.SetDeadline(time.Now().Add(45*time.Second)))
				return c.(*net.TCPConn)
			}
			pp := testutil.StartWorkload(t, dial, 4, 0) // ping-pongs only (an empty bulk)
			pp.Warm(t, 0, 20*time.Second)
			quiet := time.Now() // a second without an event: the stalls of this machine's load
			time.Sleep(time.Second)

			moved := time.Now()
			ipCmd(t, "-n", ns.client, "route", "replace", "default", "via", roamLink2+"2", "dev", "eth2")
			time.Sleep(time.Second)

			bulk := testutil.StartWorkload(t, dial, 0, -1) // a bulk transfer until Finish
			bulk.Warm(t, 4<<20, 20*time.Second)
			back := time.Now()
			ipCmd(t, "-n", ns.client, "route", "replace", "default", "via", roamLink1+"2", "dev", "eth1")
			time.Sleep(time.Second)
			down := time.Now()
			ipCmd(t, "-n", ns.client, "link", "set", "eth2", "down")
			time.Sleep(1500 * time.Millisecond)
			bulk.Finish(t, 20*time.Second)
			pp.Finish(t, 20*time.Second)

			const window = 900 * time.Millisecond
			stallQuiet, _ := pp.Report(t, "quiet second", quiet, window)
			stallMove, _ := pp.Report(t, "route change, ping-pongs only", moved, window)
			stallBack, _ := pp.Report(t, "route change back, with a bulk transfer", back, window)
			stallDown, _ := pp.Report(t, "link 2 down, with a bulk transfer", down, window)
			bulk.Report(t, "route change back", back, window)
			bulk.Report(t, "link 2 down", down, window)
			cm := nsScrape(t, ns.client, tn.clientURL)
			sm := nsScrape(t, ns.server, tn.serverURL)
			ms := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
			t.Logf("roaming (route watch %v): longest ping-pong stall: quiet second %v; route change (ping-pongs only) %v; route change back (with bulk) %v; link 2 down (with bulk) %v; "+
				"client: path switches route_changed %v address_removed %v blackout %v, switch failures %v, reconnects %v",
				watch, ms(stallQuiet), ms(stallMove), ms(stallBack), ms(stallDown),
				cm.val("quictun_client_path_switches_total", "reason", "route_changed"),
				cm.val("quictun_client_path_switches_total", "reason", "address_removed"),
				cm.val("quictun_client_path_switches_total", "reason", "blackout"),
				cm.val("quictun_client_path_switch_failures_total", "reason", "route_changed"),
				cm.val("quictun_client_reconnects_total"))
			assert.Zero(t, cm.val("quictun_client_reconnects_total"), "client reconnects")
			assert.Equal(t, 1.0, cm.val("quictun_client_dials_total", "result", "ok")+cm.val("quictun_client_dials_total", "result", "ok_0rtt"), "client dials")
			assert.Equal(t, 1.0, sm.val("quictun_server_active_connections"), "server's live QUIC connections")
			switched := cm.val("quictun_client_path_switches_total", "reason", "route_changed")
			log := tn.client.log()
			lines := switchLine.FindAllStringSubmatch(log, -1)
			for _, m := range lines {
				t.Logf("roaming (route watch %v): path validated in %s, switched %s after the kernel's first route event", watch, m[1], m[2])
			}
			if watch {
				assert.GreaterOrEqual(t, switched, 2.0, "path switches because of the two route changes")
				assert.Len(t, lines, int(switched), "a -v 0 line per switch")
			} else {
				assert.Zero(t, switched, "path switches because of a route change, with the watch off")
				assert.Empty(t, lines, "route-change switches logged with the watch off")
			}
		})
	}
}

// TestRoamIdle: an idle tunnel (heartbeats off: no work for 5 s) whose
// destination then sends on its own, the way an idle ssh session prints
// output: link 1 goes down and a backup default route over link 2 takes over.
// Nothing is sent upstream, so without the route watch the server keeps
// sending to the old address until the client's next keep-alive
// (--keepalive-period, 25 s by default); with it, the client moved the
// connection when the route changed, and the bytes arrive at once. Asserted:
// with the watch, they arrive within 3 s and the switch is counted; without
// it, the delay (capped at 3 s) is only logged. The two variants run side by
// side (each waits out the idle period).
func TestRoamIdle(t *testing.T) {
	requireNetns(t)
	checkLeaks(t)
	for _, watch := range []bool{true, false} {
		t.Run(fmt.Sprintf("route-watch=%v", watch), func(t *testing.T) {
			t.Parallel()
			ns := newRoamNS(t)
			ipCmd(t, "-n", ns.client, "route", "add", "default", "via", roamLink2+"2", "dev", "eth2", "metric", "200")
			push := make(chan struct{})
			done := t.Context().Done()
			tn := startNSTunnelTo(t, ns, func(c net.Conn) {
				// Answer the hello, then send once told to, then drain.
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				if _, err := c.Write([]byte("ready\n")); err != nil {
					return
				}
				select {
				case <-push:
					_, _ = c.Write([]byte("pushed\n"))
				case <-done:
					return
				}
				_, _ = c.Read(make([]byte, 1))
			}, "-v", "0", fmt.Sprintf("--route-watch=%v", watch))
			c, err := dialIn(context.Background(), ns.client, "tcp", tn.clientListen)
			require.NoError(t, err)
			defer func() { _ = c.Close() }()
			r := bufio.NewReader(c)
			require.NoError(t, c.SetDeadline(time.Now().Add(ioTimeout)))
			_, err = c.Write([]byte("hello\n"))
			require.NoError(t, err)
			line, err := r.ReadString('\n')
			require.NoError(t, err)
			require.Equal(t, "ready\n", line)

			time.Sleep(6 * time.Second) // idle: the client's heartbeats stop after 5 s without work
			down := time.Now()
			ipCmd(t, "-n", ns.client, "link", "set", "eth1", "down")
			time.Sleep(500 * time.Millisecond)
			pushed := time.Now()
			close(push)
			const bound = 3 * time.Second
			require.NoError(t, c.SetReadDeadline(pushed.Add(bound)))
			line, err = r.ReadString('\n')
			got := time.Since(pushed)
			cm := nsScrape(t, ns.client, tn.clientURL)
			delivered := err == nil && line == "pushed\n"
			delay := fmt.Sprint(got.Round(100 * time.Microsecond))
			if !delivered {
				delay = fmt.Sprintf("more than %v (%v)", bound, err)
			}
			t.Logf("roaming while idle (route watch %v): the destination's bytes sent %v after link 1 went down arrived after %s; path switches route_changed %v blackout %v, reconnects %v",
				watch, pushed.Sub(down).Round(time.Millisecond), delay,
				cm.val("quictun_client_path_switches_total", "reason", "route_changed"),
				cm.val("quictun_client_path_switches_total", "reason", "blackout"),
				cm.val("quictun_client_reconnects_total"))
			if watch {
				assert.True(t, delivered, "bytes pushed after the route change arrived within %v", bound)
				assert.GreaterOrEqual(t, cm.val("quictun_client_path_switches_total", "reason", "route_changed"), 1.0, "path switches because of the route change")
				assert.Zero(t, cm.val("quictun_client_reconnects_total"), "client reconnects")
			}
		})
	}
}
