package dgram_test

import (
	"context"
	"errors"
	"testing"

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
