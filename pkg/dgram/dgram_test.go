package dgram_test

import (
	"context"
	"errors"
	"testing"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quictun/quictun/pkg/dgram"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// queue hands out its datagrams, then an error (the connection ended).
type queue [][]byte

func (q *queue) ReceiveDatagram(context.Context) ([]byte, error) {
	if len(*q) == 0 {
		return nil, errors.New("closed")
	}
	b := (*q)[0]
	*q = (*q)[1:]
	return b, nil
}

func TestMuxRoutesByType(t *testing.T) {
	t.Parallel()
	var got []string
	m := dgram.NewMux(func(b []byte) { got = append(got, "unknown:"+string(b)) })
	m.Handle('H', func(b []byte) { got = append(got, "H:"+string(b)) })
	m.Handle('U', func(b []byte) { got = append(got, "U:"+string(b)) })
	q := queue{[]byte("Hbeat"), []byte("Uflow"), []byte("Xjunk"), {}, []byte("H2")}
	m.Run(context.Background(), &q)
	assert.Equal(t, []string{"H:Hbeat", "U:Uflow", "unknown:Xjunk", "unknown:", "H:H2"}, got)
	require.Panics(t, func() { m.Handle('H', func([]byte) {}) }, "a type registered twice")
	dgram.NewMux(nil).Run(context.Background(), &queue{[]byte("Z")}) // no handler at all: dropped
}

// statsQueue is a queue whose connection reports drops: after the i-th
// call of ReceiveDatagram, drops[i] in all.
type statsQueue struct {
	queue
	drops []uint64
	i     int
}

func (q *statsQueue) ReceiveDatagram(ctx context.Context) ([]byte, error) {
	q.i++
	return q.queue.ReceiveDatagram(ctx)
}

func (q *statsQueue) ConnectionStats() quic.ConnectionStats {
	return quic.ConnectionStats{DatagramsDropped: q.drops[min(q.i, len(q.drops)-1)]}
}

type registrar struct {
	t   byte
	got *[]string
}

func (r registrar) Register(m *dgram.Mux) {
	m.Handle(r.t, func(b []byte) { *r.got = append(*r.got, string(b)) })
}

func TestServeRegistersAndCountsDrops(t *testing.T) {
	t.Parallel()
	var got, unknown []string
	var dropped []int
	q := &statsQueue{queue: queue{[]byte("Ha"), []byte("Ub"), []byte("Xc"), []byte("Ud")}, drops: []uint64{0, 0, 3, 3, 3, 5}}
	dgram.Serve(context.Background(), q, func(b []byte) { unknown = append(unknown, string(b)) },
		func(n int) { dropped = append(dropped, n) }, registrar{'H', &got}, registrar{'U', &got})
	assert.Equal(t, []string{"Ha", "Ub", "Ud"}, got)
	assert.Equal(t, []string{"Xc"}, unknown)
	assert.Equal(t, []int{3, 2}, dropped, "each growth of the count once, the last one seen as the connection ended")
	dgram.Serve(context.Background(), &statsQueue{drops: []uint64{1}}, nil, nil) // nil callbacks
}
