package client

import (
	"errors"
	"net"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/rawsock"
)

func isTransientSendError(err error) bool {
	for _, e := range transientSendErrors {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// sendErrorsAsLoss wraps a socket of the client so that a datagram the
// network cannot take (see transientSendErrors) is reported as sent, that is,
// lost on the way, and logged at most once a second. quic-go destroys a
// connection on any send error but EMSGSIZE (send_queue.go), so without this a
// moment without a route, while the host's address changes, would end every
// tunnel; as a loss, the connection retransmits once packets leave again, now
// from the new address, and the server follows it there (path validation).
//
// A *net.UDPConn stays an OOB-capable UDP conn for quic-go (GSO, ECN, batched
// reads), with rawsock's raw system calls where it has them; any other
// PacketConn is wrapped as a plain net.PacketConn.
func sendErrorsAsLoss(pc net.PacketConn, logger klog.Logger) net.PacketConn {
	d := &dropLog{logger: logger}
	if u, ok := pc.(*net.UDPConn); ok {
		if r, ok := rawsock.Wrap(u).(*rawsock.UDPConn); ok {
			return &lossyRawUDPConn{UDPConn: r, log: d}
		}
		return &lossyUDPConn{UDPConn: u, log: d}
	}
	return &lossyPacketConn{PacketConn: pc, log: d}
}

// dropLog logs dropped datagrams at most once a second. Safe for concurrent use.
type dropLog struct {
	logger klog.Logger
	last   atomic.Int64 // unix nanoseconds of the last log line
}

// lost reports whether err is a send error to count as a loss (logging it
// at most once a second).
func (d *dropLog) lost(err error) bool {
	if err == nil || !isTransientSendError(err) {
		return false
	}
	now, last := time.Now().UnixNano(), d.last.Load()
	if now-last >= int64(time.Second) && d.last.CompareAndSwap(last, now) {
		d.logger.V(2).Info("Network did not take a datagram; counting it as lost", "err", err)
	}
	return true
}

type lossyUDPConn struct {
	*net.UDPConn
	log *dropLog
}

// WriteMsgUDP is what quic-go sends with on a UDP socket.
func (c *lossyUDPConn) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (n, oobn int, err error) {
	n, oobn, err = c.UDPConn.WriteMsgUDP(b, oob, addr)
	if c.log.lost(err) {
		return len(b), len(oob), nil
	}
	return n, oobn, err
}

func (c *lossyUDPConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	n, err := c.UDPConn.WriteTo(b, addr)
	if c.log.lost(err) {
		return len(b), nil
	}
	return n, err
}

// lossyRawUDPConn is lossyUDPConn on a socket with raw system calls (rawsock):
// a type of its own, as quic-go finds a socket's batched reads by its
// method set.
type lossyRawUDPConn struct {
	*rawsock.UDPConn
	log *dropLog
}

// WriteMsgUDP is what quic-go sends with on a UDP socket.
func (c *lossyRawUDPConn) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (n, oobn int, err error) {
	n, oobn, err = c.UDPConn.WriteMsgUDP(b, oob, addr)
	if c.log.lost(err) {
		return len(b), len(oob), nil
	}
	return n, oobn, err
}

func (c *lossyRawUDPConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	n, err := c.UDPConn.WriteTo(b, addr)
	if c.log.lost(err) {
		return len(b), nil
	}
	return n, err
}

type lossyPacketConn struct {
	net.PacketConn
	log *dropLog
}

func (c *lossyPacketConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	n, err := c.PacketConn.WriteTo(b, addr)
	if c.log.lost(err) {
		return len(b), nil
	}
	return n, err
}
