//go:build linux

package handover

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/resume"
)

// pair returns both ends of a handover socket pair, in this process.
func pair(t *testing.T) (parent, child *Conn) {
	t.Helper()
	parent, cf, err := Pair()
	require.NoError(t, err)
	child, err = newConn(cf)
	require.NoError(t, err)
	t.Cleanup(func() { _ = parent.Close(); _ = child.Close() })
	deadline := time.Now().Add(30 * time.Second)
	require.NoError(t, parent.SetDeadline(deadline))
	require.NoError(t, child.SetDeadline(deadline))
	return parent, child
}

// openFDs counts this process's descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// tcpFile returns the file of one end of a loopback TCP connection and
// the other end.
func tcpFile(t *testing.T) (*os.File, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	s, err := ln.Accept()
	require.NoError(t, err)
	f, err := s.(*net.TCPConn).File()
	require.NoError(t, err)
	require.NoError(t, s.Close())
	t.Cleanup(func() { _ = c.Close() })
	return f, c
}

var bigLimits = Limits{MaxTunnels: 100, MaxTunnelBytes: 8 << 20, MaxTotalBytes: 64 << 20}

// TestRoundTrip: listeners, ready, three tunnels (one with bytes over
// several data messages, one with none) and done arrive as sent, and the
// descriptors received are the sockets sent.
func TestRoundTrip(t *testing.T) {
	parent, child := pair(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	lf, err := ln.(*net.TCPListener).File()
	require.NoError(t, err)
	defer lf.Close()
	big := make([]byte, 3*dataPiece+123)
	_, _ = rand.Read(big)
	var sent []Tunnel
	var apps []net.Conn
	for i, data := range [][]byte{big, nil, []byte("tail")} {
		f, app := tcpFile(t)
		defer f.Close()
		apps = append(apps, app)
		tu := Tunnel{UUID: "uuid-" + string(rune('a'+i)), Destination: "tcp:127.0.0.1:22", Source: "127.0.0.1:5000", Endpoint: "tcp:127.0.0.1:2222", Server: "server-" + string(rune('a'+i)),
			CreatedAt: time.Unix(1700000000, int64(i))}
		tu.ID[0] = byte(i + 1)
		tu.Identity, tu.Window, tu.Received, tu.Base, tu.Data = "key=alice", time.Minute, uint64(1000+i), uint64(77*i), data
		tu.EOF, tu.DownDone, tu.Confirmed, tu.ToStream, tu.FromStream, tu.Conn = i == 2, i == 1, i == 0, int64(5*i), int64(6*i), f
		sent = append(sent, tu)
	}
	errc := make(chan error, 1)
	go func() {
		if err := parent.SendListeners([]Listener{{Name: "tcp", File: lf}}); err != nil {
			errc <- err
			return
		}
		if _, err := parent.WaitReady(time.Now().Add(10 * time.Second)); err != nil {
			errc <- err
			return
		}
		errc <- parent.SendTunnels(sent)
	}()
	ls, err := child.RecvListeners()
	require.NoError(t, err)
	require.Len(t, ls, 1)
	assert.Equal(t, "tcp", ls[0].Name)
	fl, err := net.FileListener(ls[0].File)
	require.NoError(t, err)
	_ = ls[0].File.Close()
	assert.Equal(t, ln.Addr().String(), fl.Addr().String(), "the same listening socket")
	_ = fl.Close()
	require.NoError(t, child.SendReady(os.Getpid()))
	got, err := child.RecvTunnels(bigLimits)
	require.NoError(t, err)
	require.NoError(t, <-errc)
	require.Len(t, got, len(sent))
	for i := range got {
		g, s := got[i], sent[i]
		assert.True(t, bytes.Equal(s.Data, g.Data), "tunnel %d bytes", i)
		g.Data, s.Data = nil, nil
		gc, sc := g.Conn, s.Conn
		g.Conn, s.Conn = nil, nil
		assert.Equal(t, s.CreatedAt.UnixNano(), g.CreatedAt.UnixNano())
		g.CreatedAt, s.CreatedAt = time.Time{}, time.Time{}
		assert.Equal(t, s, g, "tunnel %d", i)
		nc, err := net.FileConn(gc)
		require.NoError(t, err)
		_ = gc.Close()
		_ = sc
		_, err = nc.Write([]byte("hi"))
		require.NoError(t, err)
		buf := make([]byte, 2)
		_, err = io.ReadFull(apps[i], buf)
		require.NoError(t, err)
		assert.Equal(t, "hi", string(buf), "tunnel %d's socket reaches its application", i)
		_ = nc.Close()
	}
	go func() { errc <- child.SendDone(len(got), "") }()
	n, err := parent.WaitDone(time.Now().Add(10 * time.Second))
	require.NoError(t, err)
	assert.Equal(t, len(sent), n)
	require.NoError(t, <-errc)
}

// TestRecvTunnelsBounds: tunnels past the receiver's Limits are refused
// with ErrBounds, and every descriptor received so far is closed.
func TestRecvTunnelsBounds(t *testing.T) {
	cases := []struct {
		name  string
		sizes []int
		lim   Limits
	}{
		{name: "too many tunnels", sizes: []int{1, 1, 1}, lim: Limits{MaxTunnels: 2, MaxTunnelBytes: 10, MaxTotalBytes: 100}},
		{name: "one tunnel too large", sizes: []int{10, 11}, lim: Limits{MaxTunnels: 5, MaxTunnelBytes: 10, MaxTotalBytes: 100}},
		{name: "too many bytes in all", sizes: []int{10, 10, 10}, lim: Limits{MaxTunnels: 5, MaxTunnelBytes: 10, MaxTotalBytes: 25}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			parent, child := pair(t)
			var ts []Tunnel
			for _, n := range tc.sizes {
				f, _ := tcpFile(t)
				defer f.Close()
				tu := Tunnel{}
				tu.Window, tu.Data, tu.Conn = time.Minute, make([]byte, n), f
				ts = append(ts, tu)
			}
			before := openFDs(t)
			sent := make(chan struct{})
			go func() { defer close(sent); _ = parent.SendTunnels(ts) }()
			got, err := child.RecvTunnels(tc.lim)
			require.ErrorIs(t, err, ErrBounds)
			assert.Nil(t, got)
			assert.Equal(t, before, openFDs(t), "nothing held")
			_ = child.Close() // the sender's next write fails
			<-sent
		})
	}
}

