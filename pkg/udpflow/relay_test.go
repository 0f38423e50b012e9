package udpflow_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/internal/testutil/quictest"
	"github.com/quictun/quictun/pkg/dgram"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/splice"
	"github.com/quictun/quictun/pkg/udpflow"
)

// local is a fake local side: packets the application sends (in) and those
// delivered to it (out).
type local struct {
	in     chan []byte
	closed chan struct{}
	once   sync.Once
	mu     sync.Mutex
	out    [][]byte
	got    chan struct{}
}

func newLocal() *local {
	return &local{in: make(chan []byte, 64), closed: make(chan struct{}), got: make(chan struct{}, 1024)}
}

func (l *local) recv(buf []byte) ([]byte, error) {
	select {
	case p := <-l.in:
		return append(buf[:0], p...), nil
	case <-l.closed:
		return nil, io.EOF
	}
}

func (l *local) deliver(p []byte) error {
	l.mu.Lock()
	l.out = append(l.out, bytes.Clone(p))
	l.mu.Unlock()
	l.got <- struct{}{}
	return nil
}

func (l *local) close() { l.once.Do(func() { close(l.closed) }) }

func (l *local) wait(t *testing.T, n int) [][]byte {
	t.Helper()
	for range n {
		select {
		case <-l.got:
		case <-time.After(5 * time.Second):
			t.Fatalf("timed out waiting for %d packets", n)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][]byte(nil), l.out...)
}

type end struct {
	relay *udpflow.Relay
	local *local
	up    udpflow.Counters
	down  udpflow.Counters
	done  chan error
}

// flowPair opens a flow the way the daemons do: the client writes a header
// then its first packet on the stream; the server answers OK; then both
// relay, with datagrams routed by each connection's Table.
func flowPair(t *testing.T, idle time.Duration) (cli, srv *end) {
	t.Helper()
	cc, sc := quictest.Pair(t)
	tables := [2]*udpflow.Table{udpflow.NewTable(nil), udpflow.NewTable(nil)}
	ctx, cancel := context.WithCancel(context.Background())
	var muxes sync.WaitGroup
	for i, c := range []*quic.Conn{cc, sc} {
		m := dgram.NewMux(nil)
		m.Handle(udpflow.TypeUDP, tables[i].Handle)
		muxes.Go(func() { m.Run(ctx, c) })
	}
	t.Cleanup(func() { cancel(); muxes.Wait() })

	cstr, err := cc.OpenStreamSync(ctx)
	require.NoError(t, err)
	cli = &end{local: newLocal(), done: make(chan error, 1)}
	cli.relay = &udpflow.Relay{
		Stream: cstr, Sender: udpflow.NewSender(uint64(cstr.StreamID()), cc, cstr, &cli.up),
		Recv: cli.local.recv, Deliver: cli.local.deliver, CloseLocal: cli.local.close,
		AwaitReply: true, IdleTimeout: idle, Up: &cli.up, Down: &cli.down,
	}
	remove, ok := tables[0].Add(uint64(cstr.StreamID()), 0, cli.relay.FromDatagram)
	require.True(t, ok)
	t.Cleanup(remove)
	_, err = cstr.Write([]byte("hdr"))
	require.NoError(t, err)
	go func() { cli.done <- cli.relay.Run() }()
	cli.local.in <- []byte("first, on the stream")

	sstr, err := sc.AcceptStream(ctx)
	require.NoError(t, err)
	hdr := make([]byte, 3)
	_, err = io.ReadFull(sstr, hdr)
	require.NoError(t, err)
	srv = &end{local: newLocal(), done: make(chan error, 1)}
	srv.relay = &udpflow.Relay{
		Stream: sstr, Sender: udpflow.NewSender(uint64(sstr.StreamID()), sc, sstr, &srv.up),
		Recv: srv.local.recv, Deliver: srv.local.deliver, CloseLocal: srv.local.close,
		IdleTimeout: idle, Up: &srv.up, Down: &srv.down,
	}
	remove, ok = tables[1].Add(uint64(sstr.StreamID()), 0, srv.relay.FromDatagram)
	require.True(t, ok)
	t.Cleanup(remove)
	require.NoError(t, proto.WriteReply(sstr, proto.CodeOK))
	srv.relay.Sender.Establish()
	go func() { srv.done <- srv.relay.Run() }()
	return cli, srv
}

