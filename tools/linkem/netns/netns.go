// Package netns creates the two-host topology of linkem: network namespaces
// named <prefix>-c (client host) and <prefix>-s (server host), each with a TUN
// device whose file descriptor is held by the calling process. It also runs
// functions inside a namespace, so tests can create sockets there.
package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Addresses of the two hosts (RFC 2544 benchmarking range).
const (
	ClientIP = "198.18.0.1"
	ServerIP = "198.18.0.2"
)

// DevName is the TUN device name inside each namespace.
const DevName = "lem0"

// MTU of the TUN devices.
const MTU = 1500

// TxQueueLen of the TUN devices: packets wait there when linkem is slow to
// read (a busy CPU); drops there are not counted by linkem.
const TxQueueLen = 5000

// UDPBufferBytes is written to net.core.{r,w}mem_max in each namespace so
// unprivileged QUIC stacks can raise their buffers.
const UDPBufferBytes = 8 << 20

// Names returns the client and server namespace names for prefix.
func Names(prefix string) (client, server string) {
	return prefix + "-c", prefix + "-s"
}

// ValidatePrefix checks that prefix makes short, safe namespace names.
func ValidatePrefix(prefix string) error {
	ok := len(prefix) >= 1 && len(prefix) <= 10 && prefix[0] >= 'a' && prefix[0] <= 'z'
	for _, c := range prefix {
		ok = ok && (c >= 'a' && c <= 'z' || c >= '0' && c <= '9')
	}
	if !ok {
		return fmt.Errorf("prefix %q: want 1-10 lowercase letters or digits, starting with a letter", prefix)
	}
	return nil
}

// Host is one end of the topology.
type Host struct {
	NS   string
	Addr netip.Addr
	Peer netip.Addr
	// TUN is the device's file; one Read returns one IP packet.
	TUN *os.File
}

// Topology is the pair of namespaces with their TUN devices.
type Topology struct {
	Prefix         string
	Client, Server Host
}

// Setup creates the namespaces and devices. On error it removes what it
// created. The caller must call Close, then Teardown.
func Setup(ctx context.Context, prefix string) (*Topology, error) {
	if err := ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	cns, sns := Names(prefix)
	for _, ns := range []string{cns, sns} {
		if Exists(ns) {
			return nil, fmt.Errorf("namespace %s already exists (run `linkem down --prefix %s`)", ns, prefix)
		}
	}
	t := &Topology{Prefix: prefix,
		Client: Host{NS: cns, Addr: netip.MustParseAddr(ClientIP), Peer: netip.MustParseAddr(ServerIP)},
		Server: Host{NS: sns, Addr: netip.MustParseAddr(ServerIP), Peer: netip.MustParseAddr(ClientIP)},
	}
	if err := t.setup(ctx); err != nil {
		t.Close()
		return nil, errors.Join(err, Teardown(ctx, prefix))
	}
	return t, nil
}

func (t *Topology) setup(ctx context.Context) error {
	for _, h := range []*Host{&t.Client, &t.Server} {
		if err := ip(ctx, "netns", "add", h.NS); err != nil {
			return err
		}
		// IPv4 only: no router solicitations or DAD noise on the link.
		_ = Do(h.NS, func() error {
			for _, k := range []string{"all", "default"} {
				_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("1"), 0o644)
			}
			return nil
		})
		f, err := openTUN(h.NS, DevName)
		if err != nil {
			return err
		}
		h.TUN = f
		cmds := [][]string{
			{"-n", h.NS, "link", "set", "lo", "up"},
			{"-n", h.NS, "link", "set", DevName, "mtu", fmt.Sprint(MTU), "txqueuelen", fmt.Sprint(TxQueueLen), "up"},
			{"-n", h.NS, "addr", "add", h.Addr.String() + "/32", "dev", DevName},
			{"-n", h.NS, "route", "add", h.Peer.String() + "/32", "dev", DevName},
		}
		for _, c := range cmds {
			if err := ip(ctx, c...); err != nil {
				return err
			}
		}
		// Best effort: some kernels do not namespace these sysctls.
		_ = Do(h.NS, func() error {
			for _, k := range []string{"rmem_max", "wmem_max"} {
				_ = os.WriteFile("/proc/sys/net/core/"+k, []byte(fmt.Sprint(UDPBufferBytes)), 0o644)
			}
			// Every TCP connection starts afresh: the kernel otherwise
			// caches the last connection's ssthresh per destination, and a
			// measurement would depend on what ran before it.
			_ = os.WriteFile("/proc/sys/net/ipv4/tcp_no_metrics_save", []byte("1"), 0o644)
			return nil
		})
	}
	return nil
}

// Close closes the TUN files, which removes the devices.
func (t *Topology) Close() {
	for _, h := range []*Host{&t.Client, &t.Server} {
		if h.TUN != nil {
			_ = h.TUN.Close()
			h.TUN = nil
		}
	}
}

// Teardown deletes the namespaces of prefix. It is idempotent.
func Teardown(ctx context.Context, prefix string) error {
	if err := ValidatePrefix(prefix); err != nil {
		return err
	}
	var errs []error
	cns, sns := Names(prefix)
	for _, ns := range []string{cns, sns} {
		if !Exists(ns) {
			continue
		}
		// Processes still running inside keep the network stack alive after
		// the name is gone; their owners must stop them (see PIDs).
		if err := ip(ctx, "netns", "del", ns); err != nil && Exists(ns) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PIDs lists the processes running in namespace ns.
func PIDs(ctx context.Context, ns string) ([]int, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "pids", ns).Output()
	if err != nil {
		return nil, fmt.Errorf("ip netns pids %s: %w", ns, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Exists tells whether the named namespace exists.
func Exists(ns string) bool {
	_, err := os.Stat(filepath.Join("/run/netns", ns))
	return err == nil
}

// Do runs fn on a locked OS thread inside namespace ns. Sockets and devices
// created by fn belong to ns and keep working on any thread afterwards.
func Do(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is unlocked (and reused) only if it is back in its
		// original namespace; otherwise it exits with this goroutine.
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open current netns: %w", err)
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(filepath.Join("/run/netns", ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			runtime.UnlockOSThread()
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			runtime.UnlockOSThread()
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("setns back from %s: %w", ns, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func openTUN(ns, name string) (*os.File, error) {
	var f *os.File
	err := Do(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("ifreq %s: %w", name, err)
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("TUNSETIFF %s in %s: %w", name, ns, err)
		}
		// Non-blocking fd: os.NewFile registers it with the poller, so
		// Close unblocks a pending Read.
		f = os.NewFile(uintptr(fd), "/dev/net/tun:"+ns+"/"+name)
		return nil
	})
	return f, err
}

func ip(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