// TestMalformed: a message that is not well formed, of another version or
// type, over MaxMessage, with too many descriptors, or a parent gone half
// way is refused with a clear error, and no descriptor is kept.
func TestMalformed(t *testing.T) {
	record := func() []byte { var tu Tunnel; tu.Window = time.Minute; return encodeTunnel(&tu) }
	withLen := func(n uint64) []byte {
		var tu Tunnel
		tu.Window, tu.Data = time.Minute, make([]byte, n)
		return encodeTunnel(&tu)
	}
	raw := func(hdr []byte, body []byte) []byte { return append(append([]byte{}, hdr...), body...) }
	cases := []struct {
		name string
		msgs [][]byte // raw messages; each tunnel record carries fds descriptors
		fds  int
		want string
	}{
		{name: "bad magic", msgs: [][]byte{raw([]byte{'X', 'H', Version, msgTunnel}, record())}, fds: 1, want: "not a handover message"},
		{name: "other version", msgs: [][]byte{raw([]byte{'Q', 'H', Version + 1, msgTunnel}, record())}, fds: 1, want: "version 2"},
		{name: "record cut short", msgs: [][]byte{raw([]byte{'Q', 'H', Version, msgTunnel}, record()[:20])}, fds: 1, want: "message ends early"},
		{name: "trailing bytes", msgs: [][]byte{raw([]byte{'Q', 'H', Version, msgTunnel}, append(record(), 0))}, fds: 1, want: "trailing bytes"},
		{name: "zero window", msgs: [][]byte{raw([]byte{'Q', 'H', Version, msgTunnel}, make([]byte, len(record())))}, fds: 1, want: "tunnel record"},
		{name: "tunnel without its socket", msgs: [][]byte{raw([]byte{'Q', 'H', Version, msgTunnel}, record())}, fds: 0, want: "0 descriptors"},
		{name: "two descriptors", msgs: [][]byte{raw([]byte{'Q', 'H', Version, msgTunnel}, record())}, fds: 2, want: "2 descriptors"},
		{name: "ready where a tunnel is due", msgs: [][]byte{raw([]byte{'Q', 'H', Version, msgReady}, make([]byte, 8))}, want: "message type 2"},
		{name: "over MaxMessage", msgs: [][]byte{raw([]byte{'Q', 'H', Version, msgTunnel}, make([]byte, MaxMessage))}, fds: 1, want: "message over"},
		{name: "more data than declared", msgs: [][]byte{raw([]byte{'Q', 'H', Version, msgTunnel}, withLen(3)), raw([]byte{'Q', 'H', Version, msgData}, []byte("four"))}, fds: 1, want: "more tunnel bytes"},
		{name: "end count wrong", msgs: [][]byte{raw([]byte{'Q', 'H', Version, msgEnd}, make([]byte, 8)[:7])}, want: "message ends early"},
		{name: "parent gone half way", msgs: [][]byte{raw([]byte{'Q', 'H', Version, msgTunnel}, withLen(10))}, fds: 1, want: "closed the handover socket"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			parent, child := pair(t)
			f, _ := tcpFile(t)
			defer f.Close()
			before := openFDs(t)
			for i, m := range tc.msgs {
				var oob []byte
				if i == 0 && tc.fds > 0 {
					fds := make([]int, tc.fds)
					for j := range fds {
						fds[j] = int(f.Fd())
					}
					oob = syscall.UnixRights(fds...)
				}
				_, _, err := parent.c.WriteMsgUnix(m, oob, nil)
				require.NoError(t, err)
			}
			if tc.want == "closed the handover socket" {
				_ = parent.Close()
				before--
			}
			got, err := child.RecvTunnels(bigLimits)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Nil(t, got)
			assert.Equal(t, before, openFDs(t), "nothing held")
		})
	}
}

