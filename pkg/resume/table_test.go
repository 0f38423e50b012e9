package resume

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/dgram"
)

func TestTableLookup(t *testing.T) {
	t.Parallel()
	tb := NewTable()
	id, other := ID{1}, ID{2}
	p := &Pipe{}
	remove, err := tb.Add(id, "alice", p)
	require.NoError(t, err)
	_, err = tb.Add(id, "bob", &Pipe{})
	require.ErrorIs(t, err, ErrDuplicate, "an ID in use is not taken over")
	for _, tc := range []struct {
		name     string
		id       ID
		identity string
		want     error
	}{
		{"owner", id, "alice", nil},
		{"another identity", id, "bob", ErrIdentity},
		{"no identity", id, "", ErrIdentity},
		{"prefix of the identity", id, "alic", ErrIdentity},
		{"unknown ID", other, "alice", ErrUnknown},
	} {
		got, err := tb.Lookup(tc.id, tc.identity)
		if tc.want != nil {
			require.ErrorIs(t, err, tc.want, tc.name)
			assert.Nil(t, got)
			continue
		}
		require.NoError(t, err, tc.name)
		assert.Same(t, p, got)
	}
	remove()
	remove()
	_, err = tb.Lookup(id, "alice")
	require.ErrorIs(t, err, ErrUnknown)
	assert.Zero(t, tb.Len())
}

// TestTableAcks: Run sends the offsets received, on the connection of each
// tunnel's stream; an ack datagram confirms bytes only from that
// connection.
func TestTableAcks(t *testing.T) {
	t.Parallel()
	tu := newTunnel(t, Config{})
	tb := NewTable()
	rmC, err := tb.Add(ID{1}, "", tu.cli)
	require.NoError(t, err)
	defer rmC()
	sent := make(chan []byte, 16)
	send := func(b []byte) error {
		select {
		case sent <- append([]byte(nil), b...):
		default:
		}
		return nil
	}
	a, b := streamPair()
	cliErr := make(chan error, 1)
	go func() { cliErr <- tu.cli.Serve(&Attachment{Stream: a, Conn: "conn1", SendAck: send}) }()
	go func() { _, _ = b.w.Write([]byte("12345")) }()
	_, err = io.ReadFull(tu.appC, make([]byte, 5))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { tb.Run(ctx) })
	var got []Ack
	select {
	case d := <-sent:
		require.NoError(t, ParseAcks(d, func(a Ack) { got = append(got, a) }))
	case <-time.After(10 * time.Second):
		t.Fatal("no ack sent")
	}
	cancel()
	wg.Wait()
	assert.Equal(t, []Ack{{ID: ID{1}, Offset: 5}}, got)

	// Bytes the client sent, confirmed by the server's datagram.
	_, err = tu.appC.Write([]byte("abc"))
	require.NoError(t, err)
	_, err = io.ReadFull(b.r, make([]byte, 3))
	require.NoError(t, err)
	m := dgram.NewMux(nil)
	tb.Acks("conn1").Register(m)
	other := dgram.NewMux(nil)
	tb.Acks("conn2").Register(other)
	ack, _ := AppendAcks(nil, []Ack{{ID: ID{1}, Offset: 3}})
	feed(other, ack)
	base, _, _ := tu.cli.out.Offsets()
	assert.Zero(t, base, "an ack from another connection confirms nothing")
	require.Eventually(t, func() bool {
		feed(m, ack)
		base, _, _ := tu.cli.out.Offsets()
		return base == 3
	}, 10*time.Second, time.Millisecond)
	tu.cli.Abort(0)
	<-cliErr
	<-tu.ended
	tu.srv.Abort(0)
	<-tu.ended
}

