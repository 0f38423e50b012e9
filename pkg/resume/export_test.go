package resume

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil/tcptest"
	"github.com/quictun/quictun/pkg/proto"
)

// TestPipeExportImport: the server's end of a parked tunnel is exported
// (while its application keeps writing past the cap) and imported as a
// new Pipe, twice; the client re-attaches to the imported one each time and
// every byte arrives whole and in order both ways (SHA-256); the exported
// Pipe ends with ErrHandedOver and gives its budget back.
func TestPipeExportImport(t *testing.T) {
	t.Parallel()
	const n = 4 << 20
	budget := NewBudget(0)
	tu := newTunnel(t, Config{Cap: 2 * ChunkSize, Budget: budget})
	var conn atomic.Value
	conn.Store(1)
	stopAck := tu.acker(&conn)
	defer func() { stopAck() }()
	up, upGot := transfer(tu.appC, tu.appS, n)
	down, downGot := transfer(tu.appS, tu.appC, n)
	a, b, cliErr, srvErr := tu.attach(1, false)
	for i, at := range []uint64{n / 4, n / 2} {
		require.Eventually(t, func() bool { return tu.cli.Received() > at && tu.srv.Received() > at }, 30*time.Second, time.Millisecond)
		kill(a, b)
		require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
		require.ErrorIs(t, recvErr(t, srvErr), ErrParked)
		stopAck() // it reads tu.srv
		old := tu.srv
		st, err := old.Export()
		require.NoError(t, err)
		require.ErrorIs(t, recvErr(t, tu.ended), ErrHandedOver)
		<-old.Ended()
		assert.LessOrEqual(t, len(st.Data), 2*ChunkSize+ExtraBytes, "the cap plus one read")
		assert.Equal(t, old.Received(), st.Received)
		_, err = old.Export()
		require.ErrorIs(t, err, ErrNotParked, "an exported tunnel is not exported twice")
		imp, err := Import(st, Config{Cap: 2 * ChunkSize, Budget: budget, Events: tu.events,
			OnEnd: func(err error) { tu.ended <- err }})
		require.NoError(t, err)
		assert.Equal(t, st.Received, imp.Received())
		tu.srv = imp
		conn.Store(i + 2)
		stopAck = tu.acker(&conn)
		a, b, cliErr, srvErr = tu.attach(i+2, true)
	}
	require.NoError(t, recvErr(t, cliErr))
	require.NoError(t, recvErr(t, srvErr))
	assert.Equal(t, <-up, <-upGot, "client to server")
	assert.Equal(t, <-down, <-downGot, "server to client")
	require.NoError(t, recvErr(t, tu.ended))
	require.NoError(t, recvErr(t, tu.ended))
	assert.Zero(t, budget.Used(), "every chunk given back")
}

// TestExportRunningTunnel: only a parked tunnel is exported; a running one
// is left running (its bytes still arrive).
func TestExportRunningTunnel(t *testing.T) {
	t.Parallel()
	tu := newTunnel(t, Config{})
	a, b, cliErr, srvErr := tu.attach(1, false)
	_, err := tu.srv.Export()
	require.ErrorIs(t, err, ErrNotParked)
	require.NoError(t, echoThrough(tu.appC, tu.appS, "still running"))
	kill(a, b)
	require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
	require.ErrorIs(t, recvErr(t, srvErr), ErrParked)
	tu.cli.Abort(0)
	tu.srv.Abort(0)
}

// echoThrough writes msg on w and reads it on r.
func echoThrough(w, r net.Conn, msg string) error {
	if _, err := w.Write([]byte(msg)); err != nil {
		return err
	}
	_ = r.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(r, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo mismatch")
	}
	return nil
}

// TestImportBounds: a State over the cap or over the budget is refused
// with a clear error; nothing is held (budget 0) and the application's
// connection is reset, not closed cleanly.
func TestImportBounds(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		data   int
		cap    int
		budget int64
		want   error
	}{
		{name: "over the cap", data: 2*ChunkSize + ExtraBytes + 1, cap: 2 * ChunkSize, want: ErrTooLarge},
		{name: "over the budget", data: 3 * ChunkSize, cap: 4 * ChunkSize, budget: 2 * ChunkSize, want: ErrBudget},
		{name: "at the bound", data: 2*ChunkSize + ExtraBytes, cap: 2 * ChunkSize},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			app, ours := tcptest.Pair(t)
			f, err := ours.File()
			require.NoError(t, err)
			require.NoError(t, ours.Close())
			budget := NewBudget(tc.budget)
			ended := make(chan error, 1)
			st := &State{Window: time.Minute, Base: 100, Data: make([]byte, tc.data), Conn: f}
			p, err := Import(st, Config{Cap: tc.cap, Budget: budget, OnEnd: func(err error) { ended <- err }})
			if tc.want == nil {
				require.NoError(t, err)
				assert.Equal(t, int64(3*ChunkSize), budget.Used(), "whole chunks")
				p.GiveUp(GaveUpShutdown)
				require.Error(t, recvErr(t, ended))
				assert.Zero(t, budget.Used())
				return
			}
			require.ErrorIs(t, err, tc.want)
			assert.Nil(t, p)
			assert.Zero(t, budget.Used(), "nothing held")
			_ = app.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, rerr := app.Read(make([]byte, 1))
			assert.ErrorIs(t, rerr, syscall.ECONNRESET, "the application sees a reset")
		})
	}
}