// TestListenersMalformed: a listeners message whose names and descriptors
// disagree is refused and its descriptors closed.
func TestListenersMalformed(t *testing.T) {
	parent, child := pair(t)
	f, _ := tcpFile(t)
	defer f.Close()
	before := openFDs(t)
	var w writer
	w.u8(2)
	w.str("udp")
	w.str("tcp")
	require.NoError(t, parent.send(msgListeners, w.b, int(f.Fd())))
	_, err := child.RecvListeners()
	require.ErrorIs(t, err, ErrProtocol)
	assert.Equal(t, before, openFDs(t), "nothing held")
}

// TestWaitReadyChildExits: a child that exits without a word ends the
// wait at once with an error.
func TestWaitReadyChildExits(t *testing.T) {
	parent, child := pair(t)
	_ = child.Close()
	start := time.Now()
	_, err := parent.WaitReady(time.Now().Add(10 * time.Second))
	require.Error(t, err)
	assert.Less(t, time.Since(start), 5*time.Second)
}

// TestSendKeepsSocketsNonBlocking: sending a listener leaves the sender's
// own socket non-blocking (os.File.Fd would make the shared file
// description blocking, and the sender's listener would then block its
// Close in accept(2) after a failed upgrade).
func TestSendKeepsSocketsNonBlocking(t *testing.T) {
	parent, child := pair(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, parent.SendListeners([]Listener{{Name: "tcp", File: f}}))
	ls, err := child.RecvListeners()
	require.NoError(t, err)
	closeFiles([]*os.File{ls[0].File})
	rc, err := ln.(*net.TCPListener).SyscallConn()
	require.NoError(t, err)
	var flags int
	require.NoError(t, rc.Control(func(fd uintptr) { flags, err = unixFcntlGetfl(int(fd)) }))
	require.NoError(t, err)
	assert.NotZero(t, flags&syscall.O_NONBLOCK, "the listener stays non-blocking")
}

