//go:build linux && (amd64 || arm64)

package rawsock

import (
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/net/ipv4"
)

// Wrap returns c as a socket for quic-go's Transport: a *UDPConn when the
// raw system calls are available for it, else c itself.
func Wrap(c *net.UDPConn) net.PacketConn {
	rc, err := c.SyscallConn()
	if err != nil {
		return c
	}
	var domain int
	var serr error
	if err := rc.Control(func(fd uintptr) {
		domain, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_DOMAIN)
	}); err != nil || serr != nil || (domain != syscall.AF_INET && domain != syscall.AF_INET6) {
		return c
	}
	return &UDPConn{UDPConn: c, rc: rc, inet6: domain == syscall.AF_INET6}
}

// UDPConn is a *net.UDPConn whose WriteMsgUDP and ReadBatch (which quic-go
// uses when a socket has it: sys_conn_oob.go) make raw system calls. Its
// other methods are net.UDPConn's.
type UDPConn struct {
	*net.UDPConn
	rc    syscall.RawConn
	inet6 bool // an AF_INET6 socket: IPv4 destinations are sent as v4-mapped

	rd batchRead // ReadBatch's state; quic-go reads from one goroutine
	// sends holds WriteMsgUDP's per-call state (*sendCall): quic-go sends
	// from its send queue and, for probes and stateless resets, from others.
	sends sync.Pool
}

type sendCall struct {
	msg  syscall.Msghdr
	iov  syscall.Iovec
	name syscall.RawSockaddrInet6 // big enough for either family
	n    int
	err  syscall.Errno
	fn   func(fd uintptr) bool
}

func (s *sendCall) send(fd uintptr) bool {
	for {
		n, _, errno := syscall.RawSyscall(syscall.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&s.msg)), 0)
		switch errno {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		s.n, s.err = int(n), errno
		return true
	}
}

// WriteMsgUDP sends b with the control messages oob to addr, as
// net.UDPConn's WriteMsgUDP does (the error an *net.OpError around an
// *os.SyscallError, which quic-go looks for).
func (c *UDPConn) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (n, oobn int, err error) {
	s, _ := c.sends.Get().(*sendCall)
	if s == nil {
		s = new(sendCall)
		s.fn = s.send
	}
	defer func() {
		*s = sendCall{fn: s.fn}
		c.sends.Put(s)
	}()
	namelen, ok := c.sockaddr(addr, &s.name)
	if !ok {
		return c.UDPConn.WriteMsgUDP(b, oob, addr)
	}
	s.msg.Name = (*byte)(unsafe.Pointer(&s.name))
	s.msg.Namelen = namelen
	if len(b) > 0 {
		s.iov.Base = &b[0]
		s.iov.SetLen(len(b))
		s.msg.Iov = &s.iov
		s.msg.Iovlen = 1
	}
	if len(oob) > 0 {
		s.msg.Control = &oob[0]
		s.msg.SetControllen(len(oob))
	}
	if werr := c.rc.Write(s.fn); werr != nil {
		return 0, 0, &net.OpError{Op: "write", Net: "udp", Source: c.LocalAddr(), Addr: addr, Err: werr}
	}
	if s.err != 0 {
		return 0, 0, &net.OpError{Op: "write", Net: "udp", Source: c.LocalAddr(), Addr: addr, Err: os.NewSyscallError("sendmsg", s.err)}
	}
	return s.n, len(oob), nil
}

// sockaddr writes addr into sa in the socket's family and returns its length;
// false when addr does not fit the socket (then net.UDPConn's own path runs,
// which returns the error it returns).
func (c *UDPConn) sockaddr(addr *net.UDPAddr, sa *syscall.RawSockaddrInet6) (uint32, bool) {
	if addr == nil || addr.Port < 0 || addr.Port > 0xffff {
		return 0, false
	}
	ip, ok := netip.AddrFromSlice(addr.IP)
	if !ok {
		return 0, false
	}
	port := uint16(addr.Port)
	if !c.inet6 {
		ip = ip.Unmap()
		if !ip.Is4() {
			return 0, false
		}
		sa4 := (*syscall.RawSockaddrInet4)(unsafe.Pointer(sa))
		sa4.Family = syscall.AF_INET
		sa4.Port = port<<8 | port>>8
		sa4.Addr = ip.As4()
		return syscall.SizeofSockaddrInet4, true
	}
	var scope uint64
	if addr.Zone != "" {
		var err error
		if scope, err = strconv.ParseUint(addr.Zone, 10, 32); err != nil {
			return 0, false // a scope by name: net's path resolves it
		}
	}
	sa.Family = syscall.AF_INET6
	sa.Port = port<<8 | port>>8
	sa.Addr = ip.As16() // an IPv4 address as v4-mapped
	sa.Scope_id = uint32(scope)
	return syscall.SizeofSockaddrInet6, true
}