func TestRelayBothWays(t *testing.T) {
	cli, srv := flowPair(t, time.Minute)
	assert.Equal(t, [][]byte{[]byte("first, on the stream")}, srv.local.wait(t, 1))
	srv.local.in <- []byte("answer")
	assert.Equal(t, [][]byte{[]byte("answer")}, cli.local.wait(t, 1))
	assert.Equal(t, uint64(1), srv.up.Datagrams.Load(), "the server has the flow: datagrams at once")
	// Once the client has the reply, its packets go as datagrams too
	// (wait for it: the reply and the answer race).
	require.Eventually(t, func() bool {
		cli.local.in <- []byte("second")
		srv.local.wait(t, 1)
		return cli.up.Datagrams.Load() > 0
	}, 5*time.Second, 10*time.Millisecond)
	// A packet too large for a datagram is carried on the stream, whole.
	big := bytes.Repeat([]byte{'x'}, 4000)
	before := srv.down.StreamPackets.Load()
	cli.local.in <- big
	got := srv.local.wait(t, 1)
	assert.Equal(t, big, got[len(got)-1])
	assert.Equal(t, before+1, srv.down.StreamPackets.Load())

	// The client ends the flow (its listener closed): both ends finish cleanly.
	cli.local.close()
	require.NoError(t, <-cli.done)
	require.NoError(t, <-srv.done)
}

func TestRelayIdleTimeout(t *testing.T) {
	cli, srv := flowPair(t, 200*time.Millisecond)
	srv.local.wait(t, 1)
	start := time.Now()
	require.NoError(t, <-srv.done, "idle: a clean end")
	require.NoError(t, <-cli.done, "the peer's FIN ends the client's side")
	assert.Less(t, time.Since(start), 2*time.Second)
}

func TestRelayAbortReachesPeer(t *testing.T) {
	cli, srv := flowPair(t, time.Minute)
	srv.local.wait(t, 1)
	srv.relay.Abort(proto.CodeShutdown)
	var ab *splice.AbortedError
	require.ErrorAs(t, <-srv.done, &ab)
	assert.Equal(t, proto.CodeShutdown, ab.Code)
	require.ErrorAs(t, <-cli.done, &ab)
	assert.Equal(t, proto.CodeShutdown, ab.Code, "the client sees the server's code")
}

func TestRelayRefused(t *testing.T) {
	cc, sc := quictest.Pair(t)
	ctx := context.Background()
	cstr, err := cc.OpenStreamSync(ctx)
	require.NoError(t, err)
	l := newLocal()
	var up, down udpflow.Counters
	var replied error
	r := &udpflow.Relay{
		Stream: cstr, Sender: udpflow.NewSender(uint64(cstr.StreamID()), cc, cstr, &up),
		Recv: l.recv, Deliver: l.deliver, CloseLocal: l.close, AwaitReply: true,
		Replied: func(err error) { replied = err }, IdleTimeout: time.Minute, Up: &up, Down: &down,
	}
	done := make(chan error, 1)
	go func() { done <- r.Run() }()
	l.in <- []byte("query")
	sstr, err := sc.AcceptStream(ctx)
	require.NoError(t, err)
	require.NoError(t, proto.WriteReply(sstr, proto.CodeRefused))
	var ab *splice.AbortedError
	require.ErrorAs(t, <-done, &ab)
	assert.Equal(t, proto.CodeRefused, ab.Code)
	assert.True(t, errors.Is(replied, &proto.RemoteError{Code: proto.CodeRefused}))
}

func TestTableRoutesAndDrops(t *testing.T) {
	drops := map[string]int{}
	var mu sync.Mutex
	tab := udpflow.NewTable(func(r string) { mu.Lock(); drops[r]++; mu.Unlock() })
	var got [][]byte
	remove, ok := tab.Add(4, 2, func(p []byte) { got = append(got, bytes.Clone(p)) })
	require.True(t, ok)
	_, ok = tab.Add(4, 2, func([]byte) {})
	assert.False(t, ok, "an ID is taken once")
	remove8, ok := tab.Add(8, 2, func([]byte) {})
	require.True(t, ok)
	_, ok = tab.Add(12, 2, func([]byte) {})
	assert.False(t, ok, "at the limit")
	tab.Handle(udpflow.AppendDatagram(nil, 4, []byte("p")))
	tab.Handle(udpflow.AppendDatagram(nil, 5, []byte("q")))
	tab.Handle([]byte{udpflow.TypeUDP, 0x40})
	remove()
	remove() // idempotent
	tab.Handle(udpflow.AppendDatagram(nil, 4, []byte("late")))
	assert.Equal(t, [][]byte{[]byte("p")}, got)
	assert.Equal(t, map[string]int{udpflow.DropUnknownFlow: 2, udpflow.DropMalformed: 1}, drops)
	assert.Equal(t, 1, tab.Len())
	remove8()
	assert.Equal(t, 0, tab.Len())
}