func unixFcntlGetfl(fd int) (int, error) {
	r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFL, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// BenchmarkTunnels1000 sends and receives the tunnels of an upgrade with
// 1,000 resumable tunnels, each with 1000 bytes to resend: the part of a
// client's or server's upgrade stall spent on the socket pair. A fresh
// 64 KiB buffer per received message made it 165-206 ms and 151 MB
// allocated per hand-over; 30-41 ms and 5 MB with the buffer reused (2
// cores, load 6-8).
func BenchmarkTunnels1000(b *testing.B) {
	files := make([]*os.File, 1000)
	ts := make([]Tunnel, len(files))
	for i := range files {
		f, err := os.Open(os.DevNull)
		require.NoError(b, err)
		b.Cleanup(func() { _ = f.Close() })
		files[i] = f
		tu := Tunnel{UUID: "uuid", Destination: "tcp:127.0.0.1:22", Source: "127.0.0.1:5000", Endpoint: "tcp:127.0.0.1:2222",
			CreatedAt: time.Now()}
		tu.ID[0], tu.ID[1] = byte(i), byte(i>>8)
		tu.Window, tu.Data, tu.Conn = time.Minute, make([]byte, 1000), f
		ts[i] = tu
	}
	lim := Limits{MaxTunnels: len(ts), MaxTunnelBytes: 8 << 20, MaxTotalBytes: 1 << 30}
	b.ReportAllocs()
	for b.Loop() {
		parent, cf, err := Pair()
		require.NoError(b, err)
		child, err := newConn(cf)
		require.NoError(b, err)
		errc := make(chan error, 1)
		go func() { errc <- parent.SendTunnels(ts) }()
		got, err := child.RecvTunnels(lim)
		require.NoError(b, err)
		require.NoError(b, <-errc)
		require.Len(b, got, len(ts))
		for _, g := range got {
			_ = g.Conn.Close()
		}
		_ = parent.Close()
		_ = child.Close()
	}
}

// TestReleasedThenTunnels: a server's old process sends released, the
// tunnels, then saved; a parent that does not send released (an older
// one) sends the tunnels at once: RecvReleased says which, and RecvTunnels
// gets every tunnel either way (the first one read ahead included, with
// its descriptor). Descriptors are not leaked.
func TestReleasedThenTunnels(t *testing.T) {
	for _, tc := range []struct {
		name     string
		released bool
		tunnels  int
	}{
		{"released, two tunnels", true, 2},
		{"released, no tunnel", true, 0},
		{"older parent, two tunnels", false, 2},
		{"older parent, no tunnel", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent, child := pair(t)
			var sent []Tunnel
			for i := range tc.tunnels {
				f, _ := tcpFile(t)
				defer f.Close()
				sent = append(sent, Tunnel{UUID: "uuid-" + string(rune('a'+i)), State: resumeState(f, []byte("bytes"))})
			}
			fds := openFDs(t)
			errc := make(chan error, 1)
			go func() {
				if tc.released {
					if err := parent.SendReleased(); err != nil {
						errc <- err
						return
					}
				}
				if err := parent.SendTunnels(sent); err != nil {
					errc <- err
					return
				}
				if tc.released {
					errc <- parent.SendSaved()
					return
				}
				errc <- nil
			}()
			released, err := child.RecvReleased()
			require.NoError(t, err)
			assert.Equal(t, tc.released, released)
			got, err := child.RecvTunnels(bigLimits)
			require.NoError(t, err)
			require.Len(t, got, tc.tunnels)
			for i := range got {
				assert.Equal(t, sent[i].UUID, got[i].UUID)
				assert.Equal(t, []byte("bytes"), got[i].Data)
				require.NoError(t, got[i].Conn.Close())
			}
			if tc.released {
				require.NoError(t, child.RecvSaved())
			}
			require.NoError(t, <-errc)
			assert.Equal(t, fds, openFDs(t), "every descriptor received was closed")
		})
	}
}

// TestReadAheadClosed: a tunnel read ahead by RecvReleased and never
// taken is closed with the Conn.
func TestReadAheadClosed(t *testing.T) {
	parent, cf, err := Pair()
	require.NoError(t, err)
	defer parent.Close()
	child, err := newConn(cf)
	require.NoError(t, err)
	f, _ := tcpFile(t)
	defer f.Close()
	fds := openFDs(t)
	require.NoError(t, parent.SendTunnels([]Tunnel{{UUID: "a", State: resumeState(f, nil)}}))
	released, err := child.RecvReleased()
	require.NoError(t, err)
	require.False(t, released)
	assert.Equal(t, fds+1, openFDs(t), "the tunnel's descriptor, read ahead")
	require.NoError(t, child.Close())
	assert.Equal(t, fds-1, openFDs(t), "the read-ahead descriptor and the child's end closed")
}

