package handover

import (
	"fmt"
	"os"
	"time"
)

// Flags of a tunnel record. A build that does not know a flag ignores
// it: flagConfirmed only saves a round trip (resume.State.Confirmed).
const (
	flagEOF byte = 1 << iota
	flagDownDone
	flagConfirmed
)

// SendTunnels sends the tunnels (the parent): for each a record with its
// application socket, then its bytes in pieces; then the count. The files
// stay the caller's.
func (c *Conn) SendTunnels(ts []Tunnel) error {
	for i := range ts {
		if err := c.SendTunnel(&ts[i]); err != nil {
			return err
		}
	}
	return c.SendEnd(len(ts))
}

// SendTunnel sends one tunnel (the parent): its record with its
// application socket, then its bytes in pieces; SendEnd follows the last.
// The file stays the caller's.
func (c *Conn) SendTunnel(t *Tunnel) error {
	fd, err := rawFD(t.Conn)
	if err != nil {
		return err
	}
	if err := c.send(msgTunnel, encodeTunnel(t), fd); err != nil {
		return err
	}
	for rest := t.Data; len(rest) > 0; {
		k := min(len(rest), dataPiece)
		if err := c.send(msgData, rest[:k]); err != nil {
			return err
		}
		rest = rest[k:]
	}
	return nil
}

// SendEnd ends the tunnels (the parent): n is how many were sent.
func (c *Conn) SendEnd(n int) error {
	var w writer
	w.u64(uint64(n))
	return c.send(msgEnd, w.b)
}

func encodeTunnel(t *Tunnel) []byte {
	var w writer
	w.b = append(w.b, t.ID[:]...)
	w.u64(uint64(t.Window))
	w.u64(t.Received)
	w.u64(t.Base)
	w.u64(uint64(len(t.Data)))
	var flags byte
	if t.EOF {
		flags |= flagEOF
	}
	if t.DownDone {
		flags |= flagDownDone
	}
	if t.Confirmed {
		flags |= flagConfirmed
	}
	w.u8(flags)
	w.u64(uint64(t.ToStream))
	w.u64(uint64(t.FromStream))
	w.u64(uint64(t.CreatedAt.UnixNano()))
	w.str(t.Identity)
	w.str(t.UUID)
	w.str(t.Destination)
	w.str(t.Source)
	w.str(t.Endpoint)
	w.str(t.Server)
	return w.b
}

// decodeTunnel decodes a record; it returns the length of its bytes.
func decodeTunnel(body []byte, t *Tunnel) (int, error) {
	r := reader{b: body}
	copy(t.ID[:], r.take(len(t.ID)))
	t.Window = time.Duration(r.u64())
	t.Received, t.Base = r.u64(), r.u64()
	n := r.u64()
	flags := r.u8()
	t.EOF, t.DownDone, t.Confirmed = flags&flagEOF != 0, flags&flagDownDone != 0, flags&flagConfirmed != 0
	t.ToStream, t.FromStream = int64(r.u64()), int64(r.u64())
	t.CreatedAt = time.Unix(0, int64(r.u64()))
	t.Identity, t.UUID, t.Destination, t.Source, t.Endpoint, t.Server = r.str(), r.str(), r.str(), r.str(), r.str(), r.str()
	if err := r.done(); err != nil {
		return 0, err
	}
	if t.Window <= 0 || n > 1<<40 {
		return 0, fmt.Errorf("%w: tunnel record (window %s, %d bytes)", ErrProtocol, t.Window, n)
	}
	return int(n), nil
}

// RecvTunnels receives the tunnels (the child) within lim. On any error —
// malformed, over a bound, the parent gone — every descriptor and byte
// received is let go and the error says which.
func (c *Conn) RecvTunnels(lim Limits) (ts []Tunnel, err error) {
	_, err = c.RecvTunnelsEach(lim, func(t Tunnel) { ts = append(ts, t) })
	if err != nil {
		for i := range ts {
			_ = ts[i].Conn.Close()
		}
		return nil, err
	}
	return ts, nil
}

// RecvTunnelsEach receives the tunnels (the child) within lim and gives
// each to each as soon as it is complete (each then owns it: an upgrade's
// new server imports it while the next one comes). It returns how many
// it gave. On an error the tunnels given stay each's; the one being
// received is let go.
func (c *Conn) RecvTunnelsEach(lim Limits, each func(Tunnel)) (int, error) {
	var total int64
	count := 0
	for {
		body, files, err := c.recvTunnelOrEnd()
		if err != nil {
			return count, err
		}
		if files == nil { // end
			r := reader{b: body}
			n := r.u64()
			if err := r.done(); err != nil {
				return count, err
			}
			if n != uint64(count) {
				return count, fmt.Errorf("%w: end says %d tunnels, %d were sent", ErrProtocol, n, count)
			}
			return count, nil
		}
		var t Tunnel
		t.Conn = files[0]
		n, err := decodeTunnel(body, &t)
		if err == nil {
			err = checkBounds(lim, count+1, n, total+int64(n))
		}
		if err == nil {
			t.Data, err = c.recvData(n)
		}
		if err != nil {
			_ = t.Conn.Close()
			return count, err
		}
		total += int64(n)
		count++
		each(t)
	}
}

// recvTunnelOrEnd reads the next message: a tunnel record (with its one
// descriptor) or the end (files nil).
func (c *Conn) recvTunnelOrEnd() ([]byte, []*os.File, error) {
	typ, body, files, err := c.next(1)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case typ == msgEnd && len(files) == 0:
		return body, nil, nil
	case typ == msgTunnel && len(files) == 1:
		return body, files, nil
	}
	closeFiles(files)
	return nil, nil, fmt.Errorf("%w: message type %d with %d descriptors where a tunnel or the end was due", ErrProtocol, typ, len(files))
}

// recvData reads n bytes of data messages.
func (c *Conn) recvData(n int) ([]byte, error) {
	data := make([]byte, 0, n)
	for len(data) < n {
		body, _, err := c.recv(msgData, 0, false)
		if err != nil {
			return nil, err
		}
		if len(data)+len(body) > n {
			return nil, fmt.Errorf("%w: more tunnel bytes than its record says (%d)", ErrProtocol, n)
		}
		data = append(data, body...)
	}
	return data, nil
}

// checkBounds refuses the tunnels past lim: count of them, one's bytes, the
// total.
func checkBounds(lim Limits, count, n int, total int64) error {
	switch {
	case count > lim.MaxTunnels:
		return fmt.Errorf("%w: more than %d tunnels", ErrBounds, lim.MaxTunnels)
	case n > lim.MaxTunnelBytes:
		return fmt.Errorf("%w: a tunnel of %d bytes > %d", ErrBounds, n, lim.MaxTunnelBytes)
	case total > lim.MaxTotalBytes:
		return fmt.Errorf("%w: tunnels of more than %d bytes in all", ErrBounds, lim.MaxTotalBytes)
	}
	return nil
}