// TestRelayDatagramBeforeRun: a datagram may reach a flow between its Table
// registration and Run (the peer is quick); delivering it must not race with
// Run's start.
func TestRelayDatagramBeforeRun(t *testing.T) {
	for range 20 {
		l := newLocal()
		r := &udpflow.Relay{Stream: nopStream{}, Deliver: l.deliver, Up: &udpflow.Counters{}, Down: &udpflow.Counters{}}
		done := make(chan struct{})
		go func() { defer close(done); r.FromDatagram([]byte("early")) }()
		r.Abort(proto.CodeShutdown) // initialises the relay as Run does
		<-done
		assert.Equal(t, uint64(1), r.Down.Datagrams.Load())
	}
}

type nopStream struct{}

func (nopStream) Read([]byte) (int, error)         { return 0, io.EOF }
func (nopStream) Write(b []byte) (int, error)      { return len(b), nil }
func (nopStream) Close() error                     { return nil }
func (nopStream) CancelRead(quic.StreamErrorCode)  {}
func (nopStream) CancelWrite(quic.StreamErrorCode) {}

// stalledStream is a flow's stream whose peer reads nothing: every Write
// blocks until the stream is cancelled.
type stalledStream struct {
	nopStream
	once      sync.Once
	cancelled chan struct{}
}

func (s *stalledStream) Write([]byte) (int, error) {
	<-s.cancelled
	return 0, errors.New("stream cancelled")
}

// Read waits, as for a peer that sends nothing.
func (s *stalledStream) Read([]byte) (int, error) {
	<-s.cancelled
	return 0, errors.New("stream cancelled")
}

func (s *stalledStream) CancelWrite(quic.StreamErrorCode) { s.once.Do(func() { close(s.cancelled) }) }

// TestRelayReadsLocalSideWhilePeerStalls (issue 21 item 1): a peer that
// stops reading the flow's stream stops the Sender, not the reading of the
// local socket: its packets are dropped past the flow's queue, so the
// socket's kernel buffer never fills and holds the host's UDP memory.
func TestRelayReadsLocalSideWhilePeerStalls(t *testing.T) {
	t.Parallel()
	const packets, size = 2000, 1000 // 2 MB through a queue of 1 MiB
	var mu sync.Mutex
	drops := map[string]int{}
	read := 0
	str := &stalledStream{cancelled: make(chan struct{})}
	localClosed := make(chan struct{})
	r := &udpflow.Relay{
		Stream: str, Up: &udpflow.Counters{}, Down: &udpflow.Counters{},
		Recv: func(buf []byte) ([]byte, error) {
			mu.Lock()
			if read == packets {
				mu.Unlock()
				<-localClosed
				return nil, io.EOF
			}
			read++
			mu.Unlock()
			return buf[:size], nil
		},
		Deliver:     func([]byte) error { return nil },
		CloseLocal:  sync.OnceFunc(func() { close(localClosed) }),
		IdleTimeout: time.Minute,
		Drop:        func(reason string) { mu.Lock(); drops[reason]++; mu.Unlock() },
	}
	r.Sender = udpflow.NewSender(1, nil, str, r.Up) // never established: every packet on the stream
	done := make(chan error, 1)
	go func() { done <- r.Run() }()
	// Every packet is read, and queued, dropped or in the stalled Write.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return read == packets && drops[udpflow.DropQueueFull]+r.Queue.Len()+1 == packets
	}, 10*time.Second, time.Millisecond, "the local side is read to its end while the stream is stalled")
	assert.LessOrEqual(t, r.Queue.Len()*(size+64), udpflow.DefaultQueueBytes, "the queue holds at most its bytes")
	r.Abort(proto.CodeShutdown)
	var ab *splice.AbortedError
	require.ErrorAs(t, <-done, &ab)
}