// resumeState is a tunnel's state on f with data.
func resumeState(f *os.File, data []byte) resume.State {
	return resume.State{ID: resume.ID{1}, Window: time.Minute, Data: data, Conn: f}
}

// TestRecvTunnelsEachParentGone: the tunnels given before the parent went
// away stay the receiver's; the error says the parent is gone.
func TestRecvTunnelsEachParentGone(t *testing.T) {
	parent, child := pair(t)
	f, _ := tcpFile(t)
	defer f.Close()
	st := resumeState(f, []byte("bytes"))
	require.NoError(t, parent.send(msgTunnel, encodeTunnel(&Tunnel{UUID: "a", State: st}), mustFD(t, f)))
	require.NoError(t, parent.send(msgData, st.Data))
	require.NoError(t, parent.Close())
	var got []Tunnel
	n, err := child.RecvTunnelsEach(bigLimits, func(tu Tunnel) { got = append(got, tu) })
	require.ErrorIs(t, err, errPeerClosed)
	assert.Equal(t, 1, n)
	require.Len(t, got, 1)
	assert.Equal(t, "a", got[0].UUID)
	assert.Equal(t, []byte("bytes"), got[0].Data)
	require.NoError(t, got[0].Conn.Close())
}

func mustFD(t *testing.T, f *os.File) int {
	t.Helper()
	fd, err := rawFD(f)
	require.NoError(t, err)
	return fd
}

// TestSendEach: each state exported goes out before the next is exported
// (the new process takes it meanwhile) with its record and bytes, its
// socket closed once sent; the receiver of SendTunnels' messages
// (RecvTunnels, an older binary's) gets them all. After a send fails,
// nothing more is sent, the rest are still closed, and the error says how
// many went.
func TestSendEach(t *testing.T) {
	t.Parallel()
	for _, failAt := range []int{-1, 1} {
		t.Run("fail at "+strconv.Itoa(failAt), func(t *testing.T) {
			t.Parallel()
			parent, child := pair(t)
			var files []*os.File
			for range 3 {
				f, _ := tcpFile(t)
				files = append(files, f)
			}
			var log []string
			export := func(each func(*resume.State)) {
				for i, f := range files {
					log = append(log, "export "+strconv.Itoa(i))
					st := resumeState(f, []byte("bytes "+strconv.Itoa(i)))
					st.ID[0] = byte(i + 1)
					each(&st)
				}
			}
			sent := 0
			s := Sender{
				Tunnel: func(tu *Tunnel) error {
					log = append(log, "send "+strconv.Itoa(int(tu.ID[0]-1)))
					if sent == failAt {
						return errors.New("planted")
					}
					sent++
					return parent.SendTunnel(tu)
				},
				End: parent.SendEnd,
			}
			got := make(chan []Tunnel, 1)
			go func() {
				ts, _ := child.RecvTunnels(bigLimits)
				got <- ts
			}()
			n, err := SendEach(export, s)
			for _, f := range files {
				assert.ErrorIs(t, f.Close(), os.ErrClosed, "closed once handed over or given up")
			}
			if failAt >= 0 {
				require.ErrorContains(t, err, "1 sent")
				assert.Equal(t, 1, n)
				assert.Equal(t, []string{"export 0", "send 0", "export 1", "send 1", "export 2"}, log)
				require.NoError(t, parent.Close())
				assert.Nil(t, <-got, "no end: the receiver lets go of what came")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, 3, n)
			assert.Equal(t, []string{"export 0", "send 0", "export 1", "send 1", "export 2", "send 2"}, log)
			ts := <-got
			require.Len(t, ts, 3)
			for i, tu := range ts {
				assert.Equal(t, "bytes "+strconv.Itoa(i), string(tu.Data))
				require.NoError(t, tu.Conn.Close())
			}
		})
	}
}