// TestImportedTunnelWindow: an imported tunnel that is not re-attached
// gives up when its window passes.
func TestImportedTunnelWindow(t *testing.T) {
	t.Parallel()
	app, ours := tcptest.Pair(t)
	f, err := ours.File()
	require.NoError(t, err)
	require.NoError(t, ours.Close())
	ended := make(chan error, 1)
	_, err = Import(&State{Window: 50 * time.Millisecond, Conn: f}, Config{OnEnd: func(err error) { ended <- err }})
	require.NoError(t, err)
	var g *GaveUpError
	require.ErrorAs(t, recvErr(t, ended), &g)
	assert.Equal(t, GaveUpWindow, g.Reason)
	_ = app.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, rerr := app.Read(make([]byte, 1))
	assert.Error(t, rerr)
}

// TestImportedFirstServeChecksOffset: the first Serve of an imported
// tunnel is a re-attachment like any other: a peer offset behind what it
// confirmed before the hand-over is refused (offset), not taken as the
// start of a new tunnel's first stream (which goes on after
// Config.Written without a check).
func TestImportedFirstServeChecksOffset(t *testing.T) {
	t.Parallel()
	_, ours := tcptest.Pair(t)
	f, err := ours.File()
	require.NoError(t, err)
	require.NoError(t, ours.Close())
	ended := make(chan error, 1)
	p, err := Import(&State{Window: time.Minute, Base: 100, Data: []byte("unconfirmed"), Conn: f},
		Config{OnEnd: func(err error) { ended <- err }})
	require.NoError(t, err)
	a, b := streamPair()
	served := make(chan error, 1)
	go func() { served <- p.Serve(&Attachment{Stream: a, PeerOffset: 0, Reply: true, Conn: 1}) }()
	var g *GaveUpError
	select {
	case err = <-served:
	case <-time.After(10 * time.Second):
		kill(a, b)
		<-served
		t.Fatal("Serve went on without checking the offset")
	}
	require.ErrorAs(t, err, &g)
	assert.Equal(t, GaveUpOffset, g.Reason)
	require.Error(t, recvErr(t, ended))
}

// TestExportKeepsConfirmed: a tunnel whose peer had confirmed every byte
// sent is imported knowing it (Confirmed: the new process re-attaches
// without waiting for the reply); one with bytes in flight is imported
// not knowing what the peer holds.
func TestExportKeepsConfirmed(t *testing.T) {
	t.Parallel()
	for _, inFlight := range []bool{false, true} {
		tu := newTunnel(t, Config{})
		parkConfirmed(t, tu, "ping")
		if inFlight {
			// A write on the next stream, lost before any confirmation.
			a, b := streamPair()
			cliErr := make(chan error, 1)
			go func() { cliErr <- tu.cli.Serve(&Attachment{Stream: a, PeerOffset: 4, Reply: false, Conn: 2}) }()
			_, err := tu.appC.Write([]byte("more"))
			require.NoError(t, err)
			_, err = io.ReadFull(b, make([]byte, 4))
			require.NoError(t, err)
			kill(a, b)
			require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
		}
		st, err := tu.cli.Export()
		require.NoError(t, err)
		require.ErrorIs(t, recvErr(t, tu.ended), ErrHandedOver)
		assert.Equal(t, !inFlight, st.Confirmed, "in flight: %v", inFlight)
		imp, err := Import(st, Config{OnEnd: func(err error) { tu.ended <- err }})
		require.NoError(t, err)
		off, all := imp.out.Confirmed()
		assert.Equal(t, !inFlight, all, "in flight: %v", inFlight)
		assert.Equal(t, uint64(4), off)
		imp.Abort(proto.CodeConnReset)
		tu.srv.Abort(proto.CodeConnReset)
		recvErr(t, tu.ended)
		recvErr(t, tu.ended)
	}
}