// TestTableRunSleepsWhileIdle: once every offset was sent and repeated,
// Run stops ticking (an idle resumable tunnel costs no wake-ups: with the
// 20 ms ticker an idle ssh-like session cost each daemon ~300 context
// switches a second); bytes received wake it and are acknowledged.
func TestTableRunSleepsWhileIdle(t *testing.T) {
	t.Parallel()
	tu := newTunnel(t, Config{})
	tb := NewTable()
	rm, err := tb.Add(ID{1}, "", tu.cli)
	require.NoError(t, err)
	defer rm()
	sent := make(chan []Ack, 16)
	send := func(b []byte) error {
		var acks []Ack
		_ = ParseAcks(b, func(a Ack) { acks = append(acks, a) })
		sent <- acks
		return nil
	}
	a, b := streamPair()
	cliErr := make(chan error, 1)
	go func() { cliErr <- tu.cli.Serve(&Attachment{Stream: a, Conn: "conn1", SendAck: send}) }()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { tb.Run(ctx) })
	require.Eventually(t, tb.asleep.Load, 10*time.Second, time.Millisecond, "nothing received: Run sleeps")
	next := func() []Ack {
		select {
		case acks := <-sent:
			return acks
		case <-time.After(10 * time.Second):
			t.Fatal("no ack sent")
			return nil
		}
	}
	var off uint64
	for _, chunk := range []string{"12345", "678"} {
		go func() { _, _ = b.w.Write([]byte(chunk)) }()
		_, err = io.ReadFull(tu.appC, make([]byte, len(chunk)))
		require.NoError(t, err)
		off += uint64(len(chunk))
		assert.Equal(t, []Ack{{ID: ID{1}, Offset: off}}, next(), "the bytes received wake Run")
		assert.Equal(t, []Ack{{ID: ID{1}, Offset: off}}, next(), "and the ack is repeated once")
		require.Eventually(t, tb.asleep.Load, 10*time.Second, time.Millisecond, "then it sleeps again")
		select {
		case acks := <-sent:
			t.Fatalf("an ack sent while idle: %v", acks)
		case <-time.After(3 * AckInterval):
		}
	}
	cancel()
	wg.Wait()
	tu.cli.Abort(0)
	<-cliErr
	<-tu.ended
	tu.srv.Abort(0)
	<-tu.ended
}

// TestTableCollectParked: the count of a parked tunnel is not acked (its
// next attachment tells the peer: the resume request's offset or the
// reply's) nor its lock taken again until the count changes; new bytes
// received on its next attachment are acked.
func TestTableCollectParked(t *testing.T) {
	t.Parallel()
	tb := NewTable()
	p := &Pipe{}
	p.recv.Store(100) // received before it parked
	_, err := tb.Add(ID{1}, "", p)
	require.NoError(t, err)
	now := time.Now()
	pending := map[any]*connPending{}
	tb.collect(now, pending)
	assert.Empty(t, pending, "parked: nothing to send on")

	p.cur = &attachment{Attachment: &Attachment{Conn: "conn2", SendAck: func([]byte) error { return nil }}}
	for i := range 3 {
		tb.collect(now.Add(time.Duration(i+1)*ackRepeat), pending)
	}
	assert.Empty(t, pending, "re-attached with nothing new: the attachment told the peer the count")

	p.recv.Store(150)
	tb.collect(now.Add(4*ackRepeat), pending)
	require.Contains(t, pending, "conn2")
	assert.Equal(t, []Ack{{ID: ID{1}, Offset: 150}}, pending["conn2"].acks)
}

// feed hands one datagram to m.
func feed(m *dgram.Mux, b []byte) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := false
	m.Run(ctx, recvOnce(func() ([]byte, error) {
		if done {
			return nil, io.EOF
		}
		done = true
		return b, nil
	}))
}

type recvOnce func() ([]byte, error)

func (f recvOnce) ReceiveDatagram(context.Context) ([]byte, error) { return f() }

