//go:build linux

package route

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Supported reports whether this platform has a route watcher.
const Supported = true

// lookupTimeout bounds waiting for the kernel's answer to a route lookup.
const lookupTimeout = time.Second

// Lookup asks the kernel how packets to dst leave the host now (RTM_GETROUTE,
// the question `ip route get` asks). With no route it returns the kernel's
// error (ENETUNREACH, EHOSTUNREACH, ...).
func Lookup(dst netip.Addr) (Path, error) {
	dst = dst.Unmap()
	if !dst.IsValid() {
		return Path{}, errors.New("route lookup: no destination address")
	}
	family := uint8(unix.AF_INET)
	if dst.Is6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return Path{}, fmt.Errorf("route lookup: netlink socket: %w", err)
	}
	defer func() { _ = unix.Close(fd) }()
	tv := unix.NsecToTimeval(lookupTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return Path{}, fmt.Errorf("route lookup: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return Path{}, fmt.Errorf("route lookup: netlink bind: %w", err)
	}
	const seq = 1
	addr := dst.AsSlice()
	// nlmsghdr, rtmsg, then one attribute: RTA_DST.
	msg := make([]byte, unix.NLMSG_HDRLEN+unix.SizeofRtMsg+unix.SizeofRtAttr+len(addr))
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], unix.RTM_GETROUTE)
	ne.PutUint16(msg[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(msg[8:], seq)
	rt := msg[unix.NLMSG_HDRLEN:]
	rt[0] = family               // rtm_family
	rt[1] = uint8(len(addr) * 8) // rtm_dst_len
	at := rt[unix.SizeofRtMsg:]
	ne.PutUint16(at[0:], uint16(unix.SizeofRtAttr+len(addr)))
	ne.PutUint16(at[2:], unix.RTA_DST)
	copy(at[unix.SizeofRtAttr:], addr)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return Path{}, fmt.Errorf("route lookup: netlink send: %w", err)
	}
	buf := make([]byte, 16<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return Path{}, fmt.Errorf("route lookup: netlink receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return Path{}, fmt.Errorf("route lookup: %w", err)
		}
		for i := range msgs {
			m := &msgs[i]
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return Path{}, errors.New("route lookup: short netlink error")
				}
				if errno := -int32(ne.Uint32(m.Data)); errno != 0 {
					return Path{}, fmt.Errorf("route lookup %s: %w", dst, syscall.Errno(errno))
				}
			case unix.RTM_NEWROUTE:
				return parseRoute(m)
			}
		}
	}
}

// parseRoute reads the source address and interface of a route message.
func parseRoute(m *syscall.NetlinkMessage) (Path, error) {
	attrs, err := syscall.ParseNetlinkRouteAttr(m)
	if err != nil {
		return Path{}, fmt.Errorf("route lookup: %w", err)
	}
	var p Path
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.RTA_PREFSRC:
			if ip, ok := netip.AddrFromSlice(a.Value); ok {
				p.Source = ip
			}
		case unix.RTA_OIF:
			if len(a.Value) >= 4 {
				p.Interface = int(binary.NativeEndian.Uint32(a.Value))
			}
		}
	}
	if !p.Source.IsValid() {
		return Path{}, errors.New("route lookup: the kernel named no source address")
	}
	return p, nil
}

// Watcher reports changes of the routing table, of addresses and of links
// (rtnetlink multicast groups, IPv4 and IPv6). Wait and Close may be called
// from different goroutines; Wait from one at a time.
type Watcher struct {
	f   *os.File
	buf []byte
}

// NewWatcher opens a netlink socket subscribed to route, address and link changes.
func NewWatcher() (*Watcher, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	groups := unix.RTMGRP_LINK | unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV4_ROUTE | unix.RTMGRP_IPV6_IFADDR | unix.RTMGRP_IPV6_ROUTE
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: uint32(groups)}); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	// Non-blocking, so the file goes through the runtime's poller: deadlines
	// work and Close ends a Wait.
	return &Watcher{f: os.NewFile(uintptr(fd), "rtnetlink"), buf: make([]byte, 32<<10)}, nil
}

// Wait blocks until something changed, then takes in the rest of the burst
// (deleting an address also deletes its routes; a link going down takes its
// routes and addresses with it): it returns once quiet passed without another
// change, and at most limit after the first, and says when the first
// arrived. It returns an error once the watcher is closed.
func (w *Watcher) Wait(quiet, limit time.Duration) (time.Time, error) {
	if err := w.f.SetReadDeadline(time.Time{}); err != nil {
		return time.Time{}, err
	}
	if err := w.read(); err != nil {
		return time.Time{}, err
	}
	first := time.Now()
	for {
		deadline := time.Now().Add(quiet)
		if end := first.Add(limit); end.Before(deadline) {
			deadline = end
		}
		if err := w.f.SetReadDeadline(deadline); err != nil {
			return time.Time{}, err
		}
		err := w.read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return first, nil
		}
		if err != nil {
			return time.Time{}, err
		}
	}
}

func (w *Watcher) read() error {
	_, err := w.f.Read(w.buf)
	if errors.Is(err, unix.ENOBUFS) {
		return nil // the socket overflowed: changes were lost, which is a change
	}
	return err
}

// Close ends a Wait in progress and releases the socket.
func (w *Watcher) Close() error { return w.f.Close() }
