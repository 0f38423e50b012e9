//go:build linux

package route

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/tools/linkem/netns"
)

func TestLookupLoopback(t *testing.T) {
	t.Parallel()
	p, err := Lookup(netip.MustParseAddr("127.0.0.1"))
	require.NoError(t, err)
	assert.Equal(t, netip.MustParseAddr("127.0.0.1"), p.Source)
	lo, err := net.InterfaceByName("lo")
	require.NoError(t, err)
	assert.Equal(t, lo.Index, p.Interface)
	// A v4-mapped address is looked up as IPv4.
	q, err := Lookup(netip.MustParseAddr("::ffff:127.0.0.1"))
	require.NoError(t, err)
	assert.Equal(t, p, q)

	_, err = Lookup(netip.Addr{})
	require.Error(t, err)

	// IPv6, where the host has it.
	if p6, err := Lookup(netip.IPv6Loopback()); err == nil {
		assert.Equal(t, netip.IPv6Loopback(), p6.Source)
		assert.Equal(t, lo.Index, p6.Interface)
	} else {
		t.Logf("no IPv6 route to ::1 (%v): IPv6 lookup not checked", err)
	}
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
}

// TestWatcherSeesRouteChange changes the route to a destination in a network
// namespace of its own (root only): the watcher wakes, and Lookup names the
// new source address and interface; an address removal wakes it too, and a
// lookup with no route fails.
func TestWatcherSeesRouteChange(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: the ip command (iproute2) is missing")
	}
	ns := fmt.Sprintf("rt%d", os.Getpid())
	ip(t, "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	for _, d := range []string{"d1", "d2"} {
		// (veth pairs: the dummy driver is not everywhere)
		ip(t, "-n", ns, "link", "add", d, "type", "veth", "peer", "name", d+"p")
		ip(t, "-n", ns, "link", "set", d, "up")
		ip(t, "-n", ns, "link", "set", d+"p", "up")
	}
	ip(t, "-n", ns, "addr", "add", "10.88.1.1/24", "dev", "d1")
	ip(t, "-n", ns, "addr", "add", "10.88.2.1/24", "dev", "d2")
	ip(t, "-n", ns, "route", "add", "default", "via", "10.88.1.2", "dev", "d1")
	dst := netip.MustParseAddr("192.0.2.7")
	lookup := func() (p Path, err error) {
		err = netns.Do(ns, func() error {
			p, err = Lookup(dst)
			return err
		})
		return p, err
	}
	index := func(name string) (i int) {
		require.NoError(t, netns.Do(ns, func() error {
			ifc, err := net.InterfaceByName(name)
			if err == nil {
				i = ifc.Index
			}
			return err
		}))
		return i
	}
	p, err := lookup()
	require.NoError(t, err)
	assert.Equal(t, Path{Source: netip.MustParseAddr("10.88.1.1"), Interface: index("d1")}, p)

	var w *Watcher
	require.NoError(t, netns.Do(ns, func() error {
		var err error
		w, err = NewWatcher()
		return err
	}))
	defer func() { _ = w.Close() }()
	woke := make(chan error, 1)
	wait := func() {
		go func() {
			before := time.Now()
			first, err := w.Wait(10*time.Millisecond, 50*time.Millisecond)
			if err == nil && (first.Before(before) || time.Since(first) < 10*time.Millisecond) {
				err = fmt.Errorf("first change at %v: before the Wait (%v) or less than the quiet time ago", first, before)
			}
			woke <- err
		}()
	}
	waitWoke := func(what string) {
		t.Helper()
		select {
		case err := <-woke:
			require.NoError(t, err, what)
		case <-time.After(10 * time.Second):
			t.Fatalf("watcher did not wake after %s", what)
		}
	}

	wait()
	ip(t, "-n", ns, "route", "replace", "default", "via", "10.88.2.2", "dev", "d2")
	waitWoke("route replace")
	p, err = lookup()
	require.NoError(t, err)
	assert.Equal(t, Path{Source: netip.MustParseAddr("10.88.2.1"), Interface: index("d2")}, p)

	wait()
	ip(t, "-n", ns, "addr", "del", "10.88.2.1/24", "dev", "d2") // takes the default route with it
	waitWoke("address removal")
	_, err = lookup()
	require.Error(t, err, "no route left")

	// Close ends a Wait in progress.
	wait()
	require.NoError(t, w.Close())
	select {
	case err := <-woke:
		require.Error(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end Wait")
	}
}