// mmsghdr is struct mmsghdr of recvmmsg(2).
type mmsghdr struct {
	hdr syscall.Msghdr
	len uint32
}

// batchRead is ReadBatch's state, kept between calls.
type batchRead struct {
	hdrs  []mmsghdr
	iovs  []syscall.Iovec
	names []syscall.RawSockaddrAny
	n     int
	err   syscall.Errno
	fn    func(fd uintptr) bool
}

func (r *batchRead) recv(fd uintptr) bool {
	for {
		n, _, errno := syscall.RawSyscall6(syscall.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(len(r.hdrs)), 0, 0, 0)
		switch errno {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		r.n, r.err = int(n), errno
		return true
	}
}

// ReadBatch reads up to len(ms) datagrams with one recvmmsg(2), as
// ipv4.PacketConn's ReadBatch does (flags must be 0; each message's
// Buffers, OOB, N, NN, Flags and Addr as there). One goroutine at a time.
func (c *UDPConn) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	r := &c.rd
	if r.fn == nil {
		r.fn = r.recv
	}
	if flags != 0 {
		return 0, &net.OpError{Op: "read", Net: "udp", Source: c.LocalAddr(), Err: syscall.EINVAL}
	}
	if cap(r.hdrs) < len(ms) {
		r.hdrs = make([]mmsghdr, len(ms))
		r.names = make([]syscall.RawSockaddrAny, len(ms))
	}
	r.hdrs, r.names = r.hdrs[:len(ms)], r.names[:len(ms)]
	r.iovs = r.iovs[:0]
	for i := range ms {
		for _, b := range ms[i].Buffers {
			var v syscall.Iovec
			if len(b) > 0 {
				v.Base = &b[0]
				v.SetLen(len(b))
			}
			r.iovs = append(r.iovs, v)
		}
	}
	k := 0
	for i := range ms {
		h := &r.hdrs[i].hdr
		*h = syscall.Msghdr{}
		r.hdrs[i].len = 0
		h.Name = (*byte)(unsafe.Pointer(&r.names[i]))
		h.Namelen = syscall.SizeofSockaddrAny
		if nb := len(ms[i].Buffers); nb > 0 {
			h.Iov = &r.iovs[k]
			h.Iovlen = uint64(nb)
			k += nb
		}
		if len(ms[i].OOB) > 0 {
			h.Control = &ms[i].OOB[0]
			h.SetControllen(len(ms[i].OOB))
		}
	}
	err := c.rc.Read(r.fn)
	clear(r.iovs) // no buffer kept reachable past the call
	if err == nil && r.err != 0 {
		err = os.NewSyscallError("recvmmsg", r.err)
	}
	if err != nil {
		return 0, &net.OpError{Op: "read", Net: "udp", Source: c.LocalAddr(), Err: err}
	}
	for i := 0; i < r.n; i++ {
		h := &r.hdrs[i]
		ms[i].N = int(h.len)
		ms[i].NN = int(h.hdr.Controllen)
		ms[i].Flags = int(h.hdr.Flags)
		ms[i].Addr = udpAddr(&r.names[i])
	}
	return r.n, nil
}

// udpAddr is the source address recvmmsg wrote into sa.
func udpAddr(sa *syscall.RawSockaddrAny) *net.UDPAddr {
	switch sa.Addr.Family {
	case syscall.AF_INET:
		sa4 := (*syscall.RawSockaddrInet4)(unsafe.Pointer(sa))
		p := sa4.Port
		return &net.UDPAddr{IP: net.IPv4(sa4.Addr[0], sa4.Addr[1], sa4.Addr[2], sa4.Addr[3]), Port: int(p<<8 | p>>8)}
	case syscall.AF_INET6:
		sa6 := (*syscall.RawSockaddrInet6)(unsafe.Pointer(sa))
		p := sa6.Port
		a := &net.UDPAddr{IP: make(net.IP, net.IPv6len), Port: int(p<<8 | p>>8)}
		copy(a.IP, sa6.Addr[:])
		if sa6.Scope_id != 0 {
			// The interface's index, not its name (which would cost a
			// netlink request per datagram); net and WriteMsgUDP take either.
			a.Zone = strconv.FormatUint(uint64(sa6.Scope_id), 10)
		}
		return a
	}
	return nil
}