// TestTableSettle: Settle waits while a tunnel runs (or has not started),
// and returns once it parked (its connection lost), as Export needs.
func TestTableSettle(t *testing.T) {
	t.Parallel()
	tu := newTunnel(t, Config{})
	tb := NewTable()
	remove, err := tb.Add(ID{1}, "", tu.cli)
	require.NoError(t, err)
	defer remove()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	assert.Equal(t, 1, tb.Settle(done), "a tunnel not started yet is not settled")
	a, b, cliErr, srvErr := tu.attach(1, false)
	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	assert.Equal(t, 1, tb.Settle(short), "a running tunnel is waited for until ctx ends")
	settled := make(chan int, 1)
	go func() { settled <- tb.Settle(context.Background()) }()
	kill(a, b)
	require.ErrorIs(t, recvErr(t, cliErr), ErrParked)
	require.ErrorIs(t, recvErr(t, srvErr), ErrParked)
	select {
	case n := <-settled:
		assert.Zero(t, n, "the parked tunnel is settled")
	case <-time.After(10 * time.Second):
		t.Fatal("Settle did not return once the tunnel parked")
	}
	states := tb.Export()
	require.Len(t, states, 1)
	_ = states[0].Conn.Close()
	tu.srv.Abort(0)
}

// TestTableLookupWait: during an import (BeginImport) a lookup of a tunnel
// not held yet waits until it is added (then found, for its identity
// only), the import ends without it, or its ctx ends (then unknown);
// without an import, or once it ended, it does not wait. Nothing is left
// waiting.
func TestTableLookupWait(t *testing.T) {
	t.Parallel()
	type result struct {
		p      *Pipe
		waited bool
		err    error
	}
	for _, tc := range []struct {
		name     string
		identity string
		// then runs once the lookup waits: add: the tunnel is added for
		// alice; end: the import ends; cancel: the lookup's ctx ends.
		then   string
		want   error
		waited bool
	}{
		{"added while waiting", "alice", "add", nil, true},
		{"added for another identity", "bob", "add", ErrIdentity, true},
		{"import ended without it", "alice", "end", ErrUnknown, true},
		{"request gone", "alice", "cancel", ErrUnknown, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := NewTable()
			end := tb.BeginImport()
			defer end()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			id, p := ID{7}, &Pipe{}
			got := make(chan result, 1)
			go func() {
				p, waited, err := tb.LookupWait(ctx, id, tc.identity)
				got <- result{p, waited, err}
			}()
			require.Eventually(t, func() bool { return tb.Waiting() == 1 }, 10*time.Second, time.Millisecond)
			switch tc.then {
			case "add":
				remove, err := tb.Add(id, "alice", p)
				require.NoError(t, err)
				defer remove()
			case "end":
				end()
			case "cancel":
				cancel()
			}
			r := <-got
			assert.Equal(t, tc.waited, r.waited)
			if tc.want != nil {
				require.ErrorIs(t, r.err, tc.want)
				assert.Nil(t, r.p)
			} else {
				require.NoError(t, r.err)
				assert.Same(t, p, r.p)
			}
			assert.Zero(t, tb.Waiting(), "nothing left waiting")
		})
	}
}

// TestTableLookupNoWait: without an import in progress, or once every one
// ended, an unknown tunnel is refused at once (LookupWait does not wait).
func TestTableLookupNoWait(t *testing.T) {
	t.Parallel()
	tb := NewTable()
	ctx := context.Background()
	_, waited, err := tb.LookupWait(ctx, ID{1}, "alice")
	require.ErrorIs(t, err, ErrUnknown)
	assert.False(t, waited, "no import")
	end1, end2 := tb.BeginImport(), tb.BeginImport()
	end1()
	end1() // once
	ctx2, cancel := context.WithCancel(ctx)
	cancel()
	_, waited, err = tb.LookupWait(ctx2, ID{1}, "alice")
	require.ErrorIs(t, err, ErrUnknown)
	assert.True(t, waited, "one import still in progress")
	end2()
	_, waited, err = tb.LookupWait(ctx, ID{1}, "alice")
	require.ErrorIs(t, err, ErrUnknown)
	assert.False(t, waited, "every import ended")
	remove, err := tb.Add(ID{1}, "alice", &Pipe{})
	require.NoError(t, err)
	defer remove()
	_, waited, err = tb.LookupWait(ctx, ID{1}, "alice")
	require.NoError(t, err)
	assert.False(t, waited)
}
